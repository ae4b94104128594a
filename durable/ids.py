"""Identities: workflow ids (public, chosen), run ids (ULID-like), command ids."""

from __future__ import annotations

import hashlib
import os
import re
import time
import unicodedata

from .errors import ConfigurationError

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_WORKFLOW_ID = re.compile(r"^[^\s\x00-\x1f\x7f]+$")

MAX_WORKFLOW_ID = 256
"""Longest workflow id a run may be given (characters)."""

MAX_LOOKUP_ID = 1024
"""Longest id a lookup takes: a child's default id ``<parent id>/<n>`` was not held to 256
before ``child()`` checked it, and a run the engine started must stay addressable."""
_COMMAND_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:\-/]{0,199}$")
_BUILD_ID = re.compile(r"^[A-Za-z0-9_.:+\-]{1,100}$")


def _ulid(ms: int, rand: bytes) -> str:
    value = (ms & ((1 << 48) - 1)) << 80 | int.from_bytes(rand[:10], "big")
    return "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


def new_run_id() -> str:
    """A fresh run id: 26 characters, sortable by creation time (ULID layout)."""
    return _ulid(int(time.time() * 1000), os.urandom(10))


def successor_run_id(run_id: str, ts_ms: int) -> str:
    """The run id continue-as-new gives the next run: derived, so replay yields the same."""
    return _ulid(ts_ms, hashlib.sha256(run_id.encode()).digest())


def clipped(text: str, most: int = 80) -> str:
    """``text`` as it is when short, else its start and its length (an id of a hand-made task,
    100 KB, made 200 KB log lines and dead-letter reasons)."""
    return text if len(text) <= most else f"{text[: most - 20]}... ({len(text):,} characters)"


def shown_id(workflow_id: object) -> str:
    """``workflow_id`` for an error message: its repr, cut to its start when long (a 100 KB id
    given by mistake must not become a 100 KB error line)."""
    text = repr(workflow_id)
    if len(text) <= 80:
        return text
    size = f" ({len(workflow_id):,} characters)" if isinstance(workflow_id, str) else ""
    return f"{text[:60]}...{size}"


def check_workflow_id(workflow_id: object, *, most: int = MAX_WORKFLOW_ID, new: bool = False) -> str:
    """Validate a workflow id: 1-256 printable characters, no whitespace, not ``.`` or ``..``.

    Args:
        workflow_id: The id.
        most: Its longest length (:data:`MAX_LOOKUP_ID` for an id looked up, not given).
        new: The id is given to a run a client starts: an invisible formatting character
            (Unicode category Cf: a zero-width space, a right-to-left override) is refused
            too. Such an id looks like another one in a table (``ab`` and ``a\u200bb``), or
            reads reversed: an operator would signal or terminate the wrong run. (Ids looked
            up are not held to it: a run started before stays addressable.)

    Raises:
        ConfigurationError: naming the id and the rule it breaks.
    """
    if not isinstance(workflow_id, str) or len(workflow_id) > most or not _WORKFLOW_ID.match(workflow_id):
        raise ConfigurationError(
            f"invalid workflow id {shown_id(workflow_id)}: use 1-{most} printable characters without whitespace"
        )
    if workflow_id in (".", ".."):
        # A URL path segment "." or ".." (even percent-encoded) is resolved away by browsers
        # and HTTP clients: the run could not be addressed by the API or the web UI.
        raise ConfigurationError(f"invalid workflow id {shown_id(workflow_id)}: '.' and '..' are not ids")
    try:
        workflow_id.encode()
    except UnicodeEncodeError:
        raise ConfigurationError(
            f"invalid workflow id {shown_id(workflow_id)}: it holds a lone surrogate, not valid Unicode text"
        ) from None
    hidden = next((c for c in workflow_id if unicodedata.category(c) == "Cf"), None) if new else None
    if hidden is not None:
        raise ConfigurationError(
            f"invalid workflow id {shown_id(workflow_id)}: it holds the invisible character U+{ord(hidden):04X} "
            f"({unicodedata.name(hidden, 'a formatting character')}), which makes it look like another id "
            "or read reversed: use visible characters only"
        )
    return workflow_id


def check_command_id(command_id: object, what: str = "command id") -> str:
    """Validate an explicit command id (``id=`` of a durable call; ``what``: how the error
    names it, ``update_id`` for an update's).

    Generated ids are numeric paths (``3``, ``2.1.4``), so an explicit id must
    not start with a digit: the two could otherwise collide.
    """
    if not isinstance(command_id, str) or not _COMMAND_ID.match(command_id):
        raise ConfigurationError(
            f"invalid {what} {command_id!r}: use 1-200 characters from letters, digits, _ . : - /, "
            "not starting with a digit (numeric ids are generated)"
        )
    return command_id


def check_build_id(build_id: str, option: str = "--build-id") -> str:
    """Validate a build id: 1-100 characters from letters, digits, ``_ . : + -`` (it is part of
    task stream names and log lines: no spaces, braces, ``|`` or newlines).

    Raises:
        ConfigurationError: naming the option, the id and the rule.
    """
    if not _BUILD_ID.match(build_id):
        raise ConfigurationError(
            f"{option} {build_id!r}: use 1-100 characters from letters, digits, _ . : + - (e.g. v42, a git sha)"
        )
    return build_id
