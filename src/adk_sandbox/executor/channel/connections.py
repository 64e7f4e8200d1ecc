"""The host side of the proxy endpoint's connections: one agent's OPEN, DATA, CREDIT and CLOSE frames.

:class:`Connections` demultiplexes one agent's connection frames and hands each connection, as a
:class:`ConnectionStream` (the :class:`ByteStream` shape the relay takes), to the listener's handler in
a thread of its own; :meth:`Connections.dial` opens one the other way; :func:`pump` copies a stream.
See docs/docker/agent-channel.md, section "Connections: the proxy endpoint".
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Protocol

from adk_sandbox.executor.channel.frames import (
    CONNECTION_BASE,
    DIAL_BASE,
    WINDOW,
    Frame,
    FrameType,
    ProtocolError,
    encode,
)

__all__ = ["ByteStream", "ConnectionHandler", "ConnectionStream", "Connections", "pump"]

log = logging.getLogger(__name__)

#: Serves one connection to its end (the session passes ``lambda stream: relay(stream, policy, log)``).
ConnectionHandler = Callable[["ConnectionStream"], object]
#: Writes frames to the agent by a monotonic deadline (the agent's ``send``); raises when it cannot.
Sender = Callable[[bytes, float], None]

#: Bytes of one DATA frame at most.
DATA_CHUNK = 64 * 1024
#: How long one write of frames may take before the agent is given up (as for commands' frames).
_SEND_SECONDS = 10.0
#: Credit is returned once this many bytes were consumed (a quarter of the window).
_GRANT_AT = WINDOW // 4


class ConnectionStream:
    """One connection accepted by the agent's listener, as a duplex byte stream (``ByteStream``).

    ``recv`` returns ``b""`` once the sandbox's side ended (end of file, CLOSE, the agent gone) and raises
    ``TimeoutError`` past :meth:`settimeout`; ``sendall`` waits for credit (the sandbox's client reads
    slowly: only this connection waits) and raises ``BrokenPipeError`` once the connection is closed;
    ``shutdown`` and ``close`` wake a ``recv`` or ``sendall`` blocked in another thread.
    """

    def __init__(
        self, channel: int, send: Sender, forget: Callable[[int], None], *, opened: bool = True
    ) -> None:
        self.channel = channel
        #: The agent said the connection is open: always for an accepted one, at OPEN for a dialed one.
        self._opened = opened
        self._send = send
        self._forget = forget
        self._cond = threading.Condition()
        self._buffer = bytearray()
        self._received = 0  # DATA bytes received in all
        self._allowed = WINDOW  # what the agent may have sent in all: the window plus the credit granted
        self._ungranted = 0  # bytes consumed whose credit is not yet returned
        self._credit = WINDOW  # DATA bytes this side may still send
        self._timeout: float | None = None
        self._peer_eof = False  # the sandbox's side ended its direction (or closed, or the agent is gone)
        self._peer_closed = False  # CLOSE received (or the agent gone): nothing more may be sent
        self._read_shut = False
        self._write_shut = False  # end of file sent
        self._closed = False
        self.error: str | None = None  # why the sandbox's side ended abnormally (CLOSE's error, agent gone)

    # -- fed by the reader thread (never waits) ------------------------------------------------------
    def _feed(self, data: bytes) -> None:
        with self._cond:
            if not data:
                self._peer_eof = True
            else:
                if not self._opened:
                    raise ProtocolError(f"DATA on connection {self.channel:#x} before its OPEN")
                self._received += len(data)
                if self._received > self._allowed:
                    raise ProtocolError(f"connection {self.channel:#x} sent more than its window")
                if self._peer_eof:
                    raise ProtocolError(f"connection {self.channel:#x} sent DATA after its end of file")
                if not self._read_shut and not self._closed:
                    self._buffer += data
            self._cond.notify_all()

    def _open_answer(self) -> None:
        with self._cond:
            if self._opened:
                raise ProtocolError(f"a second OPEN of connection {self.channel:#x}")
            self._opened = True
            self._cond.notify_all()

    def _grant(self, amount: int) -> None:
        with self._cond:
            self._credit += amount
            self._cond.notify_all()

    def _ended(self, error: str | None) -> None:
        with self._cond:
            self._peer_eof = self._peer_closed = True
            if error and self.error is None:
                self.error = error
            self._cond.notify_all()

    # -- the ByteStream ------------------------------------------------------------------------------
    def settimeout(self, timeout: float | None, /) -> None:
        """How long :meth:`recv` and :meth:`sendall` may wait (None: until the connection ends)."""
        self._timeout = timeout

    def _wait(self, ready: Callable[[], bool]) -> None:
        until = None if self._timeout is None else time.monotonic() + self._timeout
        while not ready():
            left = None if until is None else until - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError("timed out")
            self._cond.wait(left)

    def recv(self, size: int, /) -> bytes:
        """Up to ``size`` bytes the sandbox's client sent; ``b""`` at its end."""
        with self._cond:
            self._wait(lambda: bool(self._buffer) or self._peer_eof or self._read_shut or self._closed)
            if self._read_shut or self._closed or not self._buffer:
                return b""
            data = bytes(self._buffer[:size])
            del self._buffer[:size]
            self._ungranted += len(data)
            grant = 0
            if self._ungranted >= _GRANT_AT and not self._peer_eof:
                grant, self._ungranted = self._ungranted, 0
                self._allowed += grant
        if grant:
            with contextlib.suppress(OSError):
                self._write(encode(FrameType.CREDIT, self.channel, {"bytes": grant}))
        return data

    def sendall(self, data: bytes, /) -> None:
        """Send every byte of ``data`` to the sandbox's client, as the window allows."""
        view = memoryview(data)
        while view:
            with self._cond:
                self._wait(lambda: self._credit > 0 or self._peer_closed or self._write_shut or self._closed)
                if self._peer_closed or self._write_shut or self._closed:
                    raise BrokenPipeError(32, "the sandbox's side of the connection is closed")
                size = min(self._credit, DATA_CHUNK, len(view))
                self._credit -= size
            self._write(encode(FrameType.DATA, self.channel, bytes(view[:size])))
            view = view[size:]

    def shutdown(self, how: int, /) -> None:
        """``SHUT_WR``: end of file to the sandbox's client; ``SHUT_RD``: wake and end ``recv``."""
        send_eof = False
        with self._cond:
            if how in (socket.SHUT_RD, socket.SHUT_RDWR):
                self._read_shut = True
                self._buffer.clear()
            if how in (socket.SHUT_WR, socket.SHUT_RDWR) and not self._write_shut:
                self._write_shut = True
                send_eof = not self._peer_closed and not self._closed
            self._cond.notify_all()
        if send_eof:
            self._write(encode(FrameType.DATA, self.channel, b""))

    def close(self) -> None:
        """Close the connection: the agent closes its socket once it has written what was sent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._buffer.clear()
            tell = not self._peer_closed
            self._cond.notify_all()
        self._forget(self.channel)
        if tell:
            with contextlib.suppress(OSError):
                self._write(encode(FrameType.CLOSE, self.channel, {}))

    def _write(self, frames: bytes) -> None:
        try:
            self._send(frames, time.monotonic() + _SEND_SECONDS)
        except Exception as exc:  # the agent is gone or stuck: this connection is over
            self._ended(f"the agent channel failed: {exc}")
            raise BrokenPipeError(32, f"the agent channel failed: {exc}") from exc

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed


class Connections:
    """The connections of one agent: listeners by LISTEN channel, streams by connection channel."""

    def __init__(self, send: Sender) -> None:
        self._send = send
        self._lock = threading.Lock()
        self._handlers: dict[int, ConnectionHandler] = {}
        self._streams: dict[int, ConnectionStream] = {}
        self._highest = CONNECTION_BASE - 1  # the last connection channel opened: ids are never reused
        self._next_dial = DIAL_BASE  # the next channel of a DIAL: ids are never reused either
        self._broken: str | None = None

    def add_listener(self, channel: int, handler: ConnectionHandler) -> None:
        """Serve the connections of the listener opened by LISTEN on ``channel`` with ``handler``."""
        with self._lock:
            self._handlers[channel] = handler

    def listening(self) -> dict[int, ConnectionHandler]:
        """Every listener served here and its handler (an agent let go keeps them for when it comes back)."""
        with self._lock:
            return dict(self._handlers)

    def listeners_of(self, handler: ConnectionHandler) -> tuple[int, ...]:
        """The listeners whose connections ``handler`` serves (a copy of the agent must serve them again)."""
        with self._lock:
            return tuple(channel for channel, served in self._handlers.items() if served == handler)

    def remove_listener(self, channel: int) -> None:
        """Forget a listener (connections it already opened go on)."""
        with self._lock:
            self._handlers.pop(channel, None)

    def numbering(self) -> tuple[int, int]:
        """The highest connection opened and the next dial's channel (see :meth:`continue_from`)."""
        with self._lock:
            return self._highest, self._next_dial

    def continue_from(self, numbering: tuple[int, ...]) -> None:
        """Go on numbering from ``numbering`` (the same agent's, over an earlier stream)."""
        with self._lock:
            self._highest, self._next_dial = numbering[0], numbering[1]

    @property
    def open_connections(self) -> int:
        """How many connections are open (their handler has not closed them)."""
        with self._lock:
            return len(self._streams)

    def dial(self, port: int, until: float) -> ConnectionStream:
        """A connection to ``127.0.0.1:port`` in the agent's sandbox (DIAL), once the agent says it is open.

        ``ConnectionRefusedError`` (an ``OSError``) when the agent could not connect (with its reason), or
        holds :data:`.frames.MAX_CONNECTIONS` already; ``TimeoutError`` when it did not answer by the
        monotonic ``until`` (the connect is then abandoned). The caller closes the stream.
        """
        with self._lock:
            if self._broken is not None:
                raise ConnectionRefusedError(errno.ECONNREFUSED, f"the agent is gone: {self._broken}")
            channel = self._next_dial
            if channel > 0xFFFF_FFFF:
                raise ConnectionRefusedError(errno.ECONNREFUSED, "no DIAL channel left on this agent")
            self._next_dial += 1
            stream = ConnectionStream(channel, self._send, self._forget, opened=False)
            self._streams[channel] = stream
        try:
            stream._write(encode(FrameType.DIAL, channel, {"port": port}))
            with stream._cond:
                stream.settimeout(max(until - time.monotonic(), 0.0))
                stream._wait(lambda: stream._opened or stream._peer_closed)
                refused = None if stream._opened else (stream.error or "closed")
        except BaseException:
            stream.close()
            raise
        stream.settimeout(None)
        if refused is not None:
            stream.close()
            raise ConnectionRefusedError(errno.ECONNREFUSED, f"port {port} in the sandbox: {refused}")
        return stream

    def deliver(self, frame: Frame) -> None:
        """Take one connection frame (the reader thread: never waits); a :class:`ProtocolError` for a lie."""
        channel = frame.channel
        if frame.type == FrameType.OPEN and channel < DIAL_BASE:
            self._open(channel, int((frame.body or {})["listener"]))
            return
        with self._lock:
            stream = self._streams.get(channel)
            if stream is None:
                fresh = channel > self._highest if channel < DIAL_BASE else channel >= self._next_dial
                if fresh:
                    what = frame.type.name
                    raise ProtocolError(f"{what} for connection {channel:#x}, which was never opened")
                return  # a connection already closed on this side: its late frames are dropped
            if frame.type == FrameType.CLOSE:
                self._streams.pop(channel, None)
        if frame.type == FrameType.OPEN:
            stream._open_answer()
        elif frame.type == FrameType.CREDIT and not stream._opened:
            raise ProtocolError(f"CREDIT on connection {channel:#x} before its OPEN")
        elif frame.type == FrameType.DATA:
            stream._feed(frame.data)
        elif frame.type == FrameType.CREDIT:
            stream._grant(int((frame.body or {})["bytes"]))
        else:
            error = (frame.body or {}).get("error")
            stream._ended(error if isinstance(error, str) else None)

    def _open(self, channel: int, listener: int) -> None:
        with self._lock:
            if channel <= self._highest:
                raise ProtocolError(f"OPEN of connection {channel:#x}, which is not a fresh channel")
            self._highest = channel
            handler = self._handlers.get(listener)
            stream = ConnectionStream(channel, self._send, self._forget)
            if self._broken is None:
                self._streams[channel] = stream
        if self._broken is not None:
            stream._ended(self._broken)
        if handler is None or self._broken is not None:
            # No handler here (a listener forgotten, or never asked for): closed, from a thread of its own
            # (the reader never writes to the agent).
            threading.Thread(target=stream.close, name="adk-sandbox-connection", daemon=True).start()
            return
        threading.Thread(
            target=self._serve, args=(handler, stream), name="adk-sandbox-connection", daemon=True
        ).start()

    @staticmethod
    def _serve(handler: ConnectionHandler, stream: ConnectionStream) -> None:
        try:
            handler(stream)
        except Exception:
            log.exception("the handler of a proxied connection failed")
        finally:
            stream.close()

    def _forget(self, channel: int) -> None:
        with self._lock:
            self._streams.pop(channel, None)

    def fail_all(self, why: str) -> None:
        """The agent is gone: every connection ends (a blocked ``recv`` returns, ``sendall`` raises)."""
        with self._lock:
            self._broken = why
            streams, self._streams = list(self._streams.values()), {}
            self._handlers.clear()
        for stream in streams:
            stream._ended(why)


class ByteStream(Protocol):
    """What :func:`pump` copies between: a :class:`ConnectionStream` or a connected socket."""

    def recv(self, size: int) -> bytes: ...  # noqa: D102
    def sendall(self, data: bytes) -> None: ...  # noqa: D102
    def shutdown(self, how: int) -> None: ...  # noqa: D102
    def close(self) -> None: ...  # noqa: D102


def pump(source: ByteStream, target: ByteStream) -> None:
    """Copy one direction to its end, then pass the end of file on (a half-close); errors end both."""
    try:
        while data := source.recv(64 * 1024):
            target.sendall(data)
        target.shutdown(socket.SHUT_WR)
    except OSError:
        source.close()
        target.close()
