"""A TCP proxy in front of a Redis unix socket that can lose one reply: the command reaches
Redis and runs, then the proxy closes the client's connection instead of passing the reply on,
as a network cut or a failover does at the worst moment. The client sees the connection drop
and cannot tell whether its command ran."""

from __future__ import annotations

import select
import socket

from loopback import LoopbackServer


class LossyProxy(LoopbackServer):
    """Forwards every connection to the unix socket ``backend``. :meth:`lose_reply_to` arms
    it: the reply to the next command whose bytes hold ``marker`` is dropped, with the
    connection that carried it (:attr:`lost` counts them)."""

    def __init__(self, backend: str) -> None:
        super().__init__()
        self.backend = backend
        self._marker: bytes | None = None
        self.lost = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def lose_reply_to(self, marker: bytes) -> None:
        """Drop the reply to the next command containing ``marker`` (e.g. ``b"EVALSHA"``)."""
        with self._lock:
            self._marker = marker

    def _serve(self, conn: socket.socket) -> None:
        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._track(up)
        losing = False  # this connection's next reply is to be lost
        try:
            up.connect(self.backend)
            while not self._stop.is_set():
                for sock in select.select([conn, up], [], [], 0.2)[0]:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is conn:
                        with self._lock:
                            if self._marker is not None and self._marker in data:
                                self._marker, losing = None, True
                        up.sendall(data)
                    elif losing:
                        with self._lock:
                            self.lost += 1
                        return  # the command ran; its reply goes nowhere
                    else:
                        conn.sendall(data)
        except (OSError, ValueError):  # closed by stop(), or by the other side
            return
        finally:
            conn.close()
            up.close()
