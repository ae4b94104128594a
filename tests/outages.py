"""Shared by the outage tests (their Redis: the ``killable_redis`` fixture)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``call`` on a thread; its value (``"value"``) or error (``"error"``) lands in the dict returned."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's assertions
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out
