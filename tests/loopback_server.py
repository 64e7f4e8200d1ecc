"""A loopback TCP server for tests: each accepted connection served in a thread of its own by a subclass."""

from __future__ import annotations

import socket
import threading

__all__ = ["LoopbackServer"]


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
        threading.Thread(target=self._serve, daemon=True).start()

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
        self.listener.close()
