"""How the agent channel reaches an agent: a byte stream that an engine opens to a new agent process.

Each engine supplies an :data:`AgentStreamOpener` (Docker: an exec over a hijacked API connection;
Kubernetes: a ``pods/exec`` websocket) returning an :class:`AgentStream`: stdin one way, the agent's
frames and its stderr the other. :class:`SocketStream` is the writing half over a socket both engines use.
See docs/BACKENDS.md, section "Where to look next".
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Callable
from typing import Protocol

from adk_sandbox.executor.types import Stream

__all__ = ["AgentStream", "AgentStreamOpener", "ResidentOpener", "SocketStream", "send_all"]


class AgentStream(Protocol):
    """A bidirectional byte stream to one agent process in a sandbox."""

    def read(self) -> list[tuple[Stream, bytes]] | None:
        """Wait for the process's next output: its ``(stream, bytes)`` pieces in order; None at the end.

        ``[]`` when what arrived completes no piece yet. Waits without a time limit (an idle agent sends
        nothing) until :meth:`shutdown`; :class:`OSError` when the connection broke,
        :class:`~adk_sandbox.executor.channel.frames.ProtocolError` when the engine's framing is broken.
        Called by one thread only.
        """
        ...

    def write(self, data: bytes, until: float) -> None:
        """Write all of ``data`` to the process's stdin by ``until`` (monotonic), else :class:`TimeoutError`.

        :class:`OSError` when the stream is broken. Callers serialise their writes.
        """
        ...

    def shutdown(self) -> None:
        """End the stream both ways: a pending :meth:`read` returns, the process's stdin ends.

        Idempotent, and safe while other threads read or write.
        """
        ...

    def close(self) -> None:
        """Release the stream (after :meth:`shutdown`); idempotent."""
        ...


#: Starts one agent process in the sandbox: ``(argv, user, until)`` -> a stream to it. ``user`` is the
#: ``"uid:gid"`` the process runs as (an engine that cannot choose, such as ``pods/exec``, runs it as the
#: sandbox's own user), ``until`` the monotonic time by which the engine must have answered.
AgentStreamOpener = Callable[[list[str], str, float], AgentStream]

#: A stream to the container keeper's stdin for ``(user, until)``, when that user's agent is to be the
#: keeper's child, else None (then the agent starts as :data:`AgentStreamOpener` says).
ResidentOpener = Callable[[str, float], "AgentStream | None"]


class SocketStream:
    """The writing half of an :class:`AgentStream` over a connected socket; a subclass reads."""

    def __init__(self, sock: socket.socket) -> None:
        # A reader waits on this socket for as long as the agent lives (idle included): no timeout on it.
        # Writes are bounded by poll() instead of a socket timeout, which the reader would share.
        sock.settimeout(None)
        self.sock = sock

    def write(self, data: bytes, until: float) -> None:
        """See :meth:`AgentStream.write`."""
        send_all(self.sock, data, until)

    def shutdown(self) -> None:
        """See :meth:`AgentStream.shutdown`."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """See :meth:`AgentStream.close`."""
        self.sock.close()


def send_all(sock: socket.socket, data: bytes, until: float) -> None:
    """Write all of ``data`` by ``until`` (else ``TimeoutError``), leaving the socket's own timeout alone."""
    view = memoryview(data)
    poller = select.poll()  # not select.select: that fails for descriptors above 1023 in a busy process
    poller.register(sock, select.POLLOUT)
    while view:
        left = until - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        if poller.poll(max(int(left * 1000), 1)):
            try:
                view = view[sock.send(view, socket.MSG_DONTWAIT) :]
            except BlockingIOError:
                continue
