"""Published ports: an address on the host's loopback that reaches a port on the sandbox's own loopback.

:class:`PublishedPorts` serves ``session.publish(port)``: it listens on ``127.0.0.1:N`` and carries each
connection over the agent channel to a DIAL of ``127.0.0.1:port`` inside, bounded by
:data:`MAX_PUBLISHED`, :data:`MAX_CONNECTIONS` and :data:`HALF_CLOSE_SECONDS`.
See docs/network.md, section "Published ports".
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable

from adk_sandbox.executor.channel.agent_transport import AgentTransport
from adk_sandbox.executor.channel.connections import ByteStream, ConnectionStream, pump
from adk_sandbox.executor.errors import ExecutorError, InvalidRequestError

__all__ = ["MAX_CONNECTIONS", "MAX_PUBLISHED", "PublishedPorts"]

log = logging.getLogger(__name__)

#: The most ports one session publishes at once.
MAX_PUBLISHED = 16
#: The most live connections through one session's published ports at once.
MAX_CONNECTIONS = 64
#: How long one direction of a connection may go on after the other ended (socat's ``-t``, longer).
HALF_CLOSE_SECONDS = 5.0
#: How long the agent may take to connect inside before the host's connection is closed.
DIAL_SECONDS = 10.0

#: The session's agent channel and its command user, now (see ``ChannelSession.agent_channel``).
AgentOf = Callable[[], tuple[AgentTransport, str]]


class _Listener:
    """One published port: the host socket and the thread accepting on it."""

    def __init__(self, port: int, host_port: int) -> None:
        self.port = port
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.socket.bind(("127.0.0.1", host_port))
        except OSError as exc:
            self.socket.close()
            raise InvalidRequestError(
                f"127.0.0.1:{host_port} cannot be listened on ({exc.strerror}); choose another host_port, or "
                "leave it 0 for a free one"
            ) from None
        self.socket.listen(64)
        self.address = f"127.0.0.1:{self.socket.getsockname()[1]}"


class PublishedPorts:
    """The published ports of one session (docs/network.md, "Published ports"); thread-safe."""

    def __init__(self, agent: AgentOf) -> None:
        self._agent = agent
        self._lock = threading.Lock()
        self._listeners: dict[int, _Listener] = {}
        self._live: dict[int, set[socket.socket | ConnectionStream]] = {}
        self._count = 0
        self._closed = False

    def publish(self, port: int, host_port: int = 0) -> str:
        """Publish the sandbox's ``127.0.0.1:port``; the host address (``"127.0.0.1:N"``) that reaches it.

        Publishing a port again returns its address. ``host_port`` asks for that host port (0: any free
        one). :class:`InvalidRequestError` for a port outside 1..65535, a host port that cannot be had, or
        past :data:`MAX_PUBLISHED`; :class:`PolicyNotEnforceableError` when the agent cannot dial.
        """
        for name, value, low in (("port", port, 1), ("host_port", host_port, 0)):
            if not (isinstance(value, int) and not isinstance(value, bool) and low <= value <= 65535):
                raise InvalidRequestError(f"{name} must be an integer {low}..65535, not {value!r}")
        transport, user = self._agent()  # the sandbox is up (raises for a closed session)
        transport.require_dialing(user, f"publish port {port}")
        with self._lock:
            if self._closed:
                raise InvalidRequestError("this session is closed: it publishes no port")
            if port in self._listeners:
                return self._listeners[port].address
            if len(self._listeners) >= MAX_PUBLISHED:
                raise InvalidRequestError(
                    f"this session already publishes {MAX_PUBLISHED} ports, the most it may; unpublish one "
                    "first. Nothing was published"
                )
            listener = _Listener(port, host_port)
            self._listeners[port] = listener
            self._live[port] = set()
        threading.Thread(
            target=self._accept, args=(listener,), name=f"adk-sandbox-publish-{port}", daemon=True
        ).start()
        return listener.address

    def published(self) -> dict[int, str]:
        """Each published port of the sandbox and its host address."""
        with self._lock:
            return {port: listener.address for port, listener in self._listeners.items()}

    def unpublish(self, port: int) -> None:
        """Stop publishing ``port`` and cut its live connections; a port not published is no error."""
        with self._lock:
            listener = self._listeners.pop(port, None)
            live = self._live.pop(port, set())
        if listener is not None:
            _close_listener(listener)
        for end in live:
            with contextlib.suppress(OSError):
                end.close()

    def close(self) -> None:
        """Unpublish every port (the session's close): each address refuses from now on."""
        with self._lock:
            self._closed = True
            ports = list(self._listeners)
        for port in ports:
            self.unpublish(port)

    # -- one listener, one connection ----------------------------------------------------------------
    def _accept(self, listener: _Listener) -> None:
        while True:
            try:
                inbound, _ = listener.socket.accept()
            except OSError:  # unpublished: the socket was shut down and closed
                return
            with self._lock:
                admitted = listener.port in self._listeners and self._count < MAX_CONNECTIONS
                if admitted:
                    self._count += 1
                    self._live[listener.port].add(inbound)
            if not admitted:
                inbound.close()  # past the cap (or unpublished meanwhile): refused, said by the close
                continue
            threading.Thread(
                target=self._carry,
                args=(listener.port, inbound),
                name="adk-sandbox-publish-conn",
                daemon=True,
            ).start()

    def _carry(self, port: int, inbound: socket.socket) -> None:
        outbound: ConnectionStream | None = None
        try:
            try:
                transport, user = self._agent()
                outbound = transport.dial(user, port, timeout=DIAL_SECONDS)
            except (OSError, ExecutorError) as exc:
                log.info("published port %d: no connection inside (%s)", port, exc)
                return
            with self._lock:
                live = self._live.get(port)
                if live is None:  # unpublished while it connected
                    return
                live.add(outbound)
            _splice(inbound, outbound)
        finally:
            for end in (inbound, outbound):
                if end is not None:
                    with contextlib.suppress(OSError):
                        end.close()
            with self._lock:
                self._count -= 1
                self._live.get(port, set()).difference_update({inbound, outbound})


def _splice(inbound: socket.socket, outbound: ConnectionStream) -> None:
    """Both directions until both end; once one has, the other gets :data:`HALF_CLOSE_SECONDS` more.

    A peer that closed its end is indistinguishable from one that only half-closed; without the bound, a
    server that never closes (or a client that never does) would hold its place under the cap for ever.
    """
    ended = threading.Event()

    def one_way(source: ByteStream, target: ByteStream) -> None:
        pump(source, target)
        ended.set()

    threads = [
        threading.Thread(target=one_way, args=ends, name="adk-sandbox-publish-pump", daemon=True)
        for ends in ((inbound, outbound), (outbound, inbound))
    ]
    for thread in threads:
        thread.start()
    ended.wait()
    deadline = time.monotonic() + HALF_CLOSE_SECONDS
    for thread in threads:
        thread.join(max(deadline - time.monotonic(), 0))
    with contextlib.suppress(OSError):
        inbound.shutdown(socket.SHUT_RDWR)  # wakes a pump still reading it
    outbound.close()


def _close_listener(listener: _Listener) -> None:
    with contextlib.suppress(OSError):
        listener.socket.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
    listener.socket.close()
