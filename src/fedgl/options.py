"""The base of every settings model (config sections, protocol options, privacy settings).

Unknown keys and infinite or NaN numbers are refused, and so is a boolean where a number is expected:
pydantic would read ``rounds: true`` as 1 and ``lr: yes`` as 1.0, a silent wrong run from a typo.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

NUMBERS = (int, float)


def _numeric(annotation: Any) -> bool:
    """Whether a field is a number (possibly optional) that does not also take booleans."""
    if annotation in NUMBERS:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = typing.get_args(annotation)
        return bool not in members and any(m in NUMBERS for m in members)
    return False


def _numbers_inside(annotation: Any) -> bool:
    """Whether a field holds a list or tuple of numbers (possibly among other choices)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_numbers_inside(m) for m in typing.get_args(annotation))
    return typing.get_origin(annotation) in (list, tuple) and any(_numeric(a) for a in typing.get_args(annotation))


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        annotation = cls.model_fields[info.field_name].annotation if info.field_name else None
        if isinstance(value, bool) and _numeric(annotation):
            raise ValueError(f"expected a number, not {str(value).lower()}")
        if isinstance(value, (list, tuple)) and any(isinstance(v, bool) for v in value) and _numbers_inside(annotation):
            raise ValueError("expected numbers, not booleans")
        return value
