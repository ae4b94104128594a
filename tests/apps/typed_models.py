"""Models in a module of their own, as a project's ``models.py`` beside its workflows: no
workflow or activity is defined here (``apps.typed`` names some in its annotations)."""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ValidationInfo, field_validator


class Size(enum.Enum):
    SMALL = "s"
    LARGE = "l"


class Dimensions(BaseModel):
    """Named only by a field of :class:`Parcel`."""

    size: Size
    grams: int


class Parcel(BaseModel):
    """Named by ``apps.typed.ShipParcel.handle``'s annotations."""

    ref: str
    dims: list[Dimensions]


class Unnamed(BaseModel):
    """No handler names it: still refused, as any class of a module not allowed."""

    x: int


class Slot(BaseModel):
    """A booking slot that must be in the future when given; one read back was accepted then."""

    at: datetime

    @field_validator("at")
    @classmethod
    def in_future(cls, value: datetime, info: ValidationInfo) -> datetime:
        if (info.context or {}).get("durable") == "decode":
            return value
        if value <= datetime.now(UTC):
            raise ValueError("the slot must be in the future")
        return value


class Envelope(BaseModel):
    """An event whose data is typed Any: pydantic stores it as JSON."""

    kind: str
    data: dict[str, Any]
