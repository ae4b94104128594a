"""Workflows whose activities raise custom exceptions (the codec keeps their type)."""

from __future__ import annotations

from durable import ActivityFailed, ApplicationError, RetryPolicy, Workflow, activity

from .payment_errors import GatewayDown

ONCE = RetryPolicy(max_attempts=1)


class PaymentDeclined(Exception):
    """Its ``__init__`` takes (code, message) but passes only the message up."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def charge(card: str) -> str:
    if card.startswith("4000"):
        raise PaymentDeclined(402, "card declined")
    raise GatewayDown("acme")


class Checkout(Workflow):
    def handle(self, card: str) -> dict:
        try:
            activity(charge, card, retry=ONCE)
        except ActivityFailed as exc:
            cause = exc.cause
            return {
                "type": type(cause).__name__,
                "is_payment_declined": isinstance(cause, PaymentDeclined),
                "code": getattr(cause, "code", None),
                "message": str(cause),
                "original_type": cause.type_name if isinstance(cause, ApplicationError) else None,
            }
        return {}


def echo(value: str) -> str:
    return value


class SecretEcho(Workflow):
    """Passes its argument through an activity, a signal-free round trip of one payload."""

    def handle(self, value: str) -> str:
        return activity(echo, value)


class Joins(Workflow):
    """Returns its two arguments joined: a value only the workflow's code makes."""

    def handle(self, a: str, b: str) -> str:
        return a + b
