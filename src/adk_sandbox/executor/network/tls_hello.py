"""The server name (SNI) of a TLS ClientHello, read from the first bytes of a tunnel, standard library only.

:func:`server_name` reads at most :data:`MAX_HELLO` bytes and says which name the client asked for, or
why the bytes are "not TLS" (strict: they are hostile; it never raises), so a CONNECT cannot carry a
handshake for another name. See docs/network.md, section "TLS server name".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["MAX_HELLO", "ServerName", "server_name"]

MAX_HELLO = 16 * 1024
"""The most bytes read for a ClientHello (records and their headers); a larger one is refused."""

_RECORD_HEADER = 5
_HANDSHAKE = 22
_CLIENT_HELLO = 1
_SERVER_NAME_EXTENSION = 0
_HOST_NAME = 0
_MAX_RECORD = 1 << 14
_HOST = re.compile(r"[A-Za-z0-9._-]{1,253}")


@dataclass(frozen=True)
class ServerName:
    """What the start of a stream says about the TLS server name asked for."""

    kind: Literal["found", "absent", "not_tls", "need_more"]
    """``found``: a ClientHello naming :attr:`name`; ``absent``: a ClientHello without a name;
    ``not_tls``: not a ClientHello this proxy accepts (:attr:`reason`); ``need_more``: read on."""
    name: str = ""
    """The host name asked for, lowercase, trailing dot dropped (``found`` only)."""
    needed: int = 0
    """For ``need_more``: how many bytes in all the stream must hold before asking again."""
    reason: str = ""
    """For ``not_tls``: what was wrong, a phrase for a log."""


class _Short(Exception):
    """A length runs past the ClientHello's end: malformed, since the message is complete."""


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise _Short
        chunk = self.data[self.at : self.at + n]
        self.at += n
        return chunk

    def number(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def vector(self, length_bytes: int) -> bytes:
        return self.take(self.number(length_bytes))

    @property
    def left(self) -> int:
        return len(self.data) - self.at


def _not_tls(reason: str) -> ServerName:
    return ServerName(kind="not_tls", reason=reason)


def _handshake_bytes(data: bytes) -> ServerName | bytes:  # noqa: PLR0911 - one verdict per malformation
    """The ClientHello message (header included) from its records, or a verdict (need more, not TLS)."""
    message = b""
    at = 0
    while True:
        if len(data) < at + _RECORD_HEADER:
            return ServerName(kind="need_more", needed=at + _RECORD_HEADER)
        kind, major, minor, length = (
            data[at],
            data[at + 1],
            data[at + 2],
            int.from_bytes(data[at + 3 : at + 5]),
        )
        if kind != _HANDSHAKE:
            return _not_tls(
                "the stream does not start with a TLS handshake record"
                if at == 0
                else "a record of another type interrupts the ClientHello"
            )
        if major != 3 or minor > 4:
            return _not_tls(f"TLS record version {major}.{minor} is unknown")
        if not 1 <= length <= _MAX_RECORD:
            return _not_tls(f"a TLS record length of {length} is invalid")
        end = at + _RECORD_HEADER + length
        if end > MAX_HELLO:
            return _not_tls(f"the ClientHello is longer than the {MAX_HELLO} bytes this proxy reads")
        if len(data) < end:
            return ServerName(kind="need_more", needed=end)
        message += data[at + _RECORD_HEADER : end]
        at = end
        if len(message) >= 4:
            if message[0] != _CLIENT_HELLO:
                return _not_tls("the first handshake message is not a ClientHello")
            total = 4 + int.from_bytes(message[1:4])
            if len(message) > total:
                return _not_tls("the ClientHello's records hold more than the message")
            if len(message) == total:
                return message


def _host_name(raw: bytes) -> str | None:
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        return None
    if not _HOST.fullmatch(text):
        return None
    text = text.lower()
    return text[:-1] if text.endswith(".") and len(text) > 1 else text


def _parse_hello(message: bytes) -> ServerName:  # noqa: PLR0911, PLR0912 - one verdict per malformation
    reader = _Reader(message[4:])
    reader.take(2)  # legacy_version: a TLS 1.3 ClientHello says 1.2 here, so it decides nothing
    reader.take(32)  # random
    session_id = reader.vector(1)
    if len(session_id) > 32:
        return _not_tls("the ClientHello's session id is longer than 32 bytes")
    suites = reader.vector(2)
    if not suites or len(suites) % 2:
        return _not_tls("the ClientHello's cipher suite list is malformed")
    if not reader.vector(1):
        return _not_tls("the ClientHello lists no compression method")
    if reader.left == 0:
        return ServerName(kind="absent")  # an old ClientHello with no extensions at all
    extensions = _Reader(reader.vector(2))
    if reader.left:
        return _not_tls("bytes follow the ClientHello's extensions")
    seen: set[int] = set()
    found: ServerName = ServerName(kind="absent")
    while extensions.left:
        kind = extensions.number(2)
        body = extensions.vector(2)
        if kind in seen:
            return _not_tls(f"the ClientHello repeats extension {kind}")
        seen.add(kind)
        if kind != _SERVER_NAME_EXTENSION:
            continue
        names = _Reader(body)
        entries = _Reader(names.vector(2))
        if names.left:
            return _not_tls("bytes follow the server_name list")
        hosts = []
        while entries.left:
            name_type = entries.number(1)
            value = entries.vector(2)
            if name_type == _HOST_NAME:
                hosts.append(value)
        if len(hosts) > 1:
            return _not_tls("the ClientHello names more than one server")
        if hosts:
            host = _host_name(hosts[0])
            if host is None:
                return _not_tls("the ClientHello's server name is not a plain ASCII host name")
            found = ServerName(kind="found", name=host)
    return found


def server_name(data: bytes) -> ServerName:
    """What the first bytes of a stream say about the TLS server name; see :class:`ServerName`.

    Call again with more bytes (all of them, from the start) while the answer is ``need_more``; its
    ``needed`` never exceeds :data:`MAX_HELLO`.
    """
    message = _handshake_bytes(data)
    if isinstance(message, ServerName):
        return message
    try:
        return _parse_hello(message)
    except _Short:
        return _not_tls("a length in the ClientHello runs past its end")
