"""The outbox: messages one partition's commit leaves for another (child workflows).

A commit is atomic within one partition only, so starting a child, delivering
a child's outcome to its parent and applying a parent's close policy to its
children are messages in the committing partition's outbox stream. Any
worker carries a message out, then acks it; every step is safe to repeat.
"""

from __future__ import annotations

import logging
from typing import Any

from durable import codec
from durable import events as ev
from durable.errors import DurableError, WorkflowClosed, WorkflowNotFound
from durable.ids import shown_id
from durable.registry import start_patches
from durable.store.connect import is_redis_error, is_transient
from durable.store.key_types import is_wrong_type
from durable.store.redis_store import RedisStore

from . import faults

log = logging.getLogger("durable.worker")


def handle_outbox(store: RedisStore, p: int, stream: str, entry_id: str, fields: dict[bytes, bytes]) -> None:
    """Carry out one cross-partition message (child start, child result, child cancel)."""
    try:
        msg = codec.unpack(fields[b"m"])
        kind = msg["kind"]
    except Exception as exc:  # noqa: BLE001 - poison message: park it, never drop it
        store.park(
            p=p, stream=stream, entry_id=entry_id, kind="outbox", reason=f"undecodable: {exc}", fields=fields
        )
        return
    try:
        if kind == "start":
            _start_child(store, msg)
        elif kind == "deliver":
            event = ev.CATALOG[msg["type"]](**msg["data"])
            try:
                store.deliver(msg["wid"], event, run_id=msg["rid"])
            except (WorkflowClosed, WorkflowNotFound):
                log.info("parent %s closed before child result arrived; dropped", msg["wid"])
        elif kind in ("request_cancel", "terminate"):
            try:
                # A message from a terminate script names why; a decision's close, not.
                if kind == "terminate":
                    store.terminate(msg["wid"], msg.get("reason") or "parent closed (policy terminate)")
                else:
                    reason = msg.get("reason") or "parent requested cancel"
                    store.deliver(msg["wid"], ev.CancelRequested(reason=reason))
            except (WorkflowClosed, WorkflowNotFound):
                pass
        elif kind != "abandon":
            reason = f"unknown message kind {kind!r}"
            store.park(p=p, stream=stream, entry_id=entry_id, kind="outbox", reason=reason, fields=fields)
            return
    except Exception as exc:
        if is_wrong_type(exc):  # a key made by hand: the pass names it, once a minute (not a
            raise  # traceback a retry, every second)
        if is_transient(exc):  # Redis away: the loop says so (a WARNING) and retries
            log.debug("outbox message %s: %s; it stays pending and will be retried", entry_id, exc)
            raise
        if is_redis_error(exc):  # Redis, not the message: the loop retries
            log.exception("outbox message %s failed; it stays pending and will be retried", entry_id)
            raise
        # A fault a retry would meet again, for ever: raised, it stopped the worker, and every
        # worker that read the message after it (the whole fleet, each restart).
        reason = f"{kind} of workflow {shown_id(msg.get('wid'))} failed: {type(exc).__name__}: {exc}"
        log.exception("outbox message %s: %s; parked (durable list --dead)", entry_id, reason)
        store.park(p=p, stream=stream, entry_id=entry_id, kind="outbox", reason=reason, fields=fields)
        return
    faults.point("outbox.before_ack")
    store.ack_task(stream, entry_id)


def _start_child(store: RedisStore, msg: dict[str, Any]) -> None:
    """Start a child run; if it cannot start, tell its parent (ChildFailed)."""
    parent = msg["parent"]
    try:
        store.start(
            workflow_type=msg["type"],
            workflow_id=msg["wid"],
            run_id=msg["rid"],
            args=msg["args"],
            queue=msg["queue"],
            parent=parent,
            headers=msg.get("headers") or {},
            patches=start_patches(msg["type"], msg["queue"], store),
        )
    except DurableError as exc:  # WorkflowAlreadyStarted among others
        failed = ev.ChildFailed(id=parent["cid"], error=codec.dumps(exc, path="error"), status="failed")
        try:
            store.deliver(parent["wid"], failed, run_id=parent["rid"])
        except (WorkflowClosed, WorkflowNotFound):
            pass
