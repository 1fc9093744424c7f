"""The [launch] table: how `turnstream up` supervises the roles it starts."""
from __future__ import annotations

from turnstream.core.config_fields import Section


class LaunchSection(Section):
    pass
