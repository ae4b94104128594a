"""A local TLS endpoint for tests: certificates from a throwaway CA, and a TLS-terminating
forwarder in front of a plain Redis (the bundled redis-server 6.2 is built without TLS).

:func:`make_certs` writes a CA, a server certificate for 127.0.0.1/localhost and a client
certificate (all signed by the CA) with the ``cryptography`` package. :class:`TlsProxy`
listens on a loopback port, completes the TLS handshake (requiring a client certificate the
CA signed) and forwards the bytes to a TCP port or a unix socket; :meth:`TlsProxy.stop`
closes every socket and joins every thread it started.
"""

from __future__ import annotations

import datetime
import ipaddress
import select
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from loopback import LoopbackServer


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def server_context(self) -> ssl.SSLContext:
        """TLS server side: our certificate, client certificates required (signed by the CA)."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.server_cert, self.server_key)
        context.load_verify_locations(self.ca)
        context.verify_mode = ssl.CERT_REQUIRED
        return context

    def query(self) -> str:
        """The URL query a client needs: the private CA, its certificate and key."""
        return f"ssl_ca_certs={self.ca}&ssl_certfile={self.client_cert}&ssl_keyfile={self.client_key}"


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> tuple[Path, Path]:
    path.with_suffix(".pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    path.with_suffix(".key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return path.with_suffix(".pem"), path.with_suffix(".key")


def _cert(
    name: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    signer: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
    else:
        alt = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    return builder.sign(signer, hashes.SHA256())


def make_certs(folder: Path) -> Certs:
    """A CA, and a server and a client certificate it signed, as PEM files in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "durable test CA")])
    ca_cert = _cert("durable test CA", ca_key, ca_name, ca_key, ca=True)
    ca, _ = _write(folder / "ca", ca_cert, ca_key)
    server_key, client_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    server = _write(folder / "server", _cert("127.0.0.1", server_key, ca_name, ca_key, ca=False), server_key)
    client = _write(
        folder / "client", _cert("durable-client", client_key, ca_name, ca_key, ca=False), client_key
    )
    return Certs(ca, server[0], server[1], client[0], client[1])


class TlsProxy(LoopbackServer):
    """TLS on ``127.0.0.1:<port>``, forwarded in plain text to ``backend`` (a unix socket path or
    a TCP port on 127.0.0.1; settable after start, before the first client connects)."""

    def __init__(self, context: ssl.SSLContext, backend: str | int | None = None) -> None:
        super().__init__()
        self.context = context
        self.backend = backend
        self.handshakes = 0
        self.refused = 0

    def _connect_backend(self) -> socket.socket:
        if isinstance(self.backend, str):
            up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            up.connect(self.backend)
            return up
        return socket.create_connection(("127.0.0.1", int(self.backend or 0)))

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(10)
            tls = self.context.wrap_socket(conn, server_side=True)
            tls.settimeout(None)
        except (OSError, ssl.SSLError):
            self.refused += 1
            conn.close()
            return
        self._track(tls)
        self.handshakes += 1
        try:
            up = self._connect_backend()
        except OSError:
            tls.close()
            return
        self._track(up)
        try:
            self._pump(tls, up)
        finally:
            tls.close()
            up.close()

    def _pump(self, tls: ssl.SSLSocket, up: socket.socket) -> None:
        # One thread per connection: an SSL object must not be read and written concurrently.
        while not self._stop.is_set():
            try:
                readable = [tls] if tls.pending() else select.select([tls, up], [], [], 0.2)[0]
            except (OSError, ValueError):  # closed by stop()
                return
            for sock in readable:
                try:
                    data = sock.recv(65536)
                except ssl.SSLWantReadError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                try:
                    (up if sock is tls else tls).sendall(data)
                except OSError:
                    return
