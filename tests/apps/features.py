"""Workflows for ``tests/test_reference_features.py``: hooks driven from the CLI, the
history budget, local activities and patch markers (importable as ``apps.features``)."""

from __future__ import annotations

import os
import threading

from durable import (
    RetryPolicy,
    Workflow,
    activity,
    activity_context,
    await_hook,
    await_signal,
    continue_as_new,
    create_hook,
    local_activity,
    patched,
    query,
    should_continue_as_new,
)

# --------------------------------------------------------------------------- hooks


class HookFromCli(Workflow):
    """Creates a hook and exposes its token to the test through a query."""

    def __init__(self) -> None:
        self.token = ""

    @query
    def hook_token(self) -> str:
        return self.token

    def handle(self, order: str) -> dict:
        hook = create_hook("payment", {"order": order})
        self.token = hook.token
        payload = await_hook(hook, timeout=60)
        return {"order": order, "payment": payload}


# --------------------------------------------------------------------------- history budget


def budget_increment(n: int) -> int:
    return n + 1


class BudgetLoop(Workflow):
    """Counts to ``total`` one activity at a time, continuing as new whenever the run is near its budget."""

    history_budget = {"events": 30}

    def handle(self, total: int, done: int = 0, runs: int = 0) -> dict:
        runs += 1
        while done < total:
            done = activity(budget_increment, done)
            if done < total and should_continue_as_new():
                continue_as_new(total, done, runs)
        return {"done": done, "runs": runs}


class BudgetProbe(Workflow):
    """Runs activities until the run is near its budget, then waits (so describe() can look)."""

    history_budget = {"events": 30}

    def __init__(self) -> None:
        self.steps = 0

    @query
    def progress(self) -> int:
        return self.steps

    def handle(self) -> int:
        while not should_continue_as_new():
            self.steps = activity(budget_increment, self.steps)
        await_signal("finish")
        return self.steps


# --------------------------------------------------------------------------- local activities


def where_am_i(tag: str) -> dict:
    return {"tag": tag, "pid": os.getpid(), "thread": threading.current_thread().name}


def fail_first_attempt(path: str) -> int:
    """Fails on attempt 1, succeeds on attempt 2 (each attempt leaves a line in ``path``)."""
    attempt = activity_context().attempt
    with open(path, "a") as fh:
        fh.write(f"attempt {attempt}\n")
    if attempt == 1:
        raise RuntimeError("first attempt fails")
    return attempt


class LocalSteps(Workflow):
    def handle(self, path: str) -> dict:
        here = local_activity(where_am_i, "local")
        attempt = local_activity(
            fail_first_attempt,
            path,
            retry=RetryPolicy(initial_interval=0.05, backoff_coefficient=1, max_attempts=3),
        )
        return {"here": here, "attempt": attempt}


# --------------------------------------------------------------------------- patch markers


class PricingV1(Workflow):
    """Version 1 of the durable type ``Pricing``: no patch."""

    name = "Pricing"

    def __init__(self) -> None:
        self.branch = "old"

    @query
    def pricing_branch(self) -> str:
        return self.branch

    def handle(self, amount: int) -> dict:
        await_signal("go")
        return {"branch": "old", "price": amount}


class PricingV2(Workflow):
    """Version 2 of ``Pricing`` (a test swaps it in under that name): declares ``new-pricing``.

    Registered as ``PricingV2`` so that the two versions can live in one module.
    """

    name = "PricingV2"
    patches = ("new-pricing",)

    def __init__(self) -> None:
        self.branch = ""

    @query
    def pricing_branch(self) -> str:
        return self.branch

    def handle(self, amount: int) -> dict:
        # Same commands as version 1: only the computation differs, behind the patch.
        self.branch = "new" if patched("new-pricing") else "old"
        await_signal("go")
        price = amount * 9 // 10 if self.branch == "new" else amount
        return {"branch": self.branch, "price": price}


class PatchedLoop(Workflow):
    """Continues as new once; both runs answer ``patched`` from what they recorded."""

    patches = ("new-pricing",)

    def handle(self, rounds: int, seen: list | None = None) -> list:
        seen = [*(seen or []), patched("new-pricing")]
        if rounds > 1:
            continue_as_new(rounds - 1, seen)
        return seen
