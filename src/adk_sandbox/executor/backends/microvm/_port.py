"""The agent channel's byte stream into a microVM: one virtio-serial port, seen here as a Unix socket.

:class:`PortOpener` connects to a free port, discards bytes up to the guest's greeting and sends the
program's header (:func:`program_header`), handing back a :class:`PortStream`. Depth: docs/MICROVM.md,
"How a VM is made" ("The channel").
"""

from __future__ import annotations

import select
import socket
import threading
import time

from adk_sandbox.executor.backends.microvm._qemu import GREETING
from adk_sandbox.executor.channel.streams import SocketStream
from adk_sandbox.executor.errors import SandboxFailedError
from adk_sandbox.executor.types import Stream

__all__ = ["PortOpener", "PortStream", "program_header", "read_until"]

_READ = 256 * 1024


def program_header(argv: list[str], user: str) -> bytes:
    r"""The header vminit reads: ``ADKVM1 <uid> <gid> <argc>``, then per argument ``<length>\n<bytes>``."""
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or not (gid or uid).isdigit():
        raise ValueError(f"a microVM program runs as a numeric uid:gid, not {user!r}")
    if not argv:
        raise ValueError("no program to start")
    parts = [f"ADKVM1 {int(uid)} {int(gid or uid)} {len(argv)}\n".encode()]
    for arg in argv:
        data = arg.encode("utf-8", "surrogateescape")
        parts.append(b"%d\n" % len(data) + data)
    return b"".join(parts)


def read_until(sock: socket.socket, end: bytes, until: float, what: str, *, limit: int | None) -> bytes:
    """Read ``sock`` up to and including ``end``, byte by byte (nothing past it is consumed): what came.

    ``limit``: the most bytes read before ``end`` is given up on (a flooding guest); None: no limit, and
    only the last ``len(end)`` bytes are kept. :class:`SandboxFailedError` names ``what`` when it is late
    (by ``until``), floods, or closes.
    """
    seen, count = b"", 0
    while not seen.endswith(end):
        left = until - time.monotonic()
        if limit is not None and count >= limit:
            raise SandboxFailedError(f"{what} sent {count} bytes without the answer awaited")
        if left <= 0 or not select.select([sock], [], [], left)[0]:
            raise SandboxFailedError(
                f"{what} did not answer in time: its guest init is not answering (the VM is stuck or still "
                "booting)"
            )
        chunk = sock.recv(1)
        if not chunk:
            raise SandboxFailedError(f"{what} closed (QEMU stopped)")
        count += 1
        seen = seen + chunk if limit is not None else (seen + chunk)[-len(end) :]
    return seen


class PortStream(SocketStream):
    """:class:`AgentStream` over a connected port socket: everything the program writes is its stdout."""

    def __init__(self, sock: socket.socket, on_close: object = None) -> None:
        super().__init__(sock)
        self._on_close = on_close

    def read(self) -> list[tuple[Stream, bytes]] | None:
        """See :meth:`AgentStream.read` (the program's stderr goes to the guest console, not here)."""
        data = self.sock.recv(_READ)
        return [("stdout", data)] if data else None

    def close(self) -> None:
        """See :meth:`AgentStream.close`."""
        super().close()
        if callable(self._on_close):
            self._on_close()
            self._on_close = None


class PortOpener:
    """Opens streams to new programs in one VM, over its ports in turn (an ``AgentStreamOpener``)."""

    def __init__(self, sockets: list[str]) -> None:
        self._sockets = sockets
        self._lock = threading.Lock()
        self._busy: set[int] = set()
        self._next = 0
        #: The port each user's agent was last started on: where it is served again after a restore.
        self.port_of: dict[str, int] = {}

    def __call__(self, argv: list[str], user: str, until: float) -> PortStream:
        """Start ``argv`` as ``user`` in the VM on a free port: its stream (else ``SandboxFailedError``)."""
        header = program_header(argv, user)
        index = self._take()
        try:
            sock = self.connect(index, until)
            sock.sendall(header)
        except BaseException:
            self._release(index)
            raise
        with self._lock:
            self.port_of[user] = index
        return PortStream(sock, lambda: self._release(index))

    def reconnect(self, user: str, until: float) -> PortStream:
        """A stream to the agent of ``user`` still running on its port (a VM restored from a file).

        No greeting comes (the guest's loop is waiting for that agent, not greeting), and no header goes.
        """
        with self._lock:
            index = self.port_of[user]
            self._busy.add(index)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(max(until - time.monotonic(), 0.01))
            sock.connect(self._sockets[index])
            sock.settimeout(None)
        except OSError as exc:
            sock.close()
            self._release(index)
            raise SandboxFailedError(f"cannot reach the restored microVM's port {index + 1} ({exc})") from exc
        return PortStream(sock, lambda: self._release(index))

    def connect(self, index: int, until: float) -> socket.socket:
        """A socket to port ``index`` (0-based) whose greeting has been read (nothing after it)."""
        path = self._sockets[index]
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(max(until - time.monotonic(), 0.01))
            sock.connect(path)
            # What an earlier agent left before the greeting is skipped, however long (no limit).
            read_until(sock, GREETING, until, f"the microVM's port {index + 1}", limit=None)
            sock.settimeout(None)
            return sock
        except OSError as exc:
            sock.close()
            raise SandboxFailedError(f"cannot reach the microVM's port {index + 1} ({exc})") from exc
        except BaseException:
            sock.close()
            raise

    def skip(self, index: int) -> None:
        """Make the next stream use the port after ``index`` (one just greeted and dropped, see above)."""
        with self._lock:
            self._next = (index + 1) % len(self._sockets)

    def _take(self) -> int:
        with self._lock:
            count = len(self._sockets)
            for step in range(count):
                index = (self._next + step) % count
                if index not in self._busy:
                    self._busy.add(index)
                    self._next = (index + 1) % count
                    return index
        raise SandboxFailedError(
            f"all {len(self._sockets)} agent ports of the microVM are in use (one per user with a running "
            "agent); raise MicroVMConfig(ports=...)"
        )

    def _release(self, index: int) -> None:
        with self._lock:
            self._busy.discard(index)
