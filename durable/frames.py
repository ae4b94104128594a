"""Where in the app's code a stack or an error is: the innermost frame that is neither
durable's, greenlet's, the standard library's nor generated (``<string>``). Said by a
runaway decision (``workers.watchdog``), a query past its time limit (:mod:`.time_limit`)
and a payload hook that fails to load (:mod:`.codec.hooks`)."""

from __future__ import annotations

import os
import sysconfig
import traceback
from collections.abc import Sequence
from pathlib import Path

import greenlet
import redis

__all__ = ["app_frame", "code_position", "waiting_on_redis"]

_OWN = tuple(str(Path(path).parent) + os.sep for path in (__file__, greenlet.__file__ or ""))
_IO = tuple(str(p) + os.sep for p in (Path(__file__).parent / "store", Path(redis.__file__ or "").parent))
_PATHS = sysconfig.get_paths()
_STDLIB = tuple({_PATHS["stdlib"] + os.sep, _PATHS["platstdlib"] + os.sep})
_SITE = tuple({_PATHS["purelib"] + os.sep, _PATHS["platlib"] + os.sep})


def app_frame(
    stack: Sequence[traceback.FrameSummary], own: tuple[str, ...] = ()
) -> traceback.FrameSummary | None:
    """The innermost frame of the app's code in ``stack`` (not durable's, greenlet's, the
    standard library's, nor under the ``own`` folders); ``None``: there is none."""
    for frame in reversed(stack):
        path = frame.filename
        generated = path.startswith("<")  # code made at run time ("<string>": a dataclass's __init__)
        if (
            not generated
            and not path.startswith(_OWN + own)
            and (not path.startswith(_STDLIB) or path.startswith(_SITE))
        ):
            return frame
    return None


def code_position(stack: Sequence[traceback.FrameSummary], own: tuple[str, ...] = ()) -> str:
    """:func:`app_frame` (else the innermost frame) of ``stack``, as ``path:line in function``."""
    chosen = app_frame(stack, own) or (stack[-1] if stack else None)
    if chosen is None:
        return "an unknown position"
    path = chosen.filename
    try:
        path = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        pass
    if path.startswith(".." + os.sep):
        path = chosen.filename
    return f"{path}:{chosen.lineno} in {chosen.name}"


def waiting_on_redis(stack: traceback.StackSummary) -> bool:
    """Whether ``stack`` is in durable's store or redis-py: workflow code never calls them, so
    durable itself is loading or recording, and a slow Redis is not a runaway."""
    return any(frame.filename.startswith(_IO) for frame in stack)
