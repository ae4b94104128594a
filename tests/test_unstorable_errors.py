"""Errors that cannot be stored as they are fail their attempt like any error (an acceptance pass).

An activity raising an error whose own attributes raise killed the activity thread that
recorded it (``traceback.format_exception`` raised, then the log call formatting it raised
too): the worker's runs showed "running" for ever. A cycle in an error's args, or a cause chain
past the nesting limit, blocked the run ("its outcome could not be recorded"), and after a
repair it failed with a made-up timeout. Now such an error is stored as an ``ApplicationError``
keeping its type and message, and the attempt fails under its retry policy.
"""

from __future__ import annotations

import logging
import sys
import threading

import pytest
from apps.failures import RaisesUnreadable, UnreadableError

from durable import ApplicationError, WorkflowFailed, WorkflowStub, codec
from workers.logging import JsonFormatter, MaskingFormatter
from workers.threads import ActivityThreads


@pytest.mark.parametrize(
    ("kind", "stored"),
    [
        (
            "attributes",
            "apps.failures.UnreadableError: x [its details could not be stored: RuntimeError: no args]",
        ),
        ("cycle", "ValueError: [[...]] [its details could not be stored: SerializationError: cannot encode"),
        ("chain", "KeyError: 199 [its details could not be stored: SerializationError: cannot encode"),
    ],
)
def test_the_activity_fails_with_a_stand_in_for_its_error(worker, kind: str, stored: str) -> None:
    stub = WorkflowStub.make(RaisesUnreadable).start(kind)
    with pytest.raises(WorkflowFailed) as info:
        stub.result(timeout=30)
    assert "failed after 2 attempt(s)" in str(info.value) and stored in str(info.value), str(info.value)
    assert stub.blocked() is None


def test_an_error_the_encoder_cannot_read_is_stored_as_an_application_error() -> None:
    back = codec.loads(codec.dumps(UnreadableError("x"), path="error"))
    assert isinstance(back, ApplicationError) and back.type_name == "apps.failures.UnreadableError"


def test_a_call_whose_error_cannot_be_logged_does_not_take_its_thread_down() -> None:
    ran = threading.Event()

    def broken() -> None:
        raise UnreadableError("x")

    threads = ActivityThreads(1, name="t-unreadable")
    try:
        threads.submit(broken)
        threads.submit(ran.set)
        assert ran.wait(10), "the thread died with the call before it"
    finally:
        threads.shutdown()


@pytest.mark.parametrize("formatter", [MaskingFormatter(), JsonFormatter()])
def test_the_worker_log_formats_a_record_of_such_an_error(formatter: logging.Formatter) -> None:
    try:
        try:
            raise UnreadableError("x")
        except UnreadableError:
            raise ValueError("while recording it")  # noqa: B904 - its context is read when formatting
    except ValueError:
        record = logging.LogRecord("durable.worker", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    assert "could not be formatted" in formatter.format(record)
