"""A proxied client's socket passed by the sandbox to the host (``SCM_RIGHTS``), checked before any use.

:func:`receive_socket` proves the descriptor is a connected loopback TCP socket before one byte is read
or written (else :class:`PassedSocketRefused`); :class:`PassedSocket` reads and writes it without
trusting its flags, which the sandbox's copy may change. See docs/network.md, section "The passed socket".
"""

from __future__ import annotations

import array
import contextlib
import ipaddress
import os
import select
import socket
import stat
import time

__all__ = ["PASSED_RULE", "PassedSocket", "PassedSocketRefused", "receive_socket", "wait_for"]

PASSED_RULE = "passed socket"
"""The rule of a connection refused because what the sandbox passed is not a loopback TCP client socket."""
#: The size of one descriptor in an ``SCM_RIGHTS`` message (a C int).
_FD_SIZE = array.array("i").itemsize
#: Room for one descriptor more than accepted, so a second one is seen (and closed), not silently cut.
_FD_ROOM = socket.CMSG_SPACE(2 * _FD_SIZE)


class PassedSocketRefused(Exception):
    """What the sandbox passed is not a connected loopback TCP socket; the message says what it was."""


def wait_for(fd: int, events: int, deadline: float | None) -> None:
    """Wait until ``fd`` is ready for ``events`` or has an error/hang-up; ``TimeoutError`` past ``deadline``.

    ``deadline`` is a ``time.monotonic`` value (None: no bound; a shutdown of the socket wakes it).
    """
    poller = select.poll()
    poller.register(fd, events)
    while True:
        if deadline is None:
            ms = -1
        else:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("timed out")
            ms = max(1, int(left * 1000))
        if poller.poll(ms):
            return


class PassedSocket:
    """A :class:`~.relay.ByteStream` over a socket the sandbox passed and may still hold (see the module).

    ``recv`` and ``sendall`` wait with ``poll`` for at most the time given to :meth:`settimeout` (None:
    until ready; a :meth:`shutdown` wakes them) and never block in the call itself, whatever the shared
    ``O_NONBLOCK`` says.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.socket = sock
        """The checked socket (for ``splice``: its flags are the sandbox's to change too)."""
        self._timeout: float | None = None

    def fileno(self) -> int:
        """The descriptor (-1 once closed)."""
        return self.socket.fileno()

    def settimeout(self, timeout: float | None, /) -> None:
        """How long each ``recv``/``sendall`` may wait (None: until ready); the socket's flags untouched."""
        self._timeout = timeout

    def _deadline(self) -> float | None:
        return None if self._timeout is None else time.monotonic() + self._timeout

    def recv(self, size: int, /) -> bytes:
        """Up to ``size`` bytes (``b""`` at end of stream); ``TimeoutError`` past the timeout."""
        deadline = self._deadline()
        while True:
            try:
                return self.socket.recv(size, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):  # nothing yet, or read away by the sandbox's copy
                wait_for(self.socket.fileno(), select.POLLIN, deadline)

    def sendall(self, data: bytes, /) -> None:
        """Send every byte of ``data``; ``TimeoutError`` when the sandbox takes none within the timeout."""
        deadline = self._deadline()
        view = memoryview(data)
        while view:
            try:
                view = view[self.socket.send(view, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL) :]
            except (BlockingIOError, InterruptedError):
                wait_for(self.socket.fileno(), select.POLLOUT, deadline)

    def shutdown(self, how: int, /) -> None:
        """Shut the socket down (for the sandbox's copy too: the connection is over); wakes a waiting call."""
        self.socket.shutdown(how)

    def close(self) -> None:
        """Close this process's descriptor."""
        self.socket.close()


def receive_socket(conn: socket.socket, timeout: float) -> PassedSocket:
    """The one client socket passed over ``conn`` within ``timeout`` seconds, checked; see the module.

    :class:`PassedSocketRefused` (every received descriptor closed) for anything else, including nothing
    within ``timeout`` and a connection that ends first. ``conn`` is this process's own Unix connection
    and is left open.
    """
    conn.settimeout(timeout)
    try:
        data, ancillary, flags, _ = conn.recvmsg(1, _FD_ROOM, socket.MSG_CMSG_CLOEXEC)
    except TimeoutError:
        raise PassedSocketRefused(f"no socket passed within {timeout:g} s") from None
    except OSError as error:
        why = f"the connection failed before a socket: {error.strerror or error}"
        raise PassedSocketRefused(why) from None
    fds: list[int] = []
    other = False
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            whole = len(payload) - len(payload) % _FD_SIZE
            fds.extend(array.array("i", payload[:whole]))
            other = other or whole != len(payload)
        else:
            other = True
    try:
        if not data:
            raise PassedSocketRefused("the connection ended before passing a socket")
        if flags & socket.MSG_CTRUNC or other or len(fds) != 1:
            raise PassedSocketRefused(
                f"exactly one descriptor must come with the byte; got {len(fds)}"
                + (" and a truncated or other control message" if flags & socket.MSG_CTRUNC or other else "")
            )
        return PassedSocket(_checked(fds.pop()))
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def _checked(fd: int) -> socket.socket:
    """``fd`` as a socket once it is a connected loopback TCP socket; else closed and refused."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError as error:
        os.close(fd)
        raise PassedSocketRefused(f"the passed descriptor cannot be examined: {error.strerror}") from None
    if not stat.S_ISSOCK(mode):
        os.close(fd)
        kind = "a pipe or FIFO" if stat.S_ISFIFO(mode) else "a file" if stat.S_ISREG(mode) else "not a socket"
        raise PassedSocketRefused(f"the passed descriptor is {kind}")
    sock = socket.socket(fileno=fd)  # owns fd from here: closed below on any refusal
    try:
        _check(sock)
    except PassedSocketRefused:
        sock.close()
        raise
    except OSError as error:
        sock.close()
        why = f"the passed socket cannot be examined: {error.strerror or error}"
        raise PassedSocketRefused(why) from None
    return sock


def _check(sock: socket.socket) -> None:
    option = sock.getsockopt
    domain = option(socket.SOL_SOCKET, socket.SO_DOMAIN)
    if domain not in (socket.AF_INET, socket.AF_INET6):
        raise PassedSocketRefused(f"the passed socket is not an internet socket (domain {domain})")
    if option(socket.SOL_SOCKET, socket.SO_TYPE) != socket.SOCK_STREAM:
        raise PassedSocketRefused("the passed socket is not a stream socket")
    if option(socket.SOL_SOCKET, socket.SO_PROTOCOL) != socket.IPPROTO_TCP:
        raise PassedSocketRefused("the passed socket is not TCP")
    if option(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        raise PassedSocketRefused("the passed socket is a listening socket")
    try:
        peer = sock.getpeername()
    except OSError:
        raise PassedSocketRefused("the passed socket is not connected") from None
    for what, address in (("peer", peer), ("local", sock.getsockname())):
        if not _loopback(str(address[0])):
            raise PassedSocketRefused(f"the passed socket's {what} address {address[0]} is not loopback")


def _loopback(host: str) -> bool:
    address = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback
