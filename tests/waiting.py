"""Polling for a condition in end-to-end tests (the system under test is asynchronous)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 20.0, interval: float = 0.02) -> T:
    """Return the first truthy value of ``predicate()``; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s: {getattr(predicate, '__name__', predicate)}")
