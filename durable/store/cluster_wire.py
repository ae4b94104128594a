"""Raw pipelines on a Redis Cluster: :class:`~durable.store.wire.Wire`'s interface, one write per node.

The hot path's batches (load the runs, commit the decisions, record activity
results) hold commands of several partitions, so of several hash slots and
nodes. Here a batch is grouped by the node owning each command's slot (from
redis-py's slot map, its ``nodes_manager``), each node's group is packed with
hiredis and written at once on a connection of that node's pool -- every node's
write goes out before the first reply is read, so the nodes work in parallel --
and the raw replies are put back in the caller's order.

Every command of the hot path touches one slot: each key of a run carries its
partition's hash tag (:mod:`durable.store.keys`), and a script's keys are all of
one partition. A command is routed by its first key (for ``EVAL``/``EVALSHA``
the first of its keys); a MULTI/EXEC must keep all its keys in one slot.

Refusals that ran nothing are resent, only them, a few rounds at most:

* ``MOVED`` (a slot migrated, a failover): the slot map is read again, the
  command goes to the new owner;
* ``ASK`` (a slot being migrated, the key already moved): the command goes to the
  node named, after ``ASKING``;
* ``NOSCRIPT`` (a node restarted or was flushed): every script is loaded on that
  node, then the refused ``EVALSHA`` s are resent.

A broken connection is dropped (its replies may be unread) and the error raised,
as the one-server :class:`~durable.store.wire.Wire` does; the slot map is read
again first, since a node that went away may have been replaced.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from redis import exceptions as rexc
from redis.cluster import RedisCluster
from redis.crc import key_slot

from ..quiet import Quiet
from .connect import own_connection
from .wire import Command, Deferred, IdleConnections, pack, read_replies, transaction_result

log = logging.getLogger("durable.store")

#: Rounds of resending refused commands (MOVED, ASK, NOSCRIPT) before their refusal is
#: handed to the caller as their reply (MOVED/ASK are then transient: the caller retries).
MAX_ROUNDS = 4

_SCRIPTED = frozenset({"EVALSHA", "EVAL", "EVALSHA_RO", "EVAL_RO", "FCALL", "FCALL_RO"})


class CrossSlotTransaction(ValueError):
    """A MULTI/EXEC on a Redis Cluster names keys of several hash slots (a cluster refuses it)."""


def command_key(command: Command) -> Any:
    """The key a command is routed by: its first argument, or a script's first key.

    Raises:
        ValueError: the command names no key (it cannot be routed to a node).
    """
    name = str(command[0]).upper() if not isinstance(command[0], bytes) else command[0].decode().upper()
    if name in _SCRIPTED:
        if len(command) < 4 or int(command[2]) < 1:
            raise ValueError(
                f"{name} with no key cannot be routed on a Redis Cluster: give the script its keys"
            )
        return command[3]
    if len(command) < 2:
        raise ValueError(f"{name} names no key: it cannot be routed on a Redis Cluster")
    return command[1]


def slot_of(key: Any) -> int:
    """The hash slot of ``key`` (its hash tag's when it has one)."""
    raw = key if isinstance(key, bytes) else str(key).encode()
    # Every hot-path key carries a partition's hash tag, and there are few of them: their
    # slots are kept rather than hashed again for each command (CRC16 in Python).
    start = raw.find(b"{")
    end = raw.find(b"}", start + 1) if start >= 0 else -1
    if end <= start + 1:  # no tag, or an empty one: Redis hashes the whole key
        return key_slot(raw)
    tag = raw[start + 1 : end]
    slot = _TAG_SLOTS.get(tag)
    if slot is None:
        if len(_TAG_SLOTS) >= _MOST_TAGS:
            _TAG_SLOTS.clear()
        slot = _TAG_SLOTS[tag] = key_slot(tag)
    return slot


_TAG_SLOTS: dict[bytes, int] = {}
_MOST_TAGS = 4096


class ClusterWire:
    """Pipelined raw commands on a Redis Cluster, grouped by the node owning their slot.

    Args:
        client: The cluster client whose slot map and node pools (credentials, TLS,
            timeouts) are used.
        scripts: Every script's source, loaded on a node that answers ``NOSCRIPT``.
    """

    def __init__(self, client: RedisCluster | Any, scripts: Sequence[str | bytes]) -> None:
        self._nodes = client.nodes_manager
        self._scripts = list(scripts)
        # The slot map as this wire last read it (slot -> node), and each node's idle
        # connections (see IdleConnections): both are dropped when the map is read again.
        # Asking redis-py for a slot's node and checking a connection out of its pool each
        # round trip cost more than the round trip's own reads.
        self._owners: dict[int, Any] = {}
        self._idle: dict[str, IdleConnections] = {}
        # Each reason said once per 10 s: in a node's outage every caller's retry reads the map
        # again (20 lines a second per worker drowned the outage's own WARNINGs).
        self._said = Quiet(10.0)

    def close(self) -> None:
        """Disconnect every node's idle connections (see :meth:`Wire.close <durable.store.wire.Wire.close>`)."""
        for idle in list(self._idle.values()):
            idle.close()

    def execute(self, commands: Sequence[Command]) -> list[Any]:
        """Send ``commands``, one write per node; their replies in order (errors as exception
        objects, as :meth:`Wire.execute <durable.store.wire.Wire.execute>` gives them).

        Raises:
            redis.ConnectionError: a node's connection broke (it is dropped; nothing is retried).
            redis.TimeoutError: no reply within the socket timeout (dropped too).
        """
        units = [[c] for c in commands]
        return [replies[0] for replies in self._run(units, [slot_of(command_key(c)) for c in commands])]

    def begin(self) -> Deferred:
        """A round trip in parts, as :meth:`Wire.begin <durable.store.wire.Wire.begin>` gives one;
        here written at once, by its ``replies()`` (one write per node)."""
        return Deferred(self.execute)

    def transaction(self, commands: Sequence[Command]) -> list[Any]:
        """``commands`` inside MULTI/EXEC on the node owning their one slot; their replies.

        Raises:
            CrossSlotTransaction: the commands' keys are in several hash slots.
            redis.ResponseError: the first command Redis refused (see :meth:`Wire.transaction
                <durable.store.wire.Wire.transaction>`).
        """
        return self.transactions([commands])[0]

    def transactions(self, batches: Sequence[Sequence[Command]]) -> list[list[Any]]:
        """Several :meth:`transaction` s (each atomic on its own, each in one slot), one write
        per node; their replies in order."""
        units = [[("MULTI",), *batch, ("EXEC",)] for batch in batches]
        return [transaction_result(replies) for replies in self._run(units, [one_slot(b) for b in batches])]

    def execute_then_transactions(
        self, commands: Sequence[Command], batches: Sequence[Sequence[Command]]
    ) -> tuple[list[Any], list[list[Any]]]:
        """:meth:`execute` ``commands``, then each batch inside MULTI/EXEC (each in one slot), one
        write per node: the commands' replies, and each transaction's every reply. On each node
        the commands go first, so a batch reads what the commands of its slot wrote."""
        units = [[c] for c in commands] + [[("MULTI",), *batch, ("EXEC",)] for batch in batches]
        slots = [slot_of(command_key(c)) for c in commands] + [one_slot(b) for b in batches]
        got = self._run(units, slots)
        return [replies[0] for replies in got[: len(commands)]], got[len(commands) :]

    # ------------------------------------------------------------------ rounds
    def _run(self, units: list[list[Command]], slots: list[int]) -> list[list[Any]]:
        """Every unit's replies (a unit: one command, or one MULTI ... EXEC), resending the
        units refused with MOVED, ASK or NOSCRIPT; the last refusal stays as their reply."""
        results: list[list[Any]] = [[] for _ in units]
        pending = list(range(len(units)))
        asking: dict[int, Any] = {}  # unit -> the node an ASK named
        for _ in range(MAX_ROUNDS):
            sent = self._round_trip(pending, units, slots, asking)
            pending, asking, moved, unscripted = [], {}, [], {}
            for i, (node, replies) in sent.items():
                results[i] = replies
                redirect = next((r for r in replies if isinstance(r, rexc.AskError)), None)
                if isinstance(redirect, rexc.MovedError):
                    moved.append(redirect)
                elif redirect is not None:
                    asking[i] = self._node_at(redirect)
                elif len(units[i]) == 1 and isinstance(replies[0], rexc.NoScriptError):
                    unscripted[node.name] = node
                else:
                    continue
                pending.append(i)
            if not pending:
                break
            if moved:
                self._refresh("a slot moved (MOVED)", moved)
            for node in unscripted.values():
                self._load_scripts(node)
        return results

    def _round_trip(
        self, pending: list[int], units: list[list[Command]], slots: list[int], asking: dict[int, Any]
    ) -> dict[int, tuple[Any, list[Any]]]:
        """Send the pending units, one write per node, every write before the first read;
        ``{unit: (node, replies)}``."""
        owners = self._owners
        groups: dict[str, tuple[Any, list[int]]] = {}
        for i in pending:
            node = asking.get(i)
            if node is None:
                node = owners.get(slots[i])
                if node is None:
                    node = owners[slots[i]] = self._nodes.get_node_from_slot(slots[i])
            groups.setdefault(node.name, (node, []))[1].append(i)
        taken: list[tuple[IdleConnections, Any]] = []
        sent: dict[int, tuple[Any, list[Any]]] = {}
        try:
            for node, indexes in groups.values():
                idle = self._connections(node)
                conn = idle.take()
                taken.append((idle, conn))
                commands = [
                    c for i in indexes for c in ((("ASKING",), *units[i]) if i in asking else units[i])
                ]
                conn.send_packed_command([pack(commands)])
            for (node, indexes), (_, conn) in zip(groups.values(), taken, strict=True):
                for i in indexes:
                    replies = read_replies(conn, len(units[i]) + (i in asking))
                    sent[i] = (node, replies[1:] if i in asking else replies)
        except BaseException as exc:
            # Replies may be left unread on these sockets: never hand them to the next caller.
            for _, conn in taken:
                conn.disconnect()
            if isinstance(exc, rexc.ConnectionError | rexc.TimeoutError):
                self._refresh(f"a node's connection failed ({exc})")
            raise
        finally:
            for idle, conn in taken:
                idle.give(conn)
        return sent

    # ------------------------------------------------------------------ nodes
    def _connections(self, node: Any) -> IdleConnections:
        idle = self._idle.get(node.name)
        if idle is None:
            if node.redis_connection is None:  # a node first heard of in a redirection
                self._nodes.create_redis_connections([node])
            pool = node.redis_connection.connection_pool
            idle = self._idle.setdefault(node.name, IdleConnections(lambda: own_connection(pool)))
        return idle

    def _node_at(self, redirect: rexc.AskError) -> Any:
        """The node an ASK names (known to the slot map, or added to it)."""
        node = self._nodes.get_node(host=redirect.host, port=redirect.port)
        if node is None:
            self._refresh("an ASK named an unknown node")
            node = self._nodes.get_node(host=redirect.host, port=redirect.port)
        if node is None:
            raise redirect
        return node

    def _refresh(self, why: str, moves: Sequence[rexc.MovedError] = ()) -> None:
        """Read the slot map again (redis-py's nodes manager; one refresh when threads race);
        failing that, take the new owners the MOVED replies name."""
        (log.info if self._said.due(why.split(" (")[0]) else log.debug)(
            "reading the cluster slot map again: %s", why
        )
        # Round trips still under way give their connections back to the dropped stacks,
        # which are then forgotten: every later round trip connects along the new map.
        forgotten, self._owners, self._idle = self._idle, {}, {}
        for idle in forgotten.values():
            idle.close()  # their sockets, now (else when the garbage collector gets to them)
        try:
            self._nodes.initialize()
        except Exception as exc:  # noqa: BLE001 - the refused commands stay refused; callers retry
            log.warning("could not refresh the cluster slot map: %s", exc)
            for moved in moves:
                self._nodes.move_slot(moved)

    def _load_scripts(self, node: Any) -> None:
        """Load every script on ``node`` (it answered NOSCRIPT: restarted, or flushed)."""
        log.info("loading the scripts on cluster node %s (NOSCRIPT)", node.name)
        idle = self._connections(node)
        conn = idle.take()
        try:
            conn.send_packed_command([pack([("SCRIPT", "LOAD", src) for src in self._scripts])])
            for reply in read_replies(conn, len(self._scripts)):
                if isinstance(reply, Exception):
                    raise reply
        except BaseException:
            conn.disconnect()
            raise
        finally:
            idle.give(conn)


def one_slot(commands: Sequence[Command]) -> int:
    """The one hash slot of a transaction's commands.

    Raises:
        CrossSlotTransaction: they name keys of several slots (the error names them).
    """
    slots: dict[int, Any] = {}
    for command in commands:
        key = command_key(command)
        slots.setdefault(slot_of(key), key)
    if len(slots) != 1:
        named = ", ".join(f"{k!r} (slot {s})" for s, k in slots.items())
        raise CrossSlotTransaction(
            f"a MULTI/EXEC on a Redis Cluster must keep its keys in one hash slot, but these are in "
            f"{len(slots)}: {named}; give every key of one transaction the same hash tag "
            "(durable.store.keys: the partition's), or split the transaction"
        )
    return next(iter(slots))
