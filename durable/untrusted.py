"""Reading text from outside (a URL, a CLI argument, a request body, a file): two standard calls
that fail there in ways their callers did not expect; and showing it on a terminal.

``str.isdigit`` passes "²", which ``int`` refuses, and ``int`` refuses more than 4,300 digits;
``json.loads`` raises ``RecursionError``, not ``ValueError``, for arrays nested about 1,000 deep.
Checked the usual way, such inputs were HTTP 500s and tracebacks where the caller meant to refuse
them with a message. A leaf: it imports nothing of durable.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

_DECIMAL = re.compile(r"[0-9]{1,18}")
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")  # and bidi overrides


def terminal_safe(text: str) -> str:
    """``text`` with the control characters a terminal acts on escaped (``\x1b``, ``\x07``...;
    newlines and tabs kept), and the bidi overrides that make it read reversed. An activity's error message or a cancel reason is anyone's text:
    printed raw, an escape sequence in it cleared the operator's screen, set the window title,
    or (OSC 52) wrote the clipboard."""
    if _CONTROLS.search(text) is None:
        return text
    return _CONTROLS.sub(lambda m: repr(m.group())[1:-1], text)


def decimal(value: str) -> int | None:
    """The number an input of ASCII digits spells (at most 18 of them: ms, seqs, partitions),
    else ``None``."""
    return int(value) if _DECIMAL.fullmatch(value) else None


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e999: no float holds it (Python reads it as infinity)
        raise ValueError(f"{text[:40]} is out of a float's range")
    return value


class NestedTooDeeply(ValueError):
    """JSON nested deeper than :func:`json.loads` can read."""


def json_loads(raw: str | bytes, *, standard: bool = False) -> Any:
    """:func:`json.loads`, where JSON nested too deeply to read is a :class:`ValueError`
    (:class:`NestedTooDeeply`) as any other bad JSON is. ``standard``: refuse ``NaN`` and
    ``Infinity``, which Python reads but JSON does not have (and other clients cannot read back).

    Raises:
        ValueError: not JSON (``json.JSONDecodeError``), or :class:`NestedTooDeeply`.
    """
    try:
        if standard:
            return json.loads(raw, parse_constant=_not_json, parse_float=_finite)
        return json.loads(raw)
    except RecursionError:
        raise NestedTooDeeply("nested too deeply to read") from None
