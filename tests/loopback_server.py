"""A loopback TCP server for tests: each accepted connection served in a thread of its own by a subclass."""

from __future__ import annotations

import contextlib
import socket
import threading

__all__ = ["LoopbackServer", "stop_serving"]


def stop_serving(sock: socket.socket, thread: threading.Thread) -> None:
    """Stop ``thread``, which waits in ``sock`` (an ``accept`` or a ``recv``), then close ``sock``.

    The shutdown wakes it; closing first would not, and would free the descriptor's number while the thread
    still holds it: the next socket this process opens (another test's server) gets that number, and the
    stale thread then accepts that server's connections (a closed server once answered a later module's
    request with its own 16 MiB body this way).
    """
    with contextlib.suppress(OSError):  # ENOTCONN from UDP, which it does not wake (send it a datagram)
        sock.shutdown(socket.SHUT_RDWR)
    thread.join(timeout=10)
    sock.close()


class LoopbackServer:
    """A TCP server on ``host`` that hands each accepted connection to :meth:`_handle` in a thread of its own.

    The shape every test server shares (the egress servers, the agents' and the relay's unit tests',
    bench/bench_egress.py's); a subclass says what a connection gets.
    """

    def __init__(self, host: str = "127.0.0.1", backlog: int = 128) -> None:
        self.listener = socket.create_server((host, 0), backlog=backlog)
        self.port: int = self.listener.getsockname()[1]
        #: Connections accepted so far.
        self.accepted = 0
        self._acceptor = threading.Thread(target=self._serve, daemon=True)
        self._acceptor.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Stop accepting (connections being served go on to their end)."""
        stop_serving(self.listener, self._acceptor)
