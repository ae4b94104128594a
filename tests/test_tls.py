"""Issue 14 item 10: TLS with a private CA and a client certificate, on one node and on a cluster.

The bundled redis-server (6.2) is built without TLS, so the TLS endpoint is a
TLS-terminating forwarder in the test process (``tests/tls_proxy.py``: Python's ``ssl``
module, certificates made with ``cryptography``) in front of each plain server. The
endpoint requires a client certificate signed by the test CA, and the client must trust
that CA: both come only from the URL's ``ssl_*`` options, which ``rediss+cluster://``
used to drop. The cluster's nodes announce their proxy's port (``cluster-announce-port``),
so the slot map sends the client to TLS endpoints only.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from apps.basic import Sequence
from tls_proxy import Certs, TlsProxy, make_certs

from durable import WorkflowStub
from durable.errors import ConfigurationError
from durable.store.cluster_dev import LocalCluster
from durable.store.connect import connect
from durable.store.embedded import EmbeddedRedis
from durable.store.redis_store import RedisStore
from durable.testing import TestEnvironment


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    return make_certs(tmp_path / "tls")


def run_workflows(url: str) -> RedisStore:
    store = RedisStore(url)
    try:
        with TestEnvironment(store=store):
            stubs = [WorkflowStub.make(Sequence, id=f"tls-{i}", store=store).start(4) for i in range(4)]
            assert [s.result(timeout=30) for s in stubs] == [6] * 4
    finally:
        store.close()
    return store


def test_tls_on_one_node(fresh_redis: EmbeddedRedis, certs: Certs) -> None:
    with TlsProxy(certs.server_context(), backend=str(fresh_redis.socket_path)) as proxy:
        url = f"rediss://127.0.0.1:{proxy.port}/0?{certs.query()}"
        run_workflows(url)
        assert proxy.handshakes >= 1
        # The endpoint really is TLS with client certificates: without one, no connection.
        bare = redis.Redis.from_url(f"rediss://127.0.0.1:{proxy.port}/0?ssl_ca_certs={certs.ca}")
        with pytest.raises(redis.exceptions.ConnectionError):
            bare.ping()
        bare.close()


@pytest.fixture
def tls_cluster(tmp_path: Path, certs: Certs) -> Iterator[tuple[LocalCluster, list[TlsProxy]]]:
    proxies = [TlsProxy(certs.server_context()) for _ in range(3)]
    cluster = LocalCluster(tmp_path / "cluster", masters=3, announce_ports=[p.port for p in proxies])
    try:
        cluster.start()
        for proxy, port in zip(proxies, cluster.ports, strict=True):
            proxy.backend = port
            proxy.start()
        yield cluster, proxies
    finally:
        for proxy in proxies:
            proxy.stop()
        cluster.stop()


@pytest.mark.slow
def test_tls_on_a_cluster(tls_cluster: tuple[LocalCluster, list[TlsProxy]], certs: Certs) -> None:
    cluster, proxies = tls_cluster
    hosts = ",".join(f"127.0.0.1:{p.port}" for p in proxies)
    url = f"rediss+cluster://{hosts}?{certs.query()}&socket_timeout=10"
    client = connect(url)
    try:
        # Every node's connections carry the CA and the client certificate.
        for node in client.get_primaries():
            kwargs = node.redis_connection.connection_pool.connection_kwargs
            assert kwargs["ssl_ca_certs"] == str(certs.ca) and kwargs["ssl_certfile"] == str(
                certs.client_cert
            )
            assert node.port in {p.port for p in proxies}, "the slot map names the TLS endpoints"
    finally:
        client.close()
    store = run_workflows(url)
    assert store.cluster
    assert all(p.handshakes >= 1 for p in proxies), [p.handshakes for p in proxies]


def test_cluster_url_options_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="database 0 only"):
        connect("redis+cluster://127.0.0.1:1/2")
    with pytest.raises(ConfigurationError, match="no option ssl_ca_cert") as info:
        connect("rediss+cluster://app:s3cret@127.0.0.1:1?ssl_ca_cert=/ca.pem")
    assert "s3cret" not in str(info.value)
