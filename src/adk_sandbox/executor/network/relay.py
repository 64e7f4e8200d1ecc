"""The host side of one proxied connection: read the request, decide, resolve, connect, check, pump.

:func:`relay` serves one connection the sandbox's proxy endpoint hands over as a duplex byte stream,
and records it in the session's log; ``on_connected`` gets a close handle for the live connection.
See docs/network.md, section "The relay and the log".
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, NoReturn, Protocol

from adk_sandbox.executor.network.addresses import (
    GetAddrInfo,
    IPAddress,
    IPNetwork,
    RefusedAddressError,
    ResolutionFailedError,
    resolve,
)
from adk_sandbox.executor.network.http_head import (
    HeadError,
    ProxyRequest,
    bad_gateway,
    bad_request,
    connection_established,
    forbidden,
    gateway_timeout,
    head_end,
    parse_head,
    request_timeout,
)
from adk_sandbox.executor.network.log import ConnectionEntry, ConnectionLog
from adk_sandbox.executor.network.passed_socket import PassedSocket, wait_for
from adk_sandbox.executor.network.policy import NetworkPolicy
from adk_sandbox.executor.network.tls_hello import server_name

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # intercept.py imports this module (ByteStream)
    from adk_sandbox.executor.network.intercept import Interceptor

__all__ = [
    "CHUNK",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_HEAD_TIMEOUT",
    "SPLICE_CHUNK",
    "TLS_ACCESS_DENIED",
    "ByteStream",
    "CloseHandle",
    "OnConnected",
    "relay",
]

CHUNK = 64 * 1024
"""The most bytes read at once per direction, and so held in flight."""
SPLICE_CHUNK = 1 << 20
"""The most bytes asked of one ``splice`` between two real sockets (in a pipe, never in Python)."""
SPLICE_PIPE = 256 << 10
"""The pipe of a spliced direction: the most bytes it moves per call and holds in the kernel."""
SENDER_GRACE = 30.0
"""Seconds a connection's second thread has to end once both sockets are shut down (it takes
microseconds); past it the sockets are left open rather than closed under it."""
DEFAULT_HEAD_TIMEOUT = 10.0
"""Seconds the sandbox has to send a whole request head (and, for CONNECT, its ClientHello)."""
DEFAULT_CONNECT_TIMEOUT = 10.0
"""Seconds to connect to each address of the server."""
TLS_ACCESS_DENIED = b"\x15\x03\x03\x00\x02\x02\x31"
"""A fatal TLS alert, ``access_denied``: what a client mid-handshake can read as "refused"."""


class ByteStream(Protocol):
    """A duplex byte stream to the sandbox's proxy endpoint (a socket has this shape).

    ``recv`` returns ``b""`` at end of stream and raises ``TimeoutError`` past the timeout set by
    ``settimeout``; ``close`` must wake a ``recv`` blocked in another thread.
    """

    def recv(self, size: int, /) -> bytes:
        """Up to ``size`` bytes; ``b""`` at end of stream."""
        ...

    def sendall(self, data: bytes, /) -> None:
        """Send every byte of ``data``."""
        ...

    def settimeout(self, timeout: float | None, /) -> None:
        """How long ``recv`` may wait (None: for ever)."""
        ...

    def close(self) -> None:
        """Close the stream, waking any blocked ``recv``."""
        ...


#: Ends one live connection from any thread; the argument says why (kept in the log entry's detail).
CloseHandle = Callable[[str], None]
#: Told of each connection once it is connected, before any byte is sent: host, port, its close handle.
OnConnected = Callable[[str, int, CloseHandle], None]


class _Refused(Exception):
    """Ends a relay before any byte reached a server: what to answer and what to log."""

    def __init__(self, answer: bytes, rule: str, detail: str) -> None:
        super().__init__(detail)
        self.answer = answer
        self.rule = rule
        self.detail = detail


class _Intercepted(Exception):
    """The intercepted exchange is over (header injection, :mod:`.intercept`): log it like a pumped one."""


@dataclass
class _Outcome:
    host: str = ""
    port: int = 0
    decision: Literal["allowed", "refused"] = "refused"
    rule: str = ""
    detail: str = ""
    up: int = 0
    down: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    in_use: bool = False
    """A pump thread did not end after both sockets were shut down: their descriptors are left open."""


def _read_until(
    stream: ByteStream, buffer: bytes, done: Callable[[bytes], bool], deadline: float, *, what: str
) -> bytes:
    """Read into ``buffer`` until ``done(buffer)``, within ``deadline`` (a ``time.monotonic`` value)."""
    while not done(buffer):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(what)
        stream.settimeout(remaining)
        chunk = stream.recv(CHUNK)
        if not chunk:
            raise EOFError(what)
        buffer += chunk
    return buffer


def _read_head(stream: ByteStream, timeout: float) -> tuple[ProxyRequest, bytes]:
    try:
        buffer = _read_until(
            stream, b"", lambda b: head_end(b) is not None, time.monotonic() + timeout, what="head"
        )
        end = head_end(buffer) or len(buffer)  # not None: that is when _read_until returns
        return parse_head(buffer[:end]), buffer[end:]
    except HeadError as error:
        raise _Refused(bad_request(str(error)), "bad request", str(error)) from None
    except TimeoutError:
        raise _Refused(
            request_timeout(timeout), "head timeout", f"no complete request head in {timeout:g} s"
        ) from None
    except EOFError:
        raise _Refused(b"", "closed", "the sandbox closed before sending a request head") from None


def _connect(
    request: ProxyRequest, addresses: tuple[IPAddress, ...], timeout: float
) -> tuple[socket.socket, IPAddress]:
    failures = []
    timed_out = True
    for address in addresses:
        try:
            return socket.create_connection((str(address), request.port), timeout=timeout), address
        except TimeoutError:
            failures.append(f"{address}: timed out after {timeout:g} s")
        except OSError as error:
            timed_out = False
            failures.append(f"{address}: {error.strerror or error}")
    why = f"{request.authority}: " + "; ".join(failures)
    if timed_out:
        raise _Refused(gateway_timeout(why), "connect timeout", why)
    raise _Refused(bad_gateway(why), "connect failed", why)


def _check_server_name(stream: ByteStream, request: ProxyRequest, early: bytes, timeout: float) -> bytes:
    """The ClientHello bytes, once their server name is the CONNECT host; else :class:`_Refused`."""

    def complete(buffer: bytes) -> bool:
        return server_name(buffer).kind != "need_more"

    try:
        hello = _read_until(stream, early, complete, time.monotonic() + timeout, what="hello")
    except TimeoutError:
        raise _Refused(b"", "hello timeout", f"no complete TLS ClientHello in {timeout:g} s") from None
    except EOFError:
        raise _Refused(b"", "closed", "the sandbox closed the tunnel before a TLS ClientHello") from None
    found = server_name(hello)
    if found.kind == "found" and found.name == request.host:
        return hello
    if found.kind == "found":
        why = f"the TLS server name is {found.name}, not the CONNECT host {request.host}"
        _deny_tls("sni mismatch", why)
    if found.kind == "absent":
        _deny_tls("sni missing", f"the TLS ClientHello names no server (CONNECT {request.authority})")
    _deny_tls("not tls", f"a CONNECT tunnel carries TLS only: {found.reason}")


def _deny_tls(rule: str, why: str) -> NoReturn:
    raise _Refused(TLS_ACCESS_DENIED, rule, why)


def _splice(source: socket.socket, target: socket.socket, counted: Callable[[int], None]) -> None:
    """Copy ``source`` to ``target`` until it ends, in the kernel (``splice`` through a pipe).

    For two real sockets (the server's, and the client's socket the sandbox passed or the bubblewrap
    endpoint's): the bytes never enter this process, which keeps one Python thread per direction from being
    the download's bottleneck. At most :data:`SPLICE_PIPE` bytes are in the pipe at once, so memory stays
    bounded as with ``recv``. A socket the sandbox passed shares its flags with the sandbox's copy, which may
    make it non-blocking (or give it a receive timeout): ``EAGAIN`` waits in ``poll`` and tries again; a
    shutdown by the connection's close handle wakes either wait.
    """
    read_end, write_end = os.pipe()
    # A pipe holds 64 KiB by default: each splice would move that much. A pipe of SPLICE_PIPE moves four
    # times as much per pair of calls (the calls were a fifth of the download's time here), and bounds what
    # a connection holds in this host's kernel: 2 directions x 256 connections x 256 KiB = 128 MiB at most.
    with contextlib.suppress(OSError):  # over /proc/sys/fs/pipe-max-size: the default pipe still works
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, SPLICE_PIPE)
    try:
        while moved := _spliced(source.fileno(), write_end, SPLICE_CHUNK, (source.fileno(), select.POLLIN)):
            while moved:
                sent = _spliced(read_end, target.fileno(), moved, (target.fileno(), select.POLLOUT))
                moved -= sent
                counted(sent)
    finally:
        os.close(read_end)
        os.close(write_end)


def _spliced(source: int, target: int, size: int, ready: tuple[int, int]) -> int:
    """One ``splice``; on ``EAGAIN`` (a non-blocking socket) wait until ``ready`` (its fd, events), again."""
    while True:
        try:
            return os.splice(source, target, size)
        except (BlockingIOError, InterruptedError):
            wait_for(*ready, None)


def _spliceable(stream: ByteStream) -> socket.socket | None:
    if isinstance(stream, PassedSocket):
        return stream.socket
    return stream if isinstance(stream, socket.socket) else None


def _copy(source: ByteStream, target: ByteStream, counted: Callable[[int], None]) -> None:
    """Copy ``source`` to ``target`` until it ends: by ``splice`` between two real sockets, else by chunks."""
    ends = _spliceable(source), _spliceable(target)
    if ends[0] is not None and ends[1] is not None and hasattr(os, "splice"):
        _splice(ends[0], ends[1], counted)
        return
    while data := source.recv(CHUNK):
        target.sendall(data)
        counted(len(data))


def _pump(stream: ByteStream, upstream: socket.socket, outcome: _Outcome) -> None:
    stream.settimeout(None)
    upstream.settimeout(None)

    def count_up(size: int) -> None:
        with outcome.lock:
            outcome.up += size

    def count_down(size: int) -> None:
        with outcome.lock:
            outcome.down += size

    def up() -> None:
        with contextlib.suppress(OSError):
            _copy(stream, upstream, count_up)
        # The sandbox is done sending; the server may still answer (a half-close, passed on).
        with contextlib.suppress(OSError):
            upstream.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=up, name="network-relay-up", daemon=True)
    sender.start()
    try:
        _copy(upstream, stream, count_down)
    except OSError as error:
        outcome.detail += f"; ended by {error.strerror or type(error).__name__}"
    finally:
        # Wake the other direction and wait for it *before* anything is closed: a splice holds descriptor
        # numbers, and a number closed under it is soon the next connection's (the lowest free one), so its
        # next splice would move this connection's bytes into another's -- another session's, even.
        _wake(stream, upstream)
        sender.join(timeout=SENDER_GRACE)
        if sender.is_alive():
            outcome.in_use = True
            outcome.detail += "; a relay thread did not end: its sockets are left open"
            log.warning(
                "a network relay thread did not end %g s after shutdown; its sockets stay open", SENDER_GRACE
            )


def _wake(stream: ByteStream, upstream: socket.socket | None = None) -> None:
    """End the connection for every thread using it, closing no descriptor (that is the relay's, after).

    A socket is shut down (its ``close`` would not wake a ``recv`` or ``poll`` of another thread, and would
    free its number for reuse under it); a stream without ``shutdown`` (a channel's) is closed, which wakes
    its readers and frees no descriptor.
    """
    if upstream is not None:
        with contextlib.suppress(OSError):
            upstream.shutdown(socket.SHUT_RDWR)
    shutdown = getattr(stream, "shutdown", None)
    with contextlib.suppress(OSError):
        if shutdown is not None:
            shutdown(socket.SHUT_RDWR)
        else:
            stream.close()


def _close(stream: ByteStream) -> None:
    """Wake, then close ``stream``: only once no other thread uses it (see :func:`_pump`)."""
    _wake(stream)
    with contextlib.suppress(OSError):
        stream.close()


# -- header injection (intercept.py): TLS terminated on this side for a host with headers ---------------
def _intercept(
    intercept: Interceptor | None,
    stream: ByteStream,
    upstream: socket.socket,
    request: ProxyRequest,
    hello: bytes,
    *,
    policy: NetworkPolicy,
    outcome: _Outcome,
    timeout: float,
) -> None:
    """Serve a CONNECT tunnel to a host with headers through ``intercept``; then raise :class:`_Intercepted`.

    Returns (the tunnel is pumped untouched) for plain HTTP, a host without headers or no interceptor.
    """
    headers = policy.headers_for(request.host) if request.is_connect else {}
    if intercept is None or not headers:
        return
    outcome.decision = "allowed"
    result = intercept.serve(
        stream, upstream, host=request.host, port=request.port, hello=hello, headers=headers, timeout=timeout
    )
    outcome.up, outcome.down = result.up, result.down
    outcome.detail += f"; {result.detail}"
    if result.rule is not None:
        outcome.decision, outcome.rule = "refused", result.rule
    raise _Intercepted


def _refuse_uninjectable(request: ProxyRequest, policy: NetworkPolicy, intercept: Interceptor | None) -> None:
    """Refuse, before connecting, a request to a host with ``headers`` that would go without them.

    The headers are credentials the user asked for: sent without them the request would reach the server
    unauthenticated, a setting silently not honoured. Plain HTTP never carries them (clear text), and a
    relay without an interceptor cannot add them.
    """
    if not policy.headers_for(request.host):
        return
    if not request.is_connect:
        why = f"{request.host} has headers to inject, which are sent only over HTTPS: use https://"
    elif intercept is None:
        why = f"{request.host} has headers to inject, and this sandbox's proxy cannot inject them"
    else:
        return
    message = f"the sandbox's network policy refused {request.authority}: {why}"
    raise _Refused(forbidden(message, "headers"), "headers", why)


# -- end of header injection ---------------------------------------------------------------------------


def _close_handle(stream: ByteStream, upstream: socket.socket, outcome: _Outcome) -> CloseHandle:
    def close(why: str) -> None:
        with outcome.lock:
            outcome.detail += f"; closed: {why}"
        # Shut down, never closed from here: the relay's threads may still hold the descriptors (see
        # _pump); the relay closes them once it has ended.
        _wake(stream, upstream)

    return close


def _decide(  # noqa: PLR0917 - the relay's own state, passed on
    request: ProxyRequest,
    policy: NetworkPolicy,
    outcome: _Outcome,
    intercept: Interceptor | None,
    getaddrinfo: GetAddrInfo,
    extra_refused: frozenset[IPAddress | IPNetwork],
) -> tuple[IPAddress, ...]:
    """The checked addresses to try for ``request``, or :class:`_Refused` with the answer saying why."""
    decision = policy.decide(request.host, request.port)
    outcome.rule = decision.rule
    if not decision.allowed:
        raise _Refused(forbidden(decision.message, decision.rule), decision.rule, decision.message)
    _refuse_uninjectable(request, policy, intercept)
    try:
        return resolve(request.host, request.port, policy, getaddrinfo, extra_refused=extra_refused)
    except RefusedAddressError as error:
        message = f"the sandbox's network policy refused {request.authority}: {error}"
        raise _Refused(forbidden(message, "address"), "address", str(error)) from None
    except ResolutionFailedError as error:
        raise _Refused(bad_gateway(str(error)), "resolve failed", str(error)) from None


def relay(
    stream: ByteStream,
    policy: NetworkPolicy,
    log: ConnectionLog,
    *,
    extra_refused: frozenset[IPAddress | IPNetwork] = frozenset(),
    getaddrinfo: GetAddrInfo = socket.getaddrinfo,
    head_timeout: float = DEFAULT_HEAD_TIMEOUT,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    intercept: Interceptor | None = None,
    on_connected: OnConnected | None = None,
) -> ConnectionEntry:
    """Serve one connection from the sandbox's proxy endpoint to its end (docs/network.md, "The relay").

    Blocks until the connection is over, closes ``stream``, records the entry in ``log`` and returns it.
    ``extra_refused`` are the engine's own addresses; ``getaddrinfo`` is the resolver (tests pass a fake);
    ``on_connected`` is given the connection's close handle (docs/network.md, "The relay and the log").
    ``intercept`` (the session's :class:`~.intercept.Interceptor`) serves CONNECT tunnels to hosts with
    ``headers``: TLS terminated, headers injected; without one, a request to such a host is refused.
    """
    started = time.time()
    outcome = _Outcome()
    upstream: socket.socket | None = None
    try:
        request, early = _read_head(stream, head_timeout)
        outcome.host, outcome.port = request.host, request.port
        addresses = _decide(request, policy, outcome, intercept, getaddrinfo, extra_refused)
        upstream, address = _connect(request, addresses, connect_timeout)
        outcome.detail = f"connected to {address}"
        if on_connected is not None:
            on_connected(request.host, request.port, _close_handle(stream, upstream, outcome))
        if request.is_connect:
            stream.sendall(connection_established())
            first = _check_server_name(stream, request, early, head_timeout)
        else:
            first = request.forward_head() + early
        # A host with headers: TLS terminated here, headers injected (intercept.py); raises _Intercepted.
        _intercept(
            intercept, stream, upstream, request, first, policy=policy, outcome=outcome, timeout=head_timeout
        )
        upstream.sendall(first)
        outcome.decision = "allowed"
        outcome.up = len(first)
        _pump(stream, upstream, outcome)
    except _Intercepted:
        pass
    except _Refused as refused:
        outcome.decision, outcome.rule, outcome.detail = "refused", refused.rule, refused.detail
        if refused.answer:
            with contextlib.suppress(OSError):
                stream.sendall(refused.answer)
    except OSError as error:
        # The sandbox's side or the server failed mid-way: what was delivered is in the byte counts.
        outcome.detail += f"; ended by {error.strerror or type(error).__name__}"
        outcome.rule = outcome.rule or "closed"
    finally:
        if not outcome.in_use:
            if upstream is not None:
                upstream.close()
            _close(stream)
    entry = ConnectionEntry(
        time=started,
        host=outcome.host,
        port=outcome.port,
        decision=outcome.decision,
        rule=outcome.rule,
        detail=outcome.detail.removeprefix("; "),
        bytes_up=outcome.up,
        bytes_down=outcome.down,
    )
    log.record(entry)
    return entry
