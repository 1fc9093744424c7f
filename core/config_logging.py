"""The [logging] table: where the learner's per-step metrics go besides Prometheus."""
from __future__ import annotations

from turnstream.core.config_fields import Section


class LoggingSection(Section):
    pass
