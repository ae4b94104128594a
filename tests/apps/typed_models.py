"""Models in a module of their own, as a project's ``models.py`` beside its workflows: no
workflow or activity is defined here (``apps.typed`` names some in its annotations)."""

from __future__ import annotations

import enum

from pydantic import BaseModel


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
