"""A workflow whose activity's error message quotes a card number (encryption tests)."""

from __future__ import annotations

from durable import RetryPolicy, Workflow, activity, await_signal

TWICE = RetryPolicy(max_attempts=2, initial_interval=0.01)


def decline_card(card: str) -> str:
    raise ValueError(f"card {card} declined")


class ChargeCard(Workflow):
    """Charges a card; the activity fails twice and so does the run (ActivityFailed)."""

    def handle(self, card: str) -> str:
        return activity(decline_card, card, retry=TWICE)


class AwaitCard(Workflow):
    """Waits for a ``card`` signal (a run to block and repair)."""

    def handle(self) -> str:
        return str(await_signal("card"))
