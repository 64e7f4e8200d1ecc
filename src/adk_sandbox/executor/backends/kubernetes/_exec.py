"""The agent's stream over a ``pods/exec`` websocket: :class:`ExecBridge`, the agent channel's stream.

:class:`ExecBridge` turns the websocket into an :class:`~adk_sandbox.executor.channel.streams.AgentStream`:
stdout/stderr messages are read as pieces, the final Status is kept (:attr:`ExecBridge.status`), and
giving the agent up closes its stdin (v5) and then the websocket. Depth: docs/KUBERNETES.md, "The agent
over ``pods/exec``".
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from typing import Protocol

from adk_sandbox.executor.backends.kubernetes._channel import (
    STDIN,
    STDOUT,
    ChannelProtocol,
    ChannelProtocolError,
    ExecStatus,
    decode,
    encode_close,
    encode_stdin,
    negotiated,
)
from adk_sandbox.executor.channel.streams import SocketStream
from adk_sandbox.executor.types import Stream

__all__ = ["ExecBridge", "WebSocketLike"]

log = logging.getLogger(__name__)

_READ = 64 * 1024


class WebSocketLike(Protocol):
    """The little of a websocket the bridge needs (a real one: :class:`WebSocketClientAdapter`)."""

    @property
    def subprotocol(self) -> str | None:
        """The ``Sec-WebSocket-Protocol`` the server chose."""
        ...

    def send_binary(self, data: bytes) -> None:
        """Send one binary message."""
        ...

    def recv_message(self) -> bytes | None:
        """The next data message (blocking); None when the connection closed."""
        ...

    def close(self) -> None:
        """Close the connection (idempotent; unblocks a pending :meth:`recv_message`)."""
        ...


class ExecBridge(SocketStream):
    """One exec websocket as an :class:`AgentStream` (see the module docstring).

    :meth:`read`, :meth:`write`, :meth:`shutdown` and :meth:`close` are the channel's; :meth:`disconnect`
    drops the websocket itself (the session's end).
    """

    def __init__(self, websocket: WebSocketLike) -> None:
        self.protocol: ChannelProtocol = negotiated(websocket.subprotocol)
        """The negotiated subprotocol (v5 preferred)."""
        self.status: ExecStatus | None = None
        """How the exec'd process ended (channel 3), once the server said."""
        self.failure: str | None = None
        """Why the websocket side broke (a framing error, a dropped connection), if it did."""
        self._ws = websocket
        sock, self._peer = socket.socketpair()
        super().__init__(sock)
        self._closed = threading.Event()
        self._ended = False
        self._writer = threading.Thread(target=self._to_server, name="adk-sandbox-k8s-exec-out", daemon=True)
        self._writer.start()

    def read(self) -> list[tuple[Stream, bytes]] | None:
        """The next stdout or stderr piece from the server; None once the websocket ended (or broke)."""
        while not self._ended:
            try:
                message = self._ws.recv_message()
            except Exception as exc:  # the library's own exceptions: the connection is gone
                if not self._closed.is_set():
                    self.failure = f"the exec websocket broke: {exc}"
                break
            if message is None:
                break
            try:
                decoded = decode(message, self.protocol)
            except ChannelProtocolError as exc:
                self.failure = f"the exec stream broke {self.protocol.value}: {exc}"
                break
            if decoded is None or decoded.kind == "close":
                continue  # a stream opening, or the server done with one: the status or end follows
            if decoded.kind == "status":
                self.status = decoded.status
                if decoded.status is not None and decoded.status.exit_code is None and decoded.status.message:
                    # Could not start (no python3, a bad argv): the channel quotes its stderr.
                    return [("stderr", decoded.status.message.encode())]
                continue
            return [("stdout" if decoded.stream == STDOUT else "stderr", decoded.data)]
        if not self._ended:
            self._ended = True
            if self.failure:
                log.warning("%s", self.failure)
        return None

    def _to_server(self) -> None:
        try:
            while True:
                data = self._peer.recv(_READ)
                if not data:
                    break
                self._ws.send_binary(encode_stdin(data))
            if self.protocol.can_close_stdin:
                self._ws.send_binary(encode_close(self.protocol, STDIN))
        except Exception as exc:  # a send on a broken websocket: the reader sees the end too
            log.debug("exec websocket write failed: %s", exc)
        finally:
            self.disconnect()

    def disconnect(self) -> None:
        """Close the websocket and the pump's end of the pair (the channel closes its own end)."""
        self._closed.set()
        with contextlib.suppress(Exception):
            self._ws.close()
        with contextlib.suppress(OSError):
            self._peer.shutdown(socket.SHUT_RDWR)

    def join(self, timeout: float | None = None) -> None:
        """Wait for the pump to end (tests; the channel never waits)."""
        self._writer.join(timeout)
        self._peer.close()


class WebSocketClientAdapter:
    """:class:`WebSocketLike` over ``websocket-client``'s ``WebSocket`` (what the kubernetes client opens)."""

    def __init__(self, ws: object, subprotocol: str | None) -> None:
        self._ws = ws
        self._subprotocol = subprotocol

    @property
    def subprotocol(self) -> str | None:
        """The subprotocol the server chose."""
        return self._subprotocol

    def send_binary(self, data: bytes) -> None:
        """Send one binary message."""
        from websocket import ABNF  # noqa: PLC0415 - the optional k8s extra, imported on use

        self._ws.send(data, opcode=ABNF.OPCODE_BINARY)  # type: ignore[attr-defined]

    def recv_message(self) -> bytes | None:
        """The next binary or text message; None on a close frame or a closed connection."""
        from websocket import ABNF, WebSocketConnectionClosedException  # noqa: PLC0415

        while True:
            try:
                opcode, frame = self._ws.recv_data_frame(True)  # type: ignore[attr-defined]
            except WebSocketConnectionClosedException:
                return None
            if opcode == ABNF.OPCODE_CLOSE:
                return None
            if opcode in (ABNF.OPCODE_BINARY, ABNF.OPCODE_TEXT):
                data = frame.data
                return data if isinstance(data, bytes) else str(data).encode()

    def close(self) -> None:
        """Close the connection."""
        self._ws.close()  # type: ignore[attr-defined]
