"""Connecting to Redis (one server or a Cluster), and the errors callers must tell apart.

The worker and the client never import ``redis`` themselves: they catch the
error groups named here.
"""

from __future__ import annotations

import itertools
import os
import re
import socket
import time
from typing import Any, TypeGuard
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis import exceptions as rexc
from redis.cluster import REDIS_ALLOWED_KEYS, ClusterNode, RedisCluster
from redis.connection import parse_url

from ..errors import ConfigurationError

#: Errors that mean "Redis (or one cluster node) is unavailable or the cluster is
#: reconfiguring": callers wait a moment and retry; tasks in flight stay pending. Error
#: *replies* can say the same (BUSY, LOADING, OOM...): :func:`is_transient` knows both.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    rexc.ConnectionError,
    rexc.TimeoutError,
    rexc.ClusterDownError,
    rexc.TryAgainError,
    rexc.AskError,  # MovedError too (a subclass)
    rexc.SlotNotCoveredError,
)

#: The connection to one Redis broke (on one Redis, the only transient error).
ConnectionLost = rexc.ConnectionError

#: Redis refused a command (e.g. NOGROUP: a task stream was deleted under its reader).
CommandRefused = rexc.ResponseError


#: Error replies meaning "not now": Redis refused the command without running any of it
#: (a script busy past ``lua-time-limit``, a dataset loading, ``maxmemory`` reached under
#: ``noeviction``, writes stopped because it cannot persist (MISCONF: a full disk), a write
#: sent to a replica (READONLY: during a failover), a transaction discarded for one of those,
#: a replica cut off from its master, a cluster reconfiguring). Retrying later is safe: a
#: script is refused at its first write, before it changed anything.
REFUSED_FOR_NOW = (
    "BUSY",
    "LOADING",
    "OOM",
    "MISCONF",
    "READONLY",
    "EXECABORT",
    "MASTERDOWN",
    "TRYAGAIN",
    "CLUSTERDOWN",
)

# Where such a reply's code can stand in an error's text: first (redis-py leaves codes it has
# no class for in the message), after a pipeline's "caused error: " prefix, or inside a Lua
# script's error, which Redis 6.2 reports as ``... @user_script: 1: -OOM command not allowed ...``.
# ``\b`` keeps BUSYGROUP (a consumer group that exists already) out.
_REFUSED_CODE = re.compile(r"(?:^|caused error: |: -)(" + "|".join(REFUSED_FOR_NOW) + r")\b")

_REFUSED_CLASSES: tuple[tuple[type[BaseException], str], ...] = (
    (rexc.BusyLoadingError, "LOADING"),
    (rexc.OutOfMemoryError, "OOM"),
    (rexc.ReadOnlyError, "READONLY"),
    (rexc.ExecAbortError, "EXECABORT"),
    (rexc.MasterDownError, "MASTERDOWN"),
    (rexc.TryAgainError, "TRYAGAIN"),
    (rexc.ClusterDownError, "CLUSTERDOWN"),
)


def unavailable_kind(exc: BaseException) -> str | None:
    """What kind of temporary Redis unavailability ``exc`` reports, or ``None`` when it is
    not one (a bug, bad data, a wrong password: retrying would not help).

    The kinds: ``"timeout"`` (no reply within the socket timeout: Redis stalled or the
    network dropped), ``"connection lost"``, ``"maxclients"`` (a new connection refused:
    Redis has ``maxclients`` already), ``"cluster reconfiguring"`` (MOVED, ASK, a slot
    not covered), ``"failover"`` (a blocked read cut short as its master became a replica)
    and the codes of :data:`REFUSED_FOR_NOW` (``"BUSY"``, ``"LOADING"``,
    ``"OOM"``...). Every one of them means the caller may wait and send the same command
    again: a refused command ran nothing, and each of durable's writes is safe to repeat
    (a timed-out one may have run; its repeat finds its work done).
    """
    for klass, kind in _REFUSED_CLASSES:
        if isinstance(exc, klass):
            return kind
    if isinstance(exc, rexc.AuthenticationError):
        return None  # a wrong password stays wrong: say so instead of retrying forever
    if is_max_clients(exc):
        return "maxclients"
    if isinstance(exc, rexc.TimeoutError | TimeoutError):
        return "timeout"
    if isinstance(exc, rexc.ConnectionError | ConnectionError):
        return "connection lost"
    if isinstance(exc, rexc.AskError | rexc.SlotNotCoveredError):
        return "cluster reconfiguring"
    if is_failover_unblock(exc):
        return "failover"
    if isinstance(exc, rexc.ResponseError):
        found = _REFUSED_CODE.search(str(exc))
        return found.group(1) if found else None
    return None


MAX_CLIENTS_FIX = (
    "raise maxclients (CONFIG SET maxclients and redis.conf), or find who holds the connections (CLIENT LIST)"
)
"""What to do when Redis refuses new connections for ``maxclients``."""


def is_max_clients(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis refusing a new connection because it has ``maxclients`` already
    (``ERR max number of clients reached``, which redis-py raises as a connection error)."""
    return isinstance(exc, rexc.ConnectionError) and "max number of clients reached" in str(exc)


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, at most 200 characters."""
    return (str(exc).splitlines() or [""])[0][:200]


def login_refused(url: str | None, exc: BaseException) -> str:
    """The operator's sentence for Redis refusing the client's login (``exc``: redis-py's
    ``AuthenticationError``): no password where one is required, or a wrong one."""
    said = first_line(exc).rstrip(".")
    if "HELLO must be called" in said or "authentication required" in said.lower():  # NOAUTH
        said = "it requires a password and none was given"  # redis-py's HELLO says it at length
    return (
        f"Redis at {masked_url(url or 'redis')} refused the login ({said}): give the user and "
        "password in the URL, before the host (an empty user for the default one; "
        "docs/security.md shows one), preferably in $DURABLE_REDIS_URL, the same for the "
        "workers and the clients"
    )


def not_redis(url: str | None, exc: BaseException) -> str:
    """The operator's sentence for a server whose reply is not Redis's protocol (``exc``:
    redis-py's ``InvalidResponse``): the URL points at another service."""
    said = first_line(exc).rstrip(".")
    return (
        f"the server at {masked_url(url or 'redis')} does not answer as Redis does ({said}): "
        "check the URL's host and port (DURABLE_REDIS_URL, --redis)"
    )


MIN_SERVER_VERSION = (6, 2, 0)
"""The oldest Redis durable runs on (it reclaims a gone worker's tasks with ``XAUTOCLAIM``, new in 6.2)."""


def unsupported_server(url: str | None, info: dict[str, Any]) -> str | None:
    """The operator's sentence when ``INFO server`` names a Redis older than
    :data:`MIN_SERVER_VERSION`, else ``None`` (also when it does not say)."""
    version = str(info.get("redis_version", ""))
    parts = [int(p) for p in re.findall(r"\d+", version)[:3]]
    if not parts or tuple(parts + [0] * (3 - len(parts))) >= MIN_SERVER_VERSION:
        return None
    return (
        f"Redis at {masked_url(url or 'redis')} is version {version}; durable needs Redis 6.2 or "
        "newer (XAUTOCLAIM, which reclaims the tasks of a worker gone): upgrade it, or leave DURABLE_REDIS_URL "
        "unset to use the embedded Redis durable starts itself"
    )


def cluster_node_url(url: str | None) -> str:
    """The operator's sentence for a plain Redis URL that names a node of a Redis Cluster."""
    return (
        f"Redis at {masked_url(url or 'redis')} is a node of a Redis Cluster, and the URL is not a "
        "cluster URL: each key held by another node would be refused (MOVED); use "
        "redis+cluster://host:port[,host:port...] or add ?cluster=1 (docs/scaling.md)"
    )


def closed_by_redis(exc: BaseException) -> bool:
    """Whether ``exc`` is a connection Redis closed under the client (a broken pipe, a reset):
    it is alive. At ``maxclients`` it closes a new connection right after its error reply,
    which the client often does not get to read."""
    return isinstance(exc, rexc.ConnectionError) and isinstance(
        exc.__cause__, BrokenPipeError | ConnectionResetError
    )


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` means Redis is unavailable for now (see :func:`unavailable_kind`):
    wait with :class:`~durable.store.outage.Backoff` and try again."""
    return unavailable_kind(exc) is not None


def is_wrong_type(exc: object) -> TypeGuard[rexc.ResponseError]:
    """Whether ``exc`` is Redis refusing a command on a key of another kind (``WRONGTYPE``, also
    raised inside a script): a key made by hand (``durable.store.key_types`` names it)."""
    return isinstance(exc, rexc.ResponseError) and "WRONGTYPE" in str(exc)


def is_redis_error(exc: BaseException) -> bool:
    """Whether ``exc`` came from Redis or its client (a refused command, say): no fault of a
    run's, so never a reason to park one."""
    return isinstance(exc, rexc.RedisError)


def is_failover_unblock(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis ending a blocked read because the server stopped being a master
    (``UNBLOCKED force unblock from blocking operation, instance state changed (master ->
    replica?)``): a failover, a cluster's or a Sentinel's; read again once it is over."""
    return isinstance(exc, rexc.ResponseError) and "instance state changed" in str(exc)


def is_slot_migrating(exc: BaseException) -> bool:
    """Whether ``exc`` says a Redis Cluster slot is being migrated: a key of it was moved to the
    importing node already (``ASK``), or a command's keys are split between the two nodes
    (``TRYAGAIN``). It lasts as long as the migration; an interrupted one (a reshard that failed
    half-way) lasts until ``redis-cli --cluster fix``. Other slots are not concerned."""
    return isinstance(exc, rexc.TryAgainError) or (
        isinstance(exc, rexc.AskError) and not isinstance(exc, rexc.MovedError)
    )


MIGRATING_FIX = (
    "if no reshard is running, one was left half-way: run `redis-cli --cluster fix HOST:PORT` "
    "(any node); the other partitions go on meanwhile"
)
"""What to do about a slot left migrating (:func:`is_slot_migrating`)."""


def is_missing_group(exc: BaseException) -> bool:
    """Whether ``exc`` says a task stream (and so its consumer group) does not exist: ``NOGROUP``,
    or Redis 7's answer to a read blocked on a stream deleted meanwhile (``UNBLOCKED the stream
    key no longer exists``; Redis 6.2 answers that read with ``NOGROUP``)."""
    message = str(exc)
    return (
        isinstance(exc, rexc.ResponseError)
        and ("NOGROUP" in message or "UNBLOCKED" in message)
        and not is_failover_unblock(exc)
    )


CLUSTER_SCHEME = "redis+cluster"

#: The URL forms :func:`connect` takes, for error messages.
URL_FORMS = (
    "redis://host[:port][/db] (user:password@ before the host), rediss://... (TLS), "
    f"unix:///path/to/redis.sock or {CLUSTER_SCHEME}://host:port[,host:port...]"
)


class BadRedisUrl(ConfigurationError):
    """A Redis URL that does not parse; the message names it (password masked) and the forms
    a Redis URL takes."""


# redis-py's type hints cannot express that our clients return bytes (decode_responses
# is off), nor that a RedisCluster stands in for a Redis: the store types them as this.
Client = Any


def is_cluster_url(url: str | None) -> bool:
    """Whether ``url`` names a Redis Cluster: ``redis+cluster://host:port[,host:port...]``, or any
    Redis URL with ``?cluster=1`` (also ``true``/``yes``)."""
    if not url:
        return False
    parts = urlsplit(url)
    if parts.scheme in (CLUSTER_SCHEME, "rediss+cluster"):
        return True
    flag = parse_qs(parts.query).get("cluster", [""])[-1].lower()
    return flag in ("1", "true", "yes", "on")


def is_cluster_client(client: Any) -> bool:
    """Whether ``client`` talks to a Redis Cluster."""
    return isinstance(client, RedisCluster)


POOL_SIZE = 100
"""Connections per client (redis-py's default cap); more callers wait for one."""

POOL_WAIT_S = 60
"""How long a caller waits for a free connection before ``ConnectionError``."""


def own_connection(pool: Any) -> Any:
    """A new connection to ``pool``'s server, with its options, that the pool does not count.

    The wire's, the readers' and the cluster's connections are made and dropped by their owners,
    never given back to the pool; made with the pool's ``make_connection`` each one was counted
    (a plain pool refuses past ``max_connections``: after enough reconnects, as a long outage
    makes, "Too many connections" for ever) or kept in its list (a blocking pool: a leak).
    """
    return pool.connection_class(**pool.connection_kwargs)


def connect(url: str) -> Client:
    """A client for ``url``: ``redis.Redis`` for one server, ``redis.cluster.RedisCluster`` for a
    cluster URL (see :func:`is_cluster_url`), its startup nodes taken from the URL's host list.

    A cluster URL takes the query options of a ``redis://`` URL: ``ssl_ca_certs``,
    ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs``, ``ssl_check_hostname``, timeouts...
    (``rediss+cluster://`` turns TLS on); they apply to every node.

    Raises:
        BadRedisUrl: ``url`` does not parse (no or another scheme, a port that is no number...).
        ConfigurationError: A cluster URL names no node, a database other than 0, or an
            option the cluster client does not take; or its node is no cluster node.
        redis.exceptions.ConnectionError: No node of a cluster answers (as when one Redis does
            not: a transient error, so a starting worker waits for the cluster).
    """
    try:
        if not is_cluster_url(url):
            # A pool that waits for a free connection (``timeout`` s) instead of raising
            # MaxConnectionsError past ``max_connections`` (both overridable in the URL's query).
            pool = redis.BlockingConnectionPool.from_url(url, max_connections=POOL_SIZE, timeout=POOL_WAIT_S)
            client = redis.Redis(connection_pool=pool)
            client.auto_close_connection_pool = True
            return client
        parts = urlsplit(url)
        netloc = parts.netloc.rsplit("@", 1)
        nodes = _cluster_nodes(netloc[-1])
        kwargs = _cluster_options(url)
    except ValueError as exc:
        # redis-py's and urllib's parsers say what is wrong but not with which URL, nor what
        # a good one looks like.
        raise BadRedisUrl(
            f"bad Redis URL {masked_url(url)!r}: {exc}; a Redis URL looks like {URL_FORMS}"
        ) from None
    if not nodes:
        raise ConfigurationError(f"cluster URL {masked_url(url)!r} names no host:port")
    if len(netloc) == 2:
        user, _, password = netloc[0].partition(":")
        if password:
            kwargs["username"] = unquote(user) or None
            kwargs["password"] = unquote(password)
        else:
            kwargs["password"] = unquote(user)
    if parts.scheme.startswith("rediss"):
        kwargs["ssl"] = True
    try:
        return RedisCluster(startup_nodes=nodes, **kwargs)
    except rexc.RedisClusterException as exc:
        raise _cluster_startup_error(url, exc) from exc


def _cluster_startup_error(url: str, exc: rexc.RedisClusterException) -> Exception:
    """What a failed cluster discovery means, as the error a caller can act on.

    redis-py wraps every node's failure in one RedisClusterException, which is not a
    RedisError: unwrapped, an unreachable cluster would be neither "Redis unavailable"
    (waited out) nor a one-line error.
    """
    cause = exc.__cause__
    if isinstance(cause, rexc.AuthenticationError):
        return type(cause)(f"the Redis Cluster refused the login: {cause}")  # not waited out
    if isinstance(cause, rexc.ConnectionError | rexc.TimeoutError):
        return type(cause)(f"no node of the Redis Cluster answers: {cause}")
    if isinstance(cause, rexc.RedisClusterException) and "not enabled" in str(cause):
        return ConfigurationError(
            f"{masked_url(url)} is not a Redis Cluster ({cause}): for one Redis, drop "
            f"{CLUSTER_SCHEME}:// (use redis://) or ?cluster=1"
        )
    return exc


def _cluster_options(url: str) -> dict[str, Any]:
    """The connection options in a cluster URL's query (and path: the database), parsed as
    redis-py parses a one-server URL's; ``cluster=1`` is ours, not an option."""
    parts = urlsplit(url)
    query = "&".join(item for item in parts.query.split("&") if item and item.partition("=")[0] != "cluster")
    # The one-server parser, on a stand-in host: it converts the values (timeouts to float,
    # ssl_check_hostname to bool...) exactly as redis-py does for redis:// URLs.
    options: dict[str, Any] = parse_url(f"redis://stand-in{parts.path}?{query}")
    for name in ("host", "port", "connection_class"):
        options.pop(name, None)
    if options.pop("db", 0) != 0:
        raise ConfigurationError(
            f"cluster URL {masked_url(url)!r} names database {parts.path.strip('/')}: "
            "a Redis Cluster has database 0 only"
        )
    unknown = sorted(set(options) - set(REDIS_ALLOWED_KEYS))
    if unknown:
        raise ConfigurationError(
            f"cluster URL {masked_url(url)!r}: the cluster client takes no option {', '.join(unknown)}; "
            "options it takes include ssl_ca_certs, ssl_certfile, ssl_keyfile, ssl_cert_reqs, "
            "ssl_check_hostname, socket_timeout, socket_connect_timeout"
        )
    return options


def masked_url(url: str) -> str:
    """``url`` without the password of its user info (for error messages)."""
    try:
        parts = urlsplit(url)
    except ValueError:  # unparsable (``redis://[::1``): hide whatever stands before an "@"
        return re.sub(r"://[^/@]*@", "://***@", url)
    if "@" not in parts.netloc:
        return url
    userinfo, _, hosts = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0] if ":" in userinfo else ""
    return parts._replace(netloc=f"{user}:***@{hosts}").geturl()


def flush_database(url: str) -> None:
    """Empty the Redis database at ``url``, leaving not even durable's own metadata (tests)."""
    client = connect(url)
    try:
        client.flushdb()
    finally:
        client.close()


def _cluster_nodes(hosts: str) -> list[ClusterNode]:
    nodes = []
    for item in hosts.split(","):
        item = item.strip()
        if not item:
            continue
        if item.startswith("["):  # [ipv6]:port
            host, _, port = item[1:].partition("]")
            port = port.lstrip(":")
        else:
            host, _, port = item.rpartition(":") if ":" in item else (item, "", "")
        nodes.append(ClusterNode(host or "127.0.0.1", int(port or 6379)))
    return nodes


_consumers = itertools.count(1)


def consumer_name() -> str:
    """A unique consumer name: host, pid, start time, and a counter (several workers may start
    in one process within the same millisecond; each needs its own private queue)."""
    return f"{socket.gethostname()}:{os.getpid()}:{int(time.time() * 1000) % 100000}.{next(_consumers)}"
