"""Changing workflow code safely while runs are in flight, with ``get_version``
and ``patched``.

A run replays its history on whatever code is deployed now. Version 1 of
``Onboarding`` sent a welcome e-mail; version 2 sends an SMS instead and adds
a gift. Editing ``handle()`` directly would make old runs diverge from their
history (``NondeterminismError``: the run is blocked until a fixed deploy).
Instead the new code branches:

* ``get_version("welcome-channel", DEFAULT_VERSION, 1)`` returns ``DEFAULT_VERSION``
  (-1) for a run whose history predates the change and 1 for new runs (recorded
  in a ``VersionMarker`` at first use);
* ``patched("welcome-gift")`` is true only for runs started by code listing
  ``"welcome-gift"`` in ``Workflow.patches``.

The demo runs the old code, then the new code, then replays the old run's
history against the new code (OK) and against an unsafe edit (diverges) with
``durable.testing.replay_history`` — what ``durable replay`` does in CI.

Run it (embedded Redis, or the one in ``DURABLE_REDIS_URL``)::

    python examples/versioning.py
"""

from __future__ import annotations

from typing import Any

from durable import (
    DEFAULT_VERSION,
    NondeterminismError,
    Workflow,
    WorkflowStub,
    activity,
    get_version,
    patched,
)


# ------------------------------------------------------------------ activities
def send_welcome_email(user: str) -> str:
    return f"email to {user}"


def send_welcome_sms(user: str) -> str:
    return f"sms to {user}"


def send_gift(user: str) -> str:
    return f"gift for {user}"


# ------------------------------------------------------------------- workflows
class OnboardingV1(Workflow):
    """The code as it was (kept here under another name to produce an old history)."""

    def handle(self, user: str) -> dict[str, Any]:
        welcome = activity(send_welcome_email, user)
        return {"user": user, "welcome": welcome, "gift": None}


class Onboarding(Workflow):
    """The code as it is now: old runs keep their e-mail path, new runs get SMS and a gift."""

    patches = ("welcome-gift",)

    def handle(self, user: str) -> dict[str, Any]:
        if get_version("welcome-channel", DEFAULT_VERSION, 1) == DEFAULT_VERSION:
            welcome = activity(send_welcome_email, user)  # runs started before the change
        else:
            welcome = activity(send_welcome_sms, user)
        gift = activity(send_gift, user) if patched("welcome-gift") else None
        return {"user": user, "welcome": welcome, "gift": gift}


class OnboardingUnsafe(Workflow):
    """The same change made unsafely: old histories scheduled an e-mail here."""

    def handle(self, user: str) -> dict[str, Any]:
        welcome = activity(send_welcome_sms, user)
        return {"user": user, "welcome": welcome, "gift": None}


# ------------------------------------------------------------------------ demo
def main(store: Any = None, *, timeout: float = 30.0) -> dict[str, Any]:
    """Run old and new code; replay the old history against both edits."""
    import uuid

    from durable.client import default_store
    from durable.testing import replay_history
    from workers.worker import Worker, WorkerThread, load_app

    load_app([__name__])
    store = store or default_store()
    suffix = uuid.uuid4().hex[:6]
    with WorkerThread(Worker(store, concurrency=4, grace=5.0, block_ms=200)):
        old = WorkflowStub.make(OnboardingV1, id=f"onboard-old-{suffix}", store=store).start("ada")
        new = WorkflowStub.make(Onboarding, id=f"onboard-new-{suffix}", store=store).start("grace")
        summary: dict[str, Any] = {
            "old_run": old.result(timeout=timeout),
            "new_run": new.result(timeout=timeout),
        }
    # Today's code against the old run's history: same decisions, so it replays cleanly.
    summary["old_history_on_new_code"] = replay_history(old, Onboarding).status
    try:
        replay_history(old, OnboardingUnsafe)
        summary["old_history_on_unsafe_code"] = "replayed (unexpected)"
    except NondeterminismError as exc:
        summary["old_history_on_unsafe_code"] = f"diverged: {str(exc).splitlines()[0]}"
    return summary


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
