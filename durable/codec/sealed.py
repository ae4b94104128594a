"""Sealed text: error messages and tracebacks stored outside payloads, under the payload hook.

Besides payloads, durable stores text that may quote user data: an activity attempt's error
message and traceback (the run's attempt log), the reason a task was parked (dead letters,
a run's ``blocked`` reason) and the reason an undecodable input was dropped. With a payload
hook installed (encryption, :class:`~durable.codec.KeyRing`), that text is *sealed*: stored
as :data:`SEALED` followed by the hook's encoding of the text, so it is encrypted like every
payload. Without a hook it is stored as it always was (plain UTF-8 text).

Readers open sealed text back with :func:`open_text`; a process without the key gets a
placeholder naming why (``<sealed text: ...>``), never an exception, so ``durable describe``
and ``durable list --dead`` still show everything else.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from durable.errors import SerializationError

from .decoder import decode
from .encoder import encode
from .hooks import apply, canonical, get_payload_hook

#: Prefix of sealed text. It starts with a NUL byte, which no reason or message durable
#: writes contains, so sealed and plain text never mix up.
SEALED = b"\x00DS1"

#: Fields of an attempt log record that may quote user data (sealed under a hook).
RECORD_TEXT_FIELDS = ("error", "traceback")


def seal_text(value: str) -> str | bytes:
    """``value`` as it is to be stored: sealed when a payload hook is installed, else as is."""
    if get_payload_hook() is None:
        return value
    try:
        return SEALED + apply(encode(value, "text"))
    except Exception as exc:  # noqa: BLE001 - the hook's fault (a KMS down): stored as that, never raised
        # Raised here it failed the parking of a run the same hook had failed, and the worker
        # with it, over and over. The text itself is not stored: it was to be sealed.
        return f"<not stored: the payload hook could not seal this text ({type(exc).__name__}: {exc})>"


def log_text(text: str, type_name: str) -> str:
    """An error's ``text`` for a log line: as is, or with a payload hook installed only its
    type (logs are not encrypted; the sealed message is where ``durable describe`` reads it)."""
    if get_payload_hook() is None:
        return text
    return f"{type_name} (its message is sealed: `durable describe` shows it)"


def is_sealed(value: object) -> bool:
    """Whether ``value`` holds sealed text (as read from Redis)."""
    return isinstance(value, bytes) and SEALED in value


def open_text(value: str | bytes | None) -> str:
    """Stored text back as ``str``: sealed text is opened with the payload hook.

    Args:
        value: A stored reason, message or traceback (plain or sealed).

    Returns:
        The text; for sealed text this process cannot open (no hook, a key not in the ring),
        ``<sealed text: why>``.
    """
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    # A script may prefix sealed text with plain text of its own ("dropped by durable
    # repair: " + the blocked reason): the plain head stays, the sealed tail is opened.
    at = value.find(SEALED)
    if at < 0:
        return value.decode("utf-8", "replace")
    head = value[:at].decode("utf-8", "replace")
    try:
        text = decode(canonical(value[at + len(SEALED) :]))
    except SerializationError as exc:
        return f"{head}<sealed text: {exc}>"
    return head + (text if isinstance(text, str) else repr(text))


def seal_fields(record: Mapping[str, Any], fields: Iterable[str] = RECORD_TEXT_FIELDS) -> dict[str, Any]:
    """A copy of ``record`` with its text ``fields`` sealed (unchanged without a hook)."""
    out = dict(record)
    if get_payload_hook() is None:
        return out
    for name in fields:
        if isinstance(out.get(name), str):
            out[name] = seal_text(out[name])
    return out


def open_fields(record: Mapping[str, Any], fields: Iterable[str] = RECORD_TEXT_FIELDS) -> dict[str, Any]:
    """A copy of ``record`` with its sealed ``fields`` opened (see :func:`open_text`)."""
    out = dict(record)
    for name in fields:
        if is_sealed(out.get(name)):
            out[name] = open_text(out[name])
    return out
