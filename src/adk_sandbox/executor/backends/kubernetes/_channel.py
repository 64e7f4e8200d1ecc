"""The framing of a ``pods/exec`` websocket (``v4.channel.k8s.io`` and ``v5.channel.k8s.io``), pure.

Each binary message is one stream byte (0 stdin, 1 stdout, 2 stderr, 3 the final Status, 255 v5's close) then
data. :func:`negotiated` refuses any other subprotocol; :func:`decode`, :func:`encode_stdin`,
:func:`encode_close` and :func:`parse_status` do the rest. Depth: docs/KUBERNETES.md, "The agent over
``pods/exec``".
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CLOSE",
    "ERROR",
    "STDERR",
    "STDIN",
    "STDOUT",
    "SUBPROTOCOLS",
    "ChannelMessage",
    "ChannelProtocol",
    "ChannelProtocolError",
    "ExecStatus",
    "decode",
    "encode_close",
    "encode_stdin",
    "negotiated",
    "parse_status",
]

STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255


class ChannelProtocol(enum.StrEnum):
    """The exec subprotocols this client speaks, preferred first."""

    V5 = "v5.channel.k8s.io"
    V4 = "v4.channel.k8s.io"

    @property
    def can_close_stdin(self) -> bool:
        """Only v5 can end stdin without ending the connection."""
        return self is ChannelProtocol.V5


#: The ``Sec-WebSocket-Protocol`` offer, preferred first.
SUBPROTOCOLS = (ChannelProtocol.V5.value, ChannelProtocol.V4.value)


class ChannelProtocolError(ValueError):
    """The server sent something the negotiated exec subprotocol does not allow."""


def negotiated(subprotocol: str | None) -> ChannelProtocol:
    """The protocol the server chose; :class:`ChannelProtocolError` for none or one not offered."""
    for protocol in ChannelProtocol:
        if subprotocol == protocol.value:
            return protocol
    raise ChannelProtocolError(
        f"the API server chose the exec subprotocol {subprotocol!r}, not one of {', '.join(SUBPROTOCOLS)} "
        "(a server older than Kubernetes 1.4, or a proxy that drops the Sec-WebSocket-Protocol header)"
    )


@dataclass(frozen=True)
class ChannelMessage:
    """One decoded message: ``data`` of a stream, a ``close`` of a stream, or the final ``status``."""

    kind: str
    """``"data"``, ``"close"`` or ``"status"``."""
    stream: int
    data: bytes = b""
    status: ExecStatus | None = None


@dataclass(frozen=True)
class ExecStatus:
    """How the exec'd process ended, from the Status on channel 3."""

    success: bool
    exit_code: int | None
    """The exit status (0 on Success); None when the process could not start or the server did not say."""
    reason: str = ""
    message: str = ""


def encode_stdin(data: bytes) -> bytes:
    """A message carrying ``data`` to the process's stdin."""
    return bytes([STDIN]) + data


def encode_close(protocol: ChannelProtocol, stream: int = STDIN) -> bytes:
    """v5's "no more data on ``stream``"; ValueError on v4, which has no such message."""
    if not protocol.can_close_stdin:
        raise ValueError(f"{protocol.value} cannot close a stream; close the websocket instead")
    return bytes([CLOSE, stream])


def decode(message: bytes, protocol: ChannelProtocol) -> ChannelMessage | None:
    """One server message; None for an empty data message (servers send one per stream as it opens)."""
    if not message:
        raise ChannelProtocolError("an empty websocket message (no stream byte)")
    stream, payload = message[0], bytes(message[1:])
    if stream == CLOSE:
        if not protocol.can_close_stdin:
            raise ChannelProtocolError("a close message (stream 255) on v4.channel.k8s.io")
        if len(payload) != 1:
            raise ChannelProtocolError(f"a close message of {len(payload)} bytes, not 1")
        return ChannelMessage("close", payload[0])
    if stream in (STDOUT, STDERR):
        return ChannelMessage("data", stream, payload) if payload else None
    if stream == ERROR:
        return ChannelMessage("status", ERROR, payload, parse_status(payload)) if payload else None
    raise ChannelProtocolError(f"a message on stream {stream}, which the server does not send")


def parse_status(payload: bytes) -> ExecStatus:
    """The Status JSON of channel 3 (v4 and v5 alike)."""
    try:
        body = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ChannelProtocolError(f"the exec status is not JSON: {payload[:200]!r}") from exc
    if not isinstance(body, dict):
        raise ChannelProtocolError(f"the exec status is a JSON {type(body).__name__}, not an object")
    status, reason, message = (
        body.get("status"),
        str(body.get("reason") or ""),
        str(body.get("message") or ""),
    )
    if status == "Success":
        return ExecStatus(success=True, exit_code=0)
    if status != "Failure":
        raise ChannelProtocolError(f"the exec status is {status!r}, neither Success nor Failure")
    return ExecStatus(success=False, exit_code=_exit_code(body), reason=reason, message=message)


def _exit_code(body: dict[str, Any]) -> int | None:
    if body.get("reason") != "NonZeroExitCode":
        return None
    for cause in (body.get("details") or {}).get("causes") or []:
        if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
            text = str(cause.get("message", ""))
            if text.isdigit():
                return int(text)
    return None
