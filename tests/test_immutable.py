"""``durable.immutable``: records frozen to the type checker, plain (and cheap) at run time."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from durable.immutable import immutable
from durable.store.tasks import ActivityTask


@immutable
class Point:
    x: int
    y: int = 0


def test_an_immutable_record_compares_and_hashes_by_its_fields() -> None:
    assert Point(1, 2) == Point(1, 2) != Point(1, 3)
    assert {Point(1, 2): "a"}[Point(1, 2)] == "a"
    assert not hasattr(Point(1), "__dict__")  # slotted unless slots=False


def test_the_type_checker_refuses_an_assignment_to_a_field(tmp_path: Path) -> None:
    """The guarantee frozen=True gave at run time is kept by mypy (dataclass_transform)."""
    snippet = tmp_path / "mutates.py"
    snippet.write_text(
        textwrap.dedent(
            """
            from durable.events import ActivityScheduled
            from durable.immutable import immutable

            @immutable(kw_only=True)
            class Mine:
                a: int

            m = Mine(a=1)
            m.a = 2
            e = ActivityScheduled(id="1", name="n", args=b"", queue="q")
            e.name = "other"
            """
        )
    )
    # In its own process: mypy in-process leaves a heap so large that every later gc pass in
    # this pytest process crawls (the replay property test took 5x as long after it).
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports=silent", str(snippet)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert 'Property "a" defined in "Mine" is read-only' in out
    assert 'Property "name" defined in "ActivityScheduled" is read-only' in out


def test_an_engine_record_is_a_plain_dataclass_at_run_time() -> None:
    """The trade: no frozen __setattr__ to go through, so __init__ costs a plain one's."""
    task = ActivityTask("r", "w", 0, "1", "n", b"", 1, "s")
    task.attempt = 2  # type: ignore[misc]  # allowed at run time; mypy refuses it (above)
    assert task.attempt == 2
