"""The framing spoken between the host and the in-sandbox agent: protocol version 1 (pure, no I/O).

:class:`FrameType`, :class:`Frame`, :func:`encode` and the checking :class:`FrameDecoder` (which raises
:class:`ProtocolError`), with the protocol's limits (:data:`MAX_PAYLOAD`, :data:`WINDOW`, ...).
See docs/agent-protocol.md for the header, every frame type, the optional HELLO keys and the file operations.
"""

from __future__ import annotations

import enum
import json
import re
import struct
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AGENT_ENDED_BYTE",
    "AGENT_TO_HOST",
    "CLOSE_LINGER_SECONDS",
    "CONNECTION_BASE",
    "CONNECTION_TYPES",
    "DIAL_BASE",
    "DIAL_VERSION",
    "FILE_OPS",
    "HEADER",
    "HOST_TO_AGENT",
    "MAX_CONNECTIONS",
    "MAX_CREDIT",
    "MAX_LISTENERS",
    "MAX_PAYLOAD",
    "MAX_PTYS",
    "MAX_PTY_SIDE",
    "MAX_UNIX_PATH",
    "PROTOCOL_VERSION",
    "PROXY_VERSION",
    "PTY_TYPES",
    "PTY_VERSION",
    "PTY_WINDOW",
    "SETID_STATES",
    "UNIX_VERSION",
    "WINDOW",
    "AgentEndedError",
    "Frame",
    "FrameDecoder",
    "FrameType",
    "ProtocolError",
    "control",
    "encode",
    "split_entries",
    "validate_exit",
    "validate_hello",
    "validate_listen_address",
    "validate_result",
    "validate_result_for",
]

PROTOCOL_VERSION = 1
HEADER = struct.Struct(">BBHII")
#: The largest payload of a frame (4 MiB); data is sent in far smaller chunks. A RUN frame carries a
#: whole argv and environment, which Linux accepts up to a quarter of the stack limit (2 MiB with the usual
#: 8 MiB), plus JSON's escaping: 1 MiB refused commands execve would run (inspect's self_check sends 1 MiB).
MAX_PAYLOAD = 4 * 1024 * 1024
_MAX_CHANNEL = 2**32 - 1
#: The FILE operations of version 1, in the order of the table above.
FILE_OPS = ("read", "write", "stat", "list", "mkdir", "remove", "rename")
#: The values of HELLO's ``"setid"``: whether the set-id filter is on what the agent starts.
SETID_STATES = ("refused", "allowed", "unavailable")
#: Connection channels (allocated by the agent) are this and above; the host's channels are below it.
CONNECTION_BASE = 0x8000_0000
#: Connection channels the host allocates (DIAL) are this and above; the agent's stay below it.
DIAL_BASE = 0xC000_0000
#: The initial window of each direction of each connection (bytes of DATA before any CREDIT).
WINDOW = 256 * 1024
#: The largest CREDIT a frame may carry.
MAX_CREDIT = 1 << 30
#: The most connections an agent carries at once; one more is accepted and closed at once.
MAX_CONNECTIONS = 256
#: The most listeners an agent serves at once (the proxy endpoint and the sibling services' ports).
MAX_LISTENERS = 64
#: How long an agent keeps a connection the host CLOSEd to write what is still pending to it.
CLOSE_LINGER_SECONDS = 30.0
#: The version of the proxy endpoint an agent's HELLO advertises (``"proxy"``).
PROXY_VERSION = 1
#: The version of dialing (DIAL, LISTEN's ``"address"``) an agent's HELLO advertises (``"dial"``).
DIAL_VERSION = 1
#: The version of the direct path (LISTEN's ``"unix"`` and ``"token"``) a HELLO advertises (``"unix"``).
UNIX_VERSION = 2
#: The version of terminals (RUN ``"pty"``, RESIZE, SIGNAL) a HELLO advertises (``"pty"``).
PTY_VERSION = 1
#: A terminal's output the agent sends before any CREDIT (and the most it ever has in flight).
PTY_WINDOW = 1 << 20
#: The most terminals an agent holds open at once (one more RUN ``"pty"`` is refused).
MAX_PTYS = 32
#: A terminal's rows and columns are 1..this.
MAX_PTY_SIDE = 10000
#: The longest path of LISTEN's ``"unix"`` (``sun_path`` is 108 bytes with its terminating NUL).
MAX_UNIX_PATH = 107
_TOKEN = re.compile(r"[A-Za-z0-9]{16,256}")
_STAT_TYPES = frozenset({"file", "dir", "symlink", "other"})
_ENTRY_TYPES = frozenset("fdlo")


class FrameType(enum.IntEnum):
    """The frame types of protocol version 1."""

    HELLO = 1
    RUN = 2
    STDIN = 3
    STDOUT = 4
    STDERR = 5
    EXIT = 6
    KILL = 7
    PING = 8
    PONG = 9
    ERROR = 10
    FILE = 11
    RESULT = 12
    LISTEN = 13
    OPEN = 14
    DATA = 15
    CREDIT = 16
    CLOSE = 17
    DIAL = 18
    RESIZE = 19
    SIGNAL = 20


DATA_TYPES = frozenset({FrameType.STDIN, FrameType.STDOUT, FrameType.STDERR, FrameType.DATA})
#: The frames of a connection: only on connection channels (>= :data:`CONNECTION_BASE`).
CONNECTION_TYPES = frozenset(
    {FrameType.OPEN, FrameType.DATA, FrameType.CREDIT, FrameType.CLOSE, FrameType.DIAL}
)
AGENT_TO_HOST = frozenset(
    {
        FrameType.HELLO,
        FrameType.STDOUT,
        FrameType.STDERR,
        FrameType.EXIT,
        FrameType.PONG,
        FrameType.ERROR,
        FrameType.RESULT,
        FrameType.OPEN,
        FrameType.DATA,
        FrameType.CREDIT,
        FrameType.CLOSE,
    }
)
HOST_TO_AGENT = frozenset(
    {
        FrameType.RUN,
        FrameType.STDIN,
        FrameType.KILL,
        FrameType.PING,
        FrameType.FILE,
        FrameType.LISTEN,
        FrameType.DATA,
        FrameType.CREDIT,
        FrameType.CLOSE,
        FrameType.DIAL,
        FrameType.RESIZE,
        FrameType.SIGNAL,
    }
)
#: The frames of a terminal's channel besides a command's (host→agent; CREDIT also a connection's).
PTY_TYPES = frozenset({FrameType.RESIZE, FrameType.SIGNAL})
_SESSION_TYPES = frozenset({FrameType.HELLO, FrameType.PING, FrameType.PONG})


class ProtocolError(ValueError):
    """The peer sent something protocol version 1 does not allow."""


#: The byte a container's keeper fills the stream with once its agent ended (``inside/agent.c``, "the
#: keeper"): never a frame type, so the reader gives the agent up at once.
AGENT_ENDED_BYTE = 0xFF


class AgentEndedError(ProtocolError):
    """The stream carries :data:`AGENT_ENDED_BYTE` where a frame starts: the keeper says its agent ended."""


@dataclass(frozen=True)
class Frame:
    """One decoded frame: control frames carry ``body`` (a dict), data frames ``data``."""

    type: FrameType
    channel: int
    data: bytes = b""
    body: dict[str, Any] | None = None


def encode(kind: FrameType, channel: int, payload: bytes | dict[str, Any] = b"") -> bytes:
    """One frame as bytes (a dict payload is sent as compact JSON)."""
    if isinstance(payload, dict):
        payload = control(payload)
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"frame payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
    if not 0 <= channel <= _MAX_CHANNEL:
        raise ValueError(f"channel {channel} out of range")
    return HEADER.pack(int(kind), 0, 0, channel, len(payload)) + payload


def control(body: dict[str, Any]) -> bytes:
    """A control payload: a JSON object, UTF-8."""
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()


def _parse_control(payload: bytes) -> dict[str, Any]:
    try:
        body = json.loads(payload.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"control payload is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ProtocolError(f"control payload is a JSON {type(body).__name__}, not an object")
    return body


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


class FrameDecoder:
    """Incremental decoder: :meth:`feed` bytes as they arrive, get whole frames back.

    ``accept`` is the set of types this side may receive (:data:`AGENT_TO_HOST` on the host). Holds at most
    one partial frame (header + up to :data:`MAX_PAYLOAD`); any violation raises :class:`ProtocolError`
    and leaves the decoder failed (every later :meth:`feed` raises again).
    """

    def __init__(self, accept: frozenset[FrameType] = AGENT_TO_HOST, *, expect_hello: bool = True) -> None:
        self._accept = accept
        self._buffer = bytearray()
        self._need_hello = expect_hello and FrameType.HELLO in accept
        self._failed: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held for a frame not yet complete."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[Frame]:
        """Consume ``data``; the frames it completed, in order."""
        if self._failed is not None:
            raise self._failed
        try:
            return self._feed(data)
        except ProtocolError as exc:
            self._failed = exc
            self._buffer.clear()
            raise

    def _feed(self, data: bytes) -> list[Frame]:
        frames: list[Frame] = []
        view = memoryview(data)
        while view:
            if len(self._buffer) < HEADER.size:
                take = HEADER.size - len(self._buffer)
                self._buffer += view[:take]
                view = view[take:]
                if len(self._buffer) < HEADER.size:
                    break
                self._check_header()
            length = HEADER.unpack_from(self._buffer)[4]
            missing = HEADER.size + length - len(self._buffer)
            self._buffer += view[:missing]
            view = view[missing:]
            if len(self._buffer) == HEADER.size + length:
                frames.append(self._frame())
                self._buffer.clear()
        return frames

    def _check_header(self) -> None:
        kind, flags, reserved, channel, length = HEADER.unpack_from(self._buffer)
        if kind == AGENT_ENDED_BYTE:
            raise AgentEndedError("the container's keeper says its agent ended")
        if kind not in FrameType._value2member_map_:
            raise ProtocolError(f"unknown frame type {kind}")
        frame_type = FrameType(kind)
        if frame_type not in self._accept:
            raise ProtocolError(f"frame type {frame_type.name} is not allowed in this direction")
        if flags or reserved:
            raise ProtocolError(f"frame flags {flags} / reserved {reserved} must be 0 in version 1")
        if length > MAX_PAYLOAD:
            raise ProtocolError(f"frame payload of {length} bytes exceeds {MAX_PAYLOAD}")
        if (channel == 0) != (frame_type in _SESSION_TYPES):
            raise ProtocolError(f"{frame_type.name} frame on channel {channel}")
        # A terminal's CREDIT (host→agent) is on a host channel, as RESIZE and SIGNAL are.
        terminal_credit = frame_type == FrameType.CREDIT and FrameType.RESIZE in self._accept
        if (
            (channel >= CONNECTION_BASE) != (frame_type in CONNECTION_TYPES)
            and not (terminal_credit and channel < CONNECTION_BASE)
            and (frame_type in CONNECTION_TYPES or frame_type not in DATA_TYPES)
        ):
            where = "a connection channel" if channel >= CONNECTION_BASE else "a host channel"
            raise ProtocolError(f"{frame_type.name} frame on {where} ({channel})")
        if frame_type == FrameType.DIAL and channel < DIAL_BASE:
            raise ProtocolError(f"DIAL frame on channel {channel:#x}, below {DIAL_BASE:#x}")
        if frame_type == FrameType.HELLO:
            if not self._need_hello:
                raise ProtocolError("a second HELLO")
        elif self._need_hello:
            raise ProtocolError(f"{frame_type.name} frame before HELLO")

    def _frame(self) -> Frame:
        kind, _, _, channel, _ = HEADER.unpack_from(self._buffer)
        frame_type = FrameType(kind)
        payload = bytes(self._buffer[HEADER.size :])
        if frame_type in DATA_TYPES:
            return Frame(frame_type, channel, data=payload)
        if frame_type == FrameType.KILL and not payload:
            return Frame(frame_type, channel, body={})
        body = _parse_control(payload)
        if frame_type == FrameType.HELLO:
            validate_hello(body)
            self._need_hello = False
        elif frame_type == FrameType.EXIT:
            validate_exit(body)
        elif frame_type == FrameType.RESULT:
            validate_result(body)
        elif frame_type == FrameType.ERROR and not isinstance(body.get("message"), str):
            raise ProtocolError("ERROR without a message string")
        else:
            _validate_connection(frame_type, body, channel)
        return Frame(frame_type, channel, body=body)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_hello(body: dict[str, Any]) -> None:
    """A HELLO body: protocol 1, an integer pid, a boolean subreaper flag."""
    if body.get("protocol") != PROTOCOL_VERSION or not _is_int(body.get("protocol")):
        raise ProtocolError(f"agent speaks protocol {body.get('protocol')!r}, not {PROTOCOL_VERSION}")
    if not _is_int(body.get("pid")) or not isinstance(body.get("subreaper"), bool):
        raise ProtocolError("HELLO needs an integer pid and a boolean subreaper")
    if "agent" in body and not isinstance(body["agent"], str):
        raise ProtocolError(f"HELLO agent {body['agent']!r} is not a string")
    ops = body.get("ops", [])
    if not isinstance(ops, list) or not all(isinstance(op, str) for op in ops):
        raise ProtocolError(f"HELLO ops {ops!r} is not a list of strings")
    if "setid" in body and body["setid"] not in SETID_STATES:
        raise ProtocolError(f"HELLO setid {body['setid']!r} is not one of {', '.join(SETID_STATES)}")
    for key in ("proxy", "dial", "unix", "pty"):
        if key in body and not (_is_int(body[key]) and body[key] >= 0):
            raise ProtocolError(f"HELLO {key} {body[key]!r} is not an integer >= 0")


def validate_listen_address(address: object) -> str:
    """``address`` if it is a dotted IPv4 address in ``127.0.0.0/8`` (LISTEN's ``"address"``).

    Else a :class:`ProtocolError`: four decimal parts 0..255 without leading zeros, as ``inet_pton`` reads.
    """
    parts = address.split(".") if isinstance(address, str) else []
    well_formed = len(parts) == 4 and all(
        part.isascii() and part.isdigit() and str(int(part)) == part and int(part) <= 255 for part in parts
    )
    if not (well_formed and parts[0] == "127"):
        raise ProtocolError(f"LISTEN address {address!r} is not an IPv4 address in 127.0.0.0/8")
    return str(address)


def _validate_direct(body: dict[str, Any]) -> None:
    """LISTEN's optional ``"unix"`` and ``"token"`` (the direct path): both or neither, well formed."""
    if ("unix" in body) != ("token" in body):
        raise ProtocolError("LISTEN unix and token go together")
    if "unix" in body:
        path, token = body["unix"], body["token"]
        if not (isinstance(path, str) and path.startswith("/") and len(path.encode()) <= MAX_UNIX_PATH):
            raise ProtocolError(f"LISTEN unix {path!r} is not an absolute path of at most 107 bytes")
        if not (isinstance(token, str) and _TOKEN.fullmatch(token)):
            raise ProtocolError("LISTEN token is not 16..256 ASCII letters and digits")


def _validate_connection(kind: FrameType, body: dict[str, Any], channel: int = 0) -> None:
    """The bodies of LISTEN, OPEN, CREDIT, CLOSE and DIAL (the connection frames of the table above)."""
    if kind == FrameType.LISTEN:
        port = body.get("port")
        if not (isinstance(port, int) and _is_int(port) and 0 <= port <= 65535):
            raise ProtocolError(f"LISTEN port {port!r}")
        if "address" in body:
            validate_listen_address(body["address"])
        _validate_direct(body)
    elif kind == FrameType.DIAL or (kind == FrameType.OPEN and channel >= DIAL_BASE):
        port = body.get("port")
        if not (isinstance(port, int) and _is_int(port) and 1 <= port <= 65535):
            raise ProtocolError(f"{kind.name} port {port!r}")
    elif kind == FrameType.OPEN:
        listener = body.get("listener")
        if not (isinstance(listener, int) and _is_int(listener) and 1 <= listener < CONNECTION_BASE):
            raise ProtocolError(f"OPEN listener {listener!r}")
    elif kind == FrameType.CREDIT:
        amount = body.get("bytes")
        if not (isinstance(amount, int) and _is_int(amount) and 1 <= amount <= MAX_CREDIT):
            raise ProtocolError(f"CREDIT bytes {amount!r}")
    elif kind == FrameType.CLOSE and "error" in body and not isinstance(body["error"], str):
        raise ProtocolError(f"CLOSE error {body['error']!r} is not a string")
    elif kind in PTY_TYPES:
        _validate_terminal(kind, body)


def _validate_terminal(kind: FrameType, body: dict[str, Any]) -> None:
    """The bodies of RESIZE and SIGNAL."""
    if kind == FrameType.RESIZE:
        for key in ("rows", "cols"):
            value = body.get(key)
            if not (isinstance(value, int) and _is_int(value) and 1 <= value <= MAX_PTY_SIDE):
                raise ProtocolError(f"RESIZE {key} {value!r}")
    else:
        value = body.get("signal")
        if not (isinstance(value, int) and _is_int(value) and 1 <= value <= 64):
            raise ProtocolError(f"SIGNAL signal {value!r}")


def validate_exit(body: dict[str, Any]) -> None:
    """An EXIT body: exit_code and signal integers (0..255, 1..127) or null, booleans, counts >= 0.

    The optional ``oom_kills`` is an integer >= 0 or null.
    """
    code, sig = body.get("exit_code"), body.get("signal")
    if code is not None and not (isinstance(code, int) and _is_int(code) and 0 <= code <= 255):
        raise ProtocolError(f"EXIT exit_code {code!r}")
    if sig is not None and not (isinstance(sig, int) and _is_int(sig) and 1 <= sig <= 127):
        raise ProtocolError(f"EXIT signal {sig!r}")
    if not isinstance(body.get("timed_out"), bool):
        raise ProtocolError("EXIT timed_out must be a boolean")
    for key in ("stdout_dropped", "stderr_dropped"):
        value = body.get(key)
        if not (isinstance(value, int) and _is_int(value) and value >= 0):
            raise ProtocolError(f"EXIT {key} {value!r}")
    oom = body.get("oom_kills")
    if oom is not None and not (isinstance(oom, int) and _is_int(oom) and oom >= 0):
        raise ProtocolError(f"EXIT oom_kills {oom!r}")


def validate_result(body: dict[str, Any]) -> None:
    """A RESULT body: any object, but an ``error`` must be ``{"errno": int, "name": str, "message": str}``."""
    if "error" not in body:
        return
    error = body["error"]
    if not (
        isinstance(error, dict)
        and _is_int(error.get("errno"))
        and isinstance(error.get("name"), str)
        and isinstance(error.get("message"), str)
    ):
        raise ProtocolError(f"RESULT error {error!r} is not {{errno: int, name: str, message: str}}")


def validate_result_for(op: str, body: dict[str, Any], data: bytes = b"") -> None:
    """A RESULT of ``op`` (and the STDOUT bytes before it) as the table above says (once the op is known)."""
    if "error" in body:
        if data and op not in ("read", "list"):
            raise ProtocolError(f"{op} sent data")
        return
    if op in ("read", "write"):
        _need_count(body, "size", op)
    elif op == "list":
        _need_count(body, "count", op)
        found = len(split_entries(data))
        if found != body["count"]:
            raise ProtocolError(f"RESULT of list: count {body['count']} but {found} entries")
    elif op == "stat":
        if body.get("type") not in _STAT_TYPES:
            raise ProtocolError(f"RESULT of stat: type {body.get('type')!r}")
        for key in ("size", "mode", "uid", "gid"):
            _need_count(body, key, op)
        mtime = body.get("mtime")
        if not (isinstance(mtime, (int, float)) and not isinstance(mtime, bool)):
            raise ProtocolError(f"RESULT of stat: mtime {mtime!r}")
    if data and op not in ("read", "list"):
        raise ProtocolError(f"{op} sent data")


def split_entries(data: bytes) -> list[tuple[str, bytes]]:
    """The entries of a ``list``: (type letter, name bytes) each; a malformed listing is a protocol error."""
    if not data:
        return []
    if not data.endswith(b"\0"):
        raise ProtocolError("a list entry without its NUL")
    entries = []
    for item in data[:-1].split(b"\0"):
        kind, name = item[:1].decode("latin-1"), item[1:]
        if kind not in _ENTRY_TYPES or name in (b"", b".", b"..") or b"/" in name:
            raise ProtocolError(f"list entry {item[:100]!r}")
        entries.append((kind, name))
    return entries


def _need_count(body: dict[str, Any], key: str, op: str) -> None:
    value = body.get(key)
    if not (isinstance(value, int) and _is_int(value) and value >= 0):
        raise ProtocolError(f"RESULT of {op}: {key} {value!r}")
