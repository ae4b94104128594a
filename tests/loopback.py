"""A server on a loopback port for tests: accepts connections on a thread and serves each on
its own thread; :meth:`LoopbackServer.stop` closes every socket and joins every thread it
started. Subclasses say how a connection is served (:class:`tls_proxy.TlsProxy`,
:class:`lossy_proxy.LossyProxy`)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any, Self


class LoopbackServer:
    """Listens on ``127.0.0.1:<port>`` (a free port, known at construction)."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._spawn(self._accept)

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()
        with self._lock:
            sockets, threads = list(self._sockets), list(self._threads)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        for thread in threads:
            thread.join(5)

    def _serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def _spawn(self, target: Callable[..., Any], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def _accept(self) -> None:
        self._listener.settimeout(0.1)  # close() does not wake a blocked accept(): poll the stop flag
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            self._track(conn)
            self._spawn(self._serve, conn)
