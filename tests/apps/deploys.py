"""Workflows whose code a test "deploys" a bug into and out of (``Workflow.block_on_errors``)."""

from __future__ import annotations

from durable import NonRetryableError, Workflow, activity, await_signal, query, signal

#: The bug is deployed while this is true (the tests flip it, as a deploy would swap the code).
BUGGY = {"on": False}


def bd_double(x: int) -> int:
    return 2 * x


def bd_refuse(x: int) -> int:
    raise NonRetryableError(f"refused {x}")


class BdShip(Workflow):
    """A bad deploy's NameError blocks this run; the fixed deploy and a repair carry it on."""

    block_on_errors = (NameError, AttributeError)

    def handle(self, x: int) -> int:
        y = activity(bd_double, x)
        await_signal("go")
        if BUGGY["on"]:
            return recipt  # type: ignore[name-defined]  # noqa: F821 - the bug a deploy brought
        return activity(bd_double, y)


class BdShipFails(Workflow):
    """The same bug without ``block_on_errors``: the run fails (the default rule)."""

    def handle(self, x: int) -> int:
        await_signal("go")
        if BUGGY["on"]:
            return recipt  # type: ignore[name-defined]  # noqa: F821
        return x


class BdStrict(Workflow):
    """Temporal's rule: every error blocks -- except the errors of durable calls, which fail."""

    block_on_errors = (Exception,)

    def handle(self, x: int) -> int:
        return activity(bd_refuse, x)


class BdHandler(Workflow):
    """A bug in a ``@signal`` handler blocks too."""

    block_on_errors = (KeyError,)

    def __init__(self) -> None:
        self.items: list[str] = []

    @signal
    def add(self, sku: str) -> None:
        if BUGGY["on"]:
            {}[sku]  # noqa: B018 - the bug
        self.items.append(sku)

    def handle(self) -> list[str]:
        await_signal("done")
        return self.items


class BdResigned(Workflow):
    """A deploy changes ``handle()``'s signature under a running run: its replay raises TypeError."""

    def handle(self, x: int) -> int:
        await_signal("go")
        return x

    @query
    def anything(self) -> str:
        return "answered"


def bd_resigned_v2(self: Workflow, x: int, m: int) -> int:  # the deployed signature
    await_signal("go")
    return x + m


class BdInit(Workflow):
    """A bug in ``__init__``: no code of the run can run."""

    def __init__(self) -> None:
        if BUGGY["on"]:
            raise RuntimeError("boom in init")
        self.n = 1

    def handle(self) -> int:
        await_signal("go")
        return self.n

    @query
    def n_now(self) -> int:
        return self.n


class HfTwoItems(Workflow):
    """Its history gets a signal that a "newer release" marks with a history format it alone reads
    (tests/test_history_format.py)."""

    def handle(self) -> list[str]:
        return [await_signal("item"), await_signal("item")]
