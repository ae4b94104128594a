"""A throwaway Redis Cluster on loopback, for tests and benchmarks (not for production).

:class:`LocalCluster` starts ``masters`` ``redis-server`` processes (the binary
:func:`~durable.store.embedded.find_redis_server` picks) with
``--cluster-enabled yes``, each in its own directory under ``base_dir``, on free
loopback ports; assigns the 16384 hash slots in equal ranges itself (``CLUSTER
ADDSLOTS``, so Redis 6.2 works too), joins the nodes (``CLUSTER MEET``) and
waits until every node reports ``cluster_state:ok``. :meth:`LocalCluster.stop`
shuts every node down (SHUTDOWN, then SIGTERM/SIGKILL) -- also when starting
failed half way. No replicas: a node that dies takes its slots with it.

    with LocalCluster(tmp_path) as cluster:
        store = RedisStore(cluster.url)   # redis+cluster://127.0.0.1:p1,127.0.0.1:p2,...
"""

from __future__ import annotations

import contextlib
import random
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .embedded import find_redis_server, server_settings

__all__ = ["LocalCluster", "SLOTS"]

SLOTS = 16384
_START_TIMEOUT = 20.0


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_cluster_port(taken: set[int] = frozenset()) -> int:  # type: ignore[assignment]
    """A loopback port that is free, and so is its cluster bus port (port + 10000)."""
    for _ in range(500):
        port = random.randint(20000, 29999)
        if port not in taken and _port_free(port) and _port_free(port + 10000):
            return port
    raise RuntimeError("no free port pair (port, port + 10000) found on 127.0.0.1")


class LocalCluster:
    """``masters`` cluster nodes on 127.0.0.1, slots split evenly; see the module doc.

    Args:
        base_dir: Each node gets ``base_dir/node-<i>`` (AOF, nodes.conf, log).
        masters: Number of nodes (each a master).
        appendfsync: AOF fsync policy of every node.
        announce_ports: The port each node tells clients to use (``cluster-announce-port``), e.g.
            a TLS proxy's in front of it; default: its own.
    """

    def __init__(
        self,
        base_dir: str | Path,
        *,
        masters: int = 3,
        appendfsync: str = "everysec",
        announce_ports: list[int] | None = None,
    ) -> None:
        self.base_dir = Path(base_dir)
        self.masters = masters
        self.appendfsync = appendfsync
        self.announce_ports = announce_ports
        self.ports: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self._args: list[list[str]] = []

    @property
    def url(self) -> str:
        """The cluster URL durable takes (``DURABLE_REDIS_URL``): every node as a startup node."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    @property
    def node_urls(self) -> list[str]:
        """Plain ``redis://`` URLs of the nodes, one each (MONITOR, INFO per node)."""
        return [f"redis://127.0.0.1:{p}" for p in self.ports]

    def node_of_slot(self, slot: int) -> int:
        """Index of the node that owns ``slot`` (slots are assigned in equal ranges)."""
        return min(slot * self.masters // SLOTS, self.masters - 1)

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> str:
        """Start the nodes, assign the slots, join them; returns :attr:`url`."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self.url

    def _start(self) -> None:
        binary = find_redis_server()
        for i in range(self.masters):
            node_dir = self.base_dir / f"node-{i}"
            node_dir.mkdir(parents=True, exist_ok=True)
            port = free_cluster_port(set(self.ports))
            self.ports.append(port)
            args = [
                binary,
                "--port", str(port),
                "--bind", "127.0.0.1",
                "--dir", str(node_dir),
                "--logfile", str(node_dir / "redis.log"),
                "--daemonize", "no",
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "5000",
                *server_settings(self.appendfsync),
            ]  # fmt: skip
            if self.announce_ports:
                bus = ["--cluster-announce-bus-port", str(port + 10000)]
                args += ["--cluster-announce-port", str(self.announce_ports[i]), *bus]
            self._args.append(args)
            self.procs.append(self._launch(i))
        clients = [self._wait_ping(i) for i in range(self.masters)]
        try:
            for i, client in enumerate(clients):
                lo, hi = i * SLOTS // self.masters, (i + 1) * SLOTS // self.masters
                client.execute_command("CLUSTER ADDSLOTS", *range(lo, hi))
            for client in clients[1:]:
                client.execute_command("CLUSTER MEET", "127.0.0.1", self.ports[0])
            deadline = time.monotonic() + _START_TIMEOUT
            while True:
                infos = [_cluster_info(c) for c in clients]
                if all(
                    info.get("cluster_state") == "ok" and info.get("cluster_known_nodes") == str(self.masters)
                    for info in infos
                ):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"cluster did not reach cluster_state:ok in {_START_TIMEOUT:.0f} s: {infos}"
                    )
                time.sleep(0.05)
        finally:
            for client in clients:
                client.close()

    def _wait_ping(self, i: int) -> redis.Redis:
        client = redis.Redis(host="127.0.0.1", port=self.ports[i], socket_timeout=5)
        deadline = time.monotonic() + _START_TIMEOUT
        while True:
            try:
                client.ping()
                return client
            except redis.ConnectionError:
                if self.procs[i].poll() is not None or time.monotonic() > deadline:
                    log = self.base_dir / f"node-{i}" / "redis.log"
                    tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
                    raise RuntimeError(
                        f"cluster node {i} (port {self.ports[i]}) did not start:\n{tail}"
                    ) from None
                time.sleep(0.02)

    def _launch(self, i: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self._args[i],
            cwd=self.base_dir / f"node-{i}",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def restart_node(self, i: int) -> None:
        """Start node ``i`` again after :meth:`kill_node` (same port, dir, AOF and nodes.conf) and
        wait until the cluster is ok again."""
        self.procs[i] = self._launch(i)
        self._wait_ping(i).close()
        self.wait_ok()

    def wait_ok(self, timeout: float = _START_TIMEOUT) -> None:
        """Wait until every node reports ``cluster_state:ok`` and knows every other node."""
        deadline = time.monotonic() + timeout
        while True:
            infos = []
            for port in self.ports:
                try:
                    with redis.Redis(host="127.0.0.1", port=port, socket_timeout=2) as client:
                        infos.append(_cluster_info(client))
                except redis.RedisError:
                    infos.append({})
            if all(
                info.get("cluster_state") == "ok" and info.get("cluster_known_nodes") == str(self.masters)
                for info in infos
            ):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster did not reach cluster_state:ok in {timeout:.0f} s: {infos}")
            time.sleep(0.05)

    def move_slot(self, slot: int, to: int) -> None:
        """Migrate ``slot`` with its keys to node ``to`` (IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE):
        clients of the old owner get MOVED from then on."""
        clients = [redis.Redis(host="127.0.0.1", port=p, socket_timeout=10) for p in self.ports]
        try:
            ids = [_text(c.execute_command("CLUSTER MYID")) for c in clients]
            src = next(i for i, c in enumerate(clients) if _owns(c, slot))
            if src == to:
                return
            clients[to].execute_command("CLUSTER SETSLOT", slot, "IMPORTING", ids[src])
            clients[src].execute_command("CLUSTER SETSLOT", slot, "MIGRATING", ids[to])
            while True:
                keys = clients[src].execute_command("CLUSTER GETKEYSINSLOT", slot, 100)
                if not keys:
                    break
                clients[src].execute_command(
                    "MIGRATE", "127.0.0.1", self.ports[to], "", 0, 5000, "KEYS", *keys
                )
            for c in clients:
                c.execute_command("CLUSTER SETSLOT", slot, "NODE", ids[to])
        finally:
            for c in clients:
                c.close()

    def kill_node(self, i: int) -> None:
        """SIGKILL node ``i`` (crash simulation)."""
        proc = self.procs[i]
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def stop(self, timeout: float = 10) -> None:
        """Stop every node this object started (SHUTDOWN, then SIGTERM, then SIGKILL)."""
        for port, proc in zip(self.ports, self.procs, strict=False):
            if proc.poll() is None:
                with contextlib.suppress(redis.RedisError, OSError):
                    # No retries: SHUTDOWN's expected disconnect would be retried, with seconds
                    # of backoff per node against a server that is gone.
                    client = redis.Redis(
                        host="127.0.0.1", port=port, socket_timeout=2, retry=Retry(NoBackoff(), 0)
                    )
                    try:
                        client.execute_command("SHUTDOWN")
                    finally:
                        client.close()
        for proc in self.procs:
            try:
                proc.wait(timeout / 2)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(timeout / 2)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        self.procs = []


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _owns(client: redis.Redis, slot: int) -> bool:
    """Whether the node ``client`` talks to serves ``slot`` (its own view of the slot map)."""
    myid = client.execute_command("CLUSTER MYID")
    myid = myid.decode() if isinstance(myid, bytes) else str(myid)
    for row in client.execute_command("CLUSTER SLOTS"):
        lo, hi, primary = int(row[0]), int(row[1]), row[2]
        node_id = primary[2].decode() if isinstance(primary[2], bytes) else str(primary[2])
        if lo <= slot <= hi and node_id == myid:
            return True
    return False


def _cluster_info(client: redis.Redis) -> dict[str, str]:
    raw = client.execute_command("CLUSTER INFO")
    if isinstance(raw, dict):  # redis-py parses it already
        return {str(k): str(v) for k, v in raw.items()}
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return dict(line.split(":", 1) for line in text.strip().splitlines() if ":" in line)
