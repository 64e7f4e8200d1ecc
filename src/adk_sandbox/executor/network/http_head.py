"""The head of a request to the sandbox's proxy, parsed strictly, and the short answers the proxy gives.

:func:`parse_head` accepts ``CONNECT host:port`` and absolute-form ``http://`` requests
(:class:`ProxyRequest`) and raises :class:`HeadError` for anything else; :func:`head_end` bounds the read
(:data:`MAX_HEAD`, :data:`MAX_LINE`, :data:`MAX_HEADER_LINES`); the rest build the proxy's answers.
See docs/network.md, section "The request head".
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "HOP_BY_HOP",
    "MAX_HEAD",
    "MAX_HEADER_LINES",
    "MAX_LINE",
    "HeadError",
    "ProxyRequest",
    "bad_gateway",
    "bad_request",
    "connection_established",
    "forbidden",
    "gateway_timeout",
    "head_end",
    "parse_head",
    "request_timeout",
    "response",
]

MAX_HEAD = 16 * 1024
"""The most bytes a request head may take, its final blank line included."""
MAX_LINE = 8 * 1024
"""The most bytes in one line of the head (the request line or a header)."""
MAX_HEADER_LINES = 100
"""The most header lines after the request line."""

_TERMINATOR = b"\r\n\r\n"
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# A host in an authority: a registered name's characters, or an IPv6 literal in brackets. Percent-encoding
# and anything else a URL parser might decode differently from the policy are refused here.
_REG_NAME = re.compile(r"[A-Za-z0-9._-]+")
_IPV6_LITERAL = re.compile(r"\[[0-9A-Fa-f:.]+\]")
_PORT = re.compile(r"[0-9]{1,5}")
_TARGET = re.compile(r"[\x21-\x7e]+")
_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")
#: The headers of one hop (and the proxy's own), never forwarded to the server (RFC 9110, 7.6.1).
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "upgrade",
    }
)


class HeadError(ValueError):
    """The request head cannot be served; the message says why (it becomes the body of a 400)."""


@dataclass(frozen=True)
class ProxyRequest:
    """One parsed request to the proxy."""

    method: str
    """``CONNECT``, ``GET``, ``POST``, ... as sent (methods are case-sensitive)."""
    host: str
    """The host asked for, lowercase, trailing dot dropped; an IPv6 literal without its brackets."""
    port: int
    """The port asked for (80 when an ``http://`` URI names none)."""
    target: str
    """The request target as sent (``host:port`` for CONNECT, the absolute URI otherwise)."""
    version: str
    """``HTTP/1.1`` or ``HTTP/1.0``."""
    headers: tuple[tuple[str, str], ...]
    """Every header as sent, in order (names as written)."""
    path: str
    """For plain HTTP, the origin-form target (``/path?query``); empty for CONNECT."""

    @property
    def is_connect(self) -> bool:
        """A CONNECT (a tunnel, TLS expected) rather than a plain HTTP request."""
        return self.method == "CONNECT"

    @property
    def authority(self) -> str:
        """``host:port`` as the policy and the log show it (IPv6 in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def forward_head(self, extra: Mapping[str, str] | None = None) -> bytes:
        """The head to send the server for a plain HTTP request: origin form, hop-by-hop headers gone.

        ``extra`` headers (validated by the policy) replace any the client sent under the same names.
        """
        if self.is_connect:
            raise HeadError("a CONNECT request is not forwarded as a head; it opens a tunnel")
        extra = dict(extra or {})
        named_by_connection = {
            token.strip().lower()
            for name, value in self.headers
            if name.lower() == "connection"
            for token in value.split(",")
        }
        drop = HOP_BY_HOP | {"host"} | named_by_connection | {name.lower() for name in extra}
        host = f"[{self.host}]" if ":" in self.host else self.host
        host_value = host if self.port == 80 else f"{host}:{self.port}"
        lines = [f"{self.method} {self.path} {self.version}", f"Host: {host_value}"]
        lines += [f"{name}: {value}" for name, value in self.headers if name.lower() not in drop]
        lines += [f"{name}: {value}" for name, value in extra.items()]
        lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def head_end(buffer: bytes) -> int | None:
    """Where the head in ``buffer`` ends (the index just past its blank line), or None to read more.

    Raises :class:`HeadError` once ``buffer`` holds :data:`MAX_HEAD` bytes without the end of a head, or a
    line longer than :data:`MAX_LINE`: the reader stops buffering there.
    """
    end = buffer.find(_TERMINATOR)
    if end != -1:
        if end + len(_TERMINATOR) > MAX_HEAD:
            raise HeadError(f"the request head is longer than {MAX_HEAD} bytes")
        return end + len(_TERMINATOR)
    if len(buffer) >= MAX_HEAD:
        raise HeadError(f"the request head is longer than {MAX_HEAD} bytes")
    last_line = buffer[buffer.rfind(b"\n") + 1 :]
    if len(last_line) > MAX_LINE:
        raise HeadError(f"a line of the request head is longer than {MAX_LINE} bytes")
    return None


def _port(text: str, where: str) -> int:
    if not _PORT.fullmatch(text) or not 1 <= int(text) <= 65535:
        raise HeadError(f"{where}: the port {text!r} is not a number from 1 to 65535")
    return int(text)


def parse_authority(text: str, *, default_port: int | None, where: str) -> tuple[str, int]:
    """``host[:port]`` -> (host, port): host lowercase, trailing dot dropped, IPv6 without brackets.

    ``default_port`` None means the port is required (CONNECT). Raises :class:`HeadError`.
    """
    if "@" in text:
        raise HeadError(f"{where}: user info ('@') in {text!r} is not accepted")
    if text.startswith("["):
        close = text.find("]")
        literal, rest = text[: close + 1], text[close + 1 :]
        if close == -1 or not _IPV6_LITERAL.fullmatch(literal):
            raise HeadError(f"{where}: {text!r} is not a valid bracketed IPv6 address")
        try:
            host = str(ipaddress.IPv6Address(literal[1:-1]))
        except ValueError:
            raise HeadError(f"{where}: {literal!r} is not a valid IPv6 address") from None
    else:
        name, colon, port_text = text.partition(":")
        host, rest = name, colon + port_text
        if not _REG_NAME.fullmatch(host):
            raise HeadError(f"{where}: {text!r} does not name a host (letters, digits, '.', '-' only)")
        host = host.lower()
        if host.endswith(".") and len(host) > 1:
            host = host[:-1]
    if rest:
        if not rest.startswith(":"):
            raise HeadError(f"{where}: unexpected {rest!r} after the host in {text!r}")
        return host, _port(rest[1:], where)
    if default_port is None:
        raise HeadError(f"{where}: {text!r} has no port; CONNECT needs host:port")
    return host, default_port


def _lines(head: bytes) -> list[str]:
    if not head.endswith(_TERMINATOR):
        raise HeadError("the request head does not end with an empty line (CRLF CRLF)")
    if len(head) > MAX_HEAD:
        raise HeadError(f"the request head is longer than {MAX_HEAD} bytes")
    if b"\0" in head:
        raise HeadError("the request head contains a NUL byte")
    lines = head[: -len(_TERMINATOR)].split(b"\r\n")
    for line in lines:
        if b"\r" in line or b"\n" in line:
            raise HeadError("the request head has a bare CR or LF; lines must end with CRLF")
        if len(line) > MAX_LINE:
            raise HeadError(f"a line of the request head is longer than {MAX_LINE} bytes")
    if len(lines) - 1 > MAX_HEADER_LINES:
        raise HeadError(f"the request has more than {MAX_HEADER_LINES} header lines")
    # latin-1 maps every byte to one character, so the checks below see each byte as sent.
    return [line.decode("latin-1") for line in lines]


def _headers(lines: list[str]) -> tuple[tuple[str, str], ...]:
    headers = []
    for line in lines:
        if line[:1] in (" ", "\t"):
            raise HeadError("folded header lines (starting with a space or tab) are not accepted")
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.fullmatch(name):
            raise HeadError(f"malformed header line {line[:80]!r}")
        value = value.strip(" \t")
        if not _VALUE.fullmatch(value):
            raise HeadError(f"the header {name!r} has a control character in its value")
        headers.append((name, value))
    return tuple(headers)


def _check_framing(headers: tuple[tuple[str, str], ...]) -> None:
    lengths = {value for name, value in headers if name.lower() == "content-length"}
    chunked = any(name.lower() == "transfer-encoding" for name, _ in headers)
    if lengths and chunked:
        raise HeadError("Content-Length and Transfer-Encoding together are not accepted")
    if len(lengths) > 1:
        raise HeadError("several different Content-Length headers are not accepted")
    if lengths and not next(iter(lengths)).isdigit():
        raise HeadError("Content-Length is not a number")


def _absolute_uri(method: str, target: str) -> tuple[str, int, str]:
    scheme, sep, rest = target.partition("://")
    if not sep:
        raise HeadError(
            f"{method} {target[:80]} is not a proxy request: a proxy needs the absolute URI "
            "(http://host/path); for https use CONNECT"
        )
    if scheme.lower() != "http":
        raise HeadError(f"the scheme {scheme[:20]!r} is not served as a plain request; for https use CONNECT")
    cut = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i != -1), default=len(rest))
    authority, path = rest[:cut], rest[cut:]
    path = path.partition("#")[0]  # a fragment is the client's business, never sent to a server
    if not path.startswith("/"):
        path = "/" + path
    host, port = parse_authority(authority, default_port=80, where="URI")
    return host, port, path


def parse_head(head: bytes) -> ProxyRequest:
    """Parse one request head (up to and including its blank line, as :func:`head_end` cut it).

    Raises :class:`HeadError`, and nothing else, for anything this proxy does not serve.
    """
    lines = _lines(head)
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise HeadError(f"malformed request line {lines[0][:80]!r}: expected 'METHOD target HTTP/1.1'")
    method, target, version = parts
    if not _TOKEN.fullmatch(method):
        raise HeadError(f"malformed method {method[:40]!r}")
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise HeadError(f"unsupported version {version[:40]!r}: this proxy speaks HTTP/1.1 and HTTP/1.0")
    if not _TARGET.fullmatch(target):
        raise HeadError("the request target contains a control or non-ASCII character")
    headers = _headers(lines[1:])
    hosts = [value for name, value in headers if name.lower() == "host"]
    if len(hosts) > 1:
        raise HeadError("several Host headers are not accepted")
    _check_framing(headers)
    if method == "CONNECT":
        host, port = parse_authority(target, default_port=None, where="CONNECT")
        path = ""
    else:
        host, port, path = _absolute_uri(method, target)
    if hosts:
        # A Host without a port means the scheme's default for plain HTTP; CONNECT has no scheme, and
        # clients send either 'Host: name:443' or just the name, so a portless Host there names its port.
        header = parse_authority(hosts[0], default_port=port if method == "CONNECT" else 80, where="Host")
        if header != (host, port):
            raise HeadError(
                f"the Host header names {hosts[0][:80]!r} but the request is for {target[:80]!r}; "
                "they must agree"
            )
    return ProxyRequest(
        method=method, host=host, port=port, target=target, version=version, headers=headers, path=path
    )


def response(status: int, reason: str, body: str = "") -> bytes:
    """A complete short answer, closing the connection; ``body`` plain UTF-8 text."""
    data = (body + "\n").encode("utf-8") if body else b""
    head = f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\n"
    if data:
        head += "Content-Type: text/plain; charset=utf-8\r\n"
    head += f"Content-Length: {len(data)}\r\n\r\n"
    return head.encode("ascii") + data


def connection_established() -> bytes:
    """The answer to an allowed CONNECT: the tunnel is open."""
    return b"HTTP/1.1 200 Connection established\r\n\r\n"


def bad_request(why: str) -> bytes:
    """400: the request head could not be served (``why`` from :class:`HeadError`)."""
    return response(400, "Bad Request", f"the sandbox's network proxy could not serve this request: {why}")


def forbidden(message: str, rule: str) -> bytes:
    """403: the policy refused; the body gives the message and the rule that refused."""
    return response(403, "Forbidden", f"{message}\nrule: {rule}")


def bad_gateway(why: str) -> bytes:
    """502: the name did not resolve or the server could not be connected to."""
    return response(502, "Bad Gateway", f"the sandbox's network proxy could not connect: {why}")


def gateway_timeout(why: str) -> bytes:
    """504: connecting to the server timed out."""
    return response(504, "Gateway Timeout", f"the sandbox's network proxy timed out: {why}")


def request_timeout(seconds: float) -> bytes:
    """408: the request head did not arrive in time."""
    return response(
        408, "Request Timeout", f"the sandbox's network proxy got no complete request head in {seconds:g} s"
    )
