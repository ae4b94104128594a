"""Child workflows: onboarding a team starts one ``ProvisionAccount`` child
workflow per member, in parallel, then a ``NotifyTeam`` child; a child that
fails is reported without failing the parent.

Shows: ``child(Workflow, *args)`` (each child has its own workflow id —
default ``<parent id>/<command id>`` — history, retries and status, and may
live in another partition), ``all()`` over children, ``ChildWorkflowFailed``
with the child's error as ``.cause``, and ``parent_close_policy``.

Run it (embedded Redis, or the one in ``DURABLE_REDIS_URL``)::

    python examples/children.py

or ``durable worker --app examples.children`` and
``durable start OnboardTeam '"data"' '["ada", "grace"]' --id team-data``, then
``durable list`` shows the parent and its children.
"""

from __future__ import annotations

from typing import Any

from durable import (
    ChildWorkflowFailed,
    NonRetryableError,
    Workflow,
    WorkflowStub,
    activity,
    all,
    child,
)


# ------------------------------------------------------------------ activities
def create_account(user: str) -> str:
    if user == "mallory":
        raise NonRetryableError(f"{user} is on the deny list")
    return f"uid-{user}"


def grant_access(uid: str, system: str) -> str:
    return f"{uid}@{system}"


def post_message(team: str, text: str) -> str:
    return f"#{team}: {text}"


# ------------------------------------------------------------------- workflows
class ProvisionAccount(Workflow):
    """Child: create the account, then grant access to two systems in parallel."""

    def handle(self, user: str) -> dict[str, Any]:
        uid = activity(create_account, user)
        grants = all(
            [lambda: activity(grant_access, uid, "wiki"), lambda: activity(grant_access, uid, "git")]
        )
        return {"user": user, "uid": uid, "grants": grants}


class NotifyTeam(Workflow):
    """Child: announce the new members."""

    def handle(self, team: str, names: list[str]) -> str:
        return activity(post_message, team, f"welcome {', '.join(names)}!")


class OnboardTeam(Workflow):
    """Parent: one ProvisionAccount child per user (in parallel), then one NotifyTeam child."""

    def handle(self, team: str, users: list[str]) -> dict[str, Any]:
        def provision(user: str) -> dict[str, Any]:
            try:
                return child(ProvisionAccount, user)
            except ChildWorkflowFailed as exc:
                return {"user": user, "error": str(exc.cause)}

        accounts = all([lambda u=user: provision(u) for user in users])
        ok = [a["user"] for a in accounts if "uid" in a]
        announcement = child(NotifyTeam, team, ok, parent_close_policy="abandon")
        return {"team": team, "accounts": accounts, "announcement": announcement}


# ------------------------------------------------------------------------ demo
def main(store: Any = None, *, timeout: float = 30.0) -> dict[str, Any]:
    """Onboard a team of three (one of whom is refused); returns the parent's result."""
    import uuid

    from durable.client import default_store
    from workers.worker import Worker, WorkerThread, load_app

    load_app([__name__])
    store = store or default_store()
    with WorkerThread(Worker(store, concurrency=8, grace=5.0, block_ms=200)):
        stub = WorkflowStub.make(OnboardTeam, id=f"team-{uuid.uuid4().hex[:6]}", store=store)
        stub.start("data", ["ada", "grace", "mallory"])
        return stub.result(timeout=timeout)


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
