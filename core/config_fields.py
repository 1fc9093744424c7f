"""The base of every config table and the field types several tables share."""
from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from turnstream.core.configtools import require


class Section(BaseModel):
    """A config table: strict types (no "2" for 2, no true for 1) and no unknown keys."""

    model_config = ConfigDict(strict=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _known_fields_only(cls, data: Any) -> Any:
        # pydantic's own extra="forbid" message does not say what the field could have been
        if isinstance(data, dict):
            for key in data:
                require(key in cls.model_fields, key, f"unknown field (known: {', '.join(sorted(cls.model_fields))})")
        return data


def _on_this_machine(cpus: list[int]) -> list[int]:
    # the machine's CPUs, not this process's affinity: a pinned role reads the other roles' pins too
    n = os.cpu_count() or 1
    if not all(0 <= c < n for c in cpus):
        raise ValueError(f"CPU ids must be in 0..{n - 1} on this machine, got {cpus}")
    return cpus


Port = Annotated[int, Field(ge=0, le=65535)]
PositiveOrAuto = Annotated[float, Field(gt=0)] | Literal["auto"]
CpuIds = Annotated[list[int], AfterValidator(_on_this_machine)]
