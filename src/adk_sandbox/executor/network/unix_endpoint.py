"""The host side of a network policy for host processes: a Unix socket the sandbox's forwarder connects to.

:class:`UnixEndpoint` receives each socket the in-sandbox forwarder (:mod:`.inside_forward`) passes and
serves it with :func:`~.relay.relay`; :class:`CommandEgress` is one command's share (directory, listener,
forwarder command line); :class:`SessionSocket` is a Docker session's direct path, opened by a token.
See docs/network.md, sections "Host processes under bubblewrap" and "The direct path".
"""

from __future__ import annotations

import contextlib
import hmac
import importlib.resources
import logging
import os
import secrets
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING

from adk_sandbox.executor.network.addresses import IPAddress, IPNetwork
from adk_sandbox.executor.network.log import ConnectionEntry, ConnectionLog
from adk_sandbox.executor.network.passed_socket import (
    PASSED_RULE,
    PassedSocket,
    PassedSocketRefused,
    receive_socket,
)
from adk_sandbox.executor.network.policy import NetworkPolicy
from adk_sandbox.executor.network.relay import DEFAULT_HEAD_TIMEOUT, CloseHandle, relay

if TYPE_CHECKING:
    from adk_sandbox.executor.network.intercept import Interceptor

__all__ = [
    "FORWARDER_NAME",
    "MAX_CONNECTIONS",
    "OVER_LIMIT_RULE",
    "PASSED_RULE",
    "SOCKET_NAME",
    "TOKEN_RULE",
    "TRUST_NAME",
    "CommandEgress",
    "SessionSocket",
    "UnixEndpoint",
    "forwarder_source",
]

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 256
"""The most connections served at once per endpoint (as the agent's bound, ``channel/frames.py``)."""
OVER_LIMIT_RULE = "connection limit"
"""The rule of the one log entry that counts the connections closed over :data:`MAX_CONNECTIONS`."""
SOCKET_NAME = "egress.sock"
"""The Unix socket's name in the command's directory."""
FORWARDER_NAME = "forward.py"
"""The forwarder's source (:mod:`.inside_forward`) in the command's directory."""
TRUST_NAME = "ca.pem"
"""The trust bundle (system certificates, then the interceptor's CA) in the command's directory."""
TOKEN_RULE = "unix token"  # noqa: S105 - a log rule's name, not a secret
"""The rule of a connection to a session's socket refused for not opening with the session's token."""
#: How long :meth:`UnixEndpoint.close` waits for the relays it ended to record their entries.
_CLOSE_WAIT_SECONDS = 5.0
#: The most bytes of the host's system trust bundle read (to put the interceptor's CA after it).
_BUNDLE_LIMIT = 8 << 20
#: The longest path a Unix socket may be bound at (``sun_path`` is 108 bytes with its terminating NUL).
_SUN_PATH_MAX = 107


def forwarder_source() -> bytes:
    """The source of :mod:`.inside_forward`, as the sandbox's Python runs it."""
    return (
        importlib.resources.files(__package__ or "adk_sandbox.executor.network")
        .joinpath("inside_forward.py")
        .read_bytes()
    )


class _BoundedListener:
    """A listening Unix socket whose connections are each served in a thread, at most ``max_connections``.

    One thread accepts; one more connection than the bound is closed at once and counted (the count is
    logged once, when the listener stops, under rule :data:`OVER_LIMIT_RULE`). Subclasses make the bound
    listener and serve a connection (:meth:`_serve`, which ends with :meth:`_served`).
    """

    def __init__(
        self, listener: socket.socket, log: ConnectionLog, max_connections: int, *, names: tuple[str, str]
    ) -> None:
        self._listener = listener
        self._log = log
        self._max = max_connections
        self._handler_name = names[1]
        self._lock = threading.Lock()
        self._closed = False
        #: The connections being served, each with what ends its relay once it has one.
        self._live: dict[socket.socket, CloseHandle | None] = {}
        #: The client socket each connection passed, once received and checked (what a stop shuts down).
        self._passed: dict[socket.socket, PassedSocket] = {}
        self._handlers: set[threading.Thread] = set()
        self._turned_away = 0
        self._acceptor = threading.Thread(target=self._accept, name=names[0], daemon=True)
        self._acceptor.start()

    @property
    def live(self) -> int:
        """How many connections are being served now."""
        with self._lock:
            return len(self._live)

    @property
    def turned_away(self) -> int:
        """How many connections were closed at once for being over the bound."""
        with self._lock:
            return self._turned_away

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                with self._lock:
                    if self._closed:
                        return
                time.sleep(0.05)  # e.g. out of descriptors for a moment
                continue
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                if len(self._live) >= self._max:
                    self._turned_away += 1
                    conn.close()
                    continue
                self._live[conn] = None
            handler = threading.Thread(target=self._serve, args=(conn,), name=self._handler_name, daemon=True)
            with self._lock:
                self._handlers.add(handler)
            try:
                handler.start()
            except RuntimeError:  # no thread to be had: closed like one over the bound
                with self._lock:
                    self._handlers.discard(handler)
                    self._live.pop(conn, None)
                    self._turned_away += 1
                conn.close()

    def _serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def _served(self, conn: socket.socket) -> None:
        """Forget ``conn`` and its thread (the last step of :meth:`_serve`)."""
        with self._lock:
            self._live.pop(conn, None)
            self._passed.pop(conn, None)
            self._handlers.discard(threading.current_thread())

    def _receive(self, conn: socket.socket, timeout: float) -> PassedSocket | None:
        """The client socket passed over ``conn`` (:func:`.passed_socket.receive_socket`); closes ``conn``.

        None when refused: nothing is relayed, and the refusal is logged once (rule :data:`PASSED_RULE`)
        and in the log of this module. The socket is registered first, so :meth:`_stop` shuts it down.
        """
        started = time.time()
        try:
            passed = receive_socket(conn, timeout)
        except PassedSocketRefused as refused:
            log.warning("a connection to the egress socket was refused: %s", refused)
            self._log.record(
                ConnectionEntry(
                    time=started, host="", port=0, decision="refused", rule=PASSED_RULE, detail=str(refused)
                )
            )
            return None
        finally:
            conn.close()
        with self._lock:
            if not self._closed:
                self._passed[conn] = passed
                return passed
        passed.close()  # stopped meanwhile: served by no one
        return None

    def _stop(self, why: str) -> bool:
        """Stop listening and end every live connection (``why`` in its entry); False if stopped already."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            live = list(self._live.items())
            passed = dict(self._passed)
            handlers = list(self._handlers)
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        # Closed once the acceptor has ended: a number freed under a thread about to accept on it could be
        # the next session's listener, whose connections it would then serve under this session's policy.
        self._acceptor.join(timeout=_CLOSE_WAIT_SECONDS)
        if not self._acceptor.is_alive():
            self._listener.close()
        for conn, close in live:
            if close is not None:
                close(why)
            else:  # still reading its head, or deciding: a shutdown wakes its wait in the other thread
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    if conn in passed:
                        passed[conn].shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + _CLOSE_WAIT_SECONDS
        for handler in handlers:
            handler.join(timeout=max(0.0, deadline - time.monotonic()))
        if self._turned_away:
            said = f"{self._turned_away} connections closed at once: more than {self._max} open at a time"
            self._log.record(
                ConnectionEntry(
                    time=time.time(), host="", port=0, decision="refused", rule=OVER_LIMIT_RULE, detail=said
                )
            )
        return True


class UnixEndpoint(_BoundedListener):
    """A Unix socket listener on the host serving each connection with :func:`~.relay.relay`; thread-safe.

    Listens at ``path`` from construction; one thread accepts, and each connection is served in a thread
    of its own, at most ``max_connections`` at once (one more is closed at once and counted; the count is
    logged once, at :meth:`close`, under rule :data:`OVER_LIMIT_RULE`). :meth:`close` stops the listener
    and ends every live connection.
    """

    def __init__(
        self,
        path: str,
        policy: NetworkPolicy,
        log: ConnectionLog,
        *,
        intercept: Interceptor | None = None,
        max_connections: int = MAX_CONNECTIONS,
        extra_refused: frozenset[IPAddress | IPNetwork] = frozenset(),
    ) -> None:
        if len(os.fsencode(path)) > _SUN_PATH_MAX:
            raise ValueError(f"a Unix socket path is at most {_SUN_PATH_MAX} bytes: {path!r}")
        self.path = path
        self._policy = policy
        self._intercept = intercept
        self._extra_refused = extra_refused
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)
            os.chmod(path, 0o600)
            listener.listen(max_connections)
        except OSError:
            listener.close()
            raise
        super().__init__(listener, log, max_connections, names=("network-unix-accept", "network-unix-relay"))

    def _serve(self, conn: socket.socket) -> None:
        def connected(host: str, port: int, close: CloseHandle) -> None:
            del host, port
            with self._lock:
                if not self._closed:
                    self._live[conn] = close
                    return
            close("the command ended")

        try:
            stream = self._receive(conn, DEFAULT_HEAD_TIMEOUT)
            if stream is None:
                return
            relay(
                stream,
                self._policy,
                self._log,
                extra_refused=self._extra_refused,
                intercept=self._intercept,
                on_connected=connected,
            )
        finally:
            self._served(conn)

    def close(self) -> None:
        """Stop listening, end every live connection (its entry says so) and remove the socket."""
        if self._stop("the command ended"):
            with contextlib.suppress(OSError):
                os.unlink(self.path)


class CommandEgress:
    """One command's host side of its network policy: a private directory, the endpoint, the forwarder.

    ``parent`` is where the directory is made (a ``0700`` directory of its own, bound read-only into the
    sandbox at the same path by the caller; default: the temporary directory, or ``/tmp`` when that is
    too long a path for a Unix socket). It holds :data:`SOCKET_NAME` (the endpoint's socket),
    :data:`FORWARDER_NAME` and, when ``intercept`` is given, :data:`TRUST_NAME` (the host's system bundle,
    then the interceptor's CA certificate: certificates only). A context manager; :meth:`close` ends it.
    """

    def __init__(
        self,
        policy: NetworkPolicy,
        log: ConnectionLog,
        *,
        parent: str | None = None,
        intercept: Interceptor | None = None,
        extra_refused: frozenset[IPAddress | IPNetwork] = frozenset(),
    ) -> None:
        self.directory = tempfile.mkdtemp(prefix="adk-egress-", dir=_socket_parent(parent))
        try:
            self.socket_path = os.path.join(self.directory, SOCKET_NAME)
            self.forwarder_path = os.path.join(self.directory, FORWARDER_NAME)
            _write(self.forwarder_path, forwarder_source())
            self._env: dict[str, str] = {}
            if intercept is not None:
                trust = intercept.sandbox_trust(
                    _system_bundle(), path=os.path.join(self.directory, TRUST_NAME)
                )
                _write(trust.path, trust.pem)
                self._env = dict(trust.env)
            self.endpoint = UnixEndpoint(
                self.socket_path, policy, log, intercept=intercept, extra_refused=extra_refused
            )
        except BaseException:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise

    @property
    def env(self) -> Mapping[str, str]:
        """Variables the command gets from the host (the trust bundle's; the proxy's come from inside)."""
        return self._env

    def prefix(self, python: str) -> list[str]:
        """The command line that runs the forwarder by ``python`` (isolated), before the command's own."""
        return [python, "-I", "-S", self.forwarder_path, self.socket_path]

    def wrap(self, python: str, argv: Sequence[str]) -> list[str]:
        """``argv`` started by the forwarder (:meth:`prefix` then ``argv``)."""
        return [*self.prefix(python), *argv]

    def close(self) -> None:
        """Stop the endpoint (live connections closed) and remove the directory."""
        try:
            self.endpoint.close()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> CommandEgress:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _socket_parent(parent: str | None) -> str | None:
    """``parent``, or ``/tmp`` when the temporary directory is too long a path for a socket in it."""
    if (
        parent is None
        and len(os.fsencode(tempfile.gettempdir())) > _SUN_PATH_MAX - 32
        and os.path.isdir("/tmp")
    ):
        return "/tmp"  # a private 0700 directory of its own is made in it
    return parent


def _system_bundle() -> bytes | None:
    """The host's system trust bundle (the first of ``SYSTEM_BUNDLE_PATHS``), or None without one."""
    from adk_sandbox.executor.network.intercept import SYSTEM_BUNDLE_PATHS  # noqa: PLC0415 - cryptography

    for path in SYSTEM_BUNDLE_PATHS:
        try:
            with open(path, "rb") as handle:
                return handle.read(_BUNDLE_LIMIT)
        except OSError:
            continue
    return None


def _write(path: str, data: bytes) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)


class SessionSocket(_BoundedListener):
    """A session's direct path: a Unix socket whose connections open with a token, then pass a socket.

    Thread-safe. Each connection is served in a thread of its own, at most ``max_connections`` at once:
    the token is checked (:data:`TOKEN_RULE`), then the passed socket (:data:`PASSED_RULE`) goes to
    ``handler``. See docs/network.md, section "The direct path (runc on a local engine)", for the steps and
    the modes of the directory and the socket.
    """

    def __init__(
        self,
        handler: Callable[[PassedSocket], None],
        log: ConnectionLog,
        *,
        parent: str | None = None,
        max_connections: int = MAX_CONNECTIONS,
        token_timeout: float = DEFAULT_HEAD_TIMEOUT,
    ) -> None:
        self.token = secrets.token_hex(32)
        """The session's token: 64 hex digits, the first bytes of every connection."""
        self._expected = self.token.encode()
        self._handler = handler
        self._token_timeout = token_timeout
        self.directory = tempfile.mkdtemp(prefix="adk-egress-", dir=_socket_parent(parent))
        """The private directory (``0700``): removed by :meth:`close`."""
        try:
            self.socket_directory = os.path.join(self.directory, "s")
            """The directory bound read-only into the container: only the socket is in it."""
            os.mkdir(self.socket_directory, 0o711)
            os.chmod(self.socket_directory, 0o711)  # noqa: S103 - whatever the umask; see the docstring
            self.socket_path = os.path.join(self.socket_directory, SOCKET_NAME)
            if len(os.fsencode(self.socket_path)) > _SUN_PATH_MAX:
                raise ValueError(f"a Unix socket path is at most {_SUN_PATH_MAX} bytes: {self.socket_path!r}")
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                listener.bind(self.socket_path)
                os.chmod(self.socket_path, 0o666)  # noqa: S103 - any uid inside connects; the token decides
                listener.listen(max_connections)
            except OSError:
                listener.close()
                raise
        except BaseException:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise
        super().__init__(
            listener, log, max_connections, names=("network-session-accept", "network-session-relay")
        )

    def _read_token(self, conn: socket.socket) -> str | None:
        """None once the token was read (exactly its bytes); else why it is refused ("": a probe)."""
        expected = self._expected
        received = b""
        deadline = time.monotonic() + self._token_timeout
        try:
            while len(received) < len(expected):
                left = deadline - time.monotonic()
                if left <= 0:
                    return f"no token within {self._token_timeout:g} s"
                conn.settimeout(left)
                chunk = conn.recv(len(expected) - len(received))  # never past the token
                if not chunk:
                    return "" if not received else "the connection closed in the middle of the token"
                received += chunk
        except TimeoutError:
            return f"no token within {self._token_timeout:g} s"
        except OSError as error:
            return f"the connection failed before its token: {error.strerror or error}"
        if not hmac.compare_digest(received, expected):
            return "the connection did not open with the session's token"
        return None

    def _serve(self, conn: socket.socket) -> None:
        started = time.time()
        try:
            why = self._read_token(conn)
            if why is None:
                stream = self._receive(conn, self._token_timeout)  # closes conn
                if stream is not None:
                    self._handler(stream)  # closes stream
                return
            if why:
                log.warning("a connection to the session's egress socket was refused: %s", why)
                entry = ConnectionEntry(
                    time=started, host="", port=0, decision="refused", rule=TOKEN_RULE, detail=why
                )
                self._log.record(entry)
        finally:
            with contextlib.suppress(OSError):
                conn.close()
            self._served(conn)

    def close(self) -> None:
        """Stop listening, end the connections still being served and remove the directory; idempotent."""
        if self._stop("the session ended"):
            shutil.rmtree(self.directory, ignore_errors=True)
