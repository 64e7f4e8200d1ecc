"""A session's network policy on the host side, for every engine whose commands run over the agent channel.

:class:`SessionEgress` is one session's host side, shared by the Docker and Kubernetes sessions: the
network in force and its switch, the proxy endpoint, the commands' proxy variables, the live connections
and the log, header injection and the direct path. :class:`SessionNetwork`, :func:`check_network_argument`.
See docs/network.md, sections "The in-sandbox endpoint" and "The direct path (runc on a local engine)".
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from adk_sandbox.executor._layout import DIRECT_MOUNT
from adk_sandbox.executor.channel.agent_transport import AgentTransport
from adk_sandbox.executor.channel.connections import ConnectionHandler, ConnectionStream
from adk_sandbox.executor.channel.transport import CommandTransport
from adk_sandbox.executor.errors import InvalidRequestError, PolicyNotEnforceableError
from adk_sandbox.executor.network.addresses import IPAddress, IPNetwork, infrastructure_addresses
from adk_sandbox.executor.network.http_head import HeadError, forbidden, head_end, parse_head
from adk_sandbox.executor.network.intercept import SYSTEM_BUNDLE_PATHS, Interceptor
from adk_sandbox.executor.network.log import ConnectionEntry, ConnectionLog, LogSnapshot
from adk_sandbox.executor.network.passed_socket import PassedSocket
from adk_sandbox.executor.network.policy import NetworkPolicy
from adk_sandbox.executor.network.relay import DEFAULT_HEAD_TIMEOUT, CloseHandle, relay
from adk_sandbox.executor.network.unix_endpoint import SOCKET_NAME, SessionSocket
from adk_sandbox.executor.snapshots.model import KeptEndpoint

__all__ = [
    "DIRECT_MOUNT",
    "NETWORK_OFF_RULE",
    "EgressMode",
    "SessionEgress",
    "SessionNetwork",
    "check_network_argument",
    "still_allowed",
]

#: How the proxy endpoint's connections reach this process: over a Unix socket, or as channel frames.
EgressMode = Literal["unix", "frames"]

#: The rule a request gets in its 403 (and in the log) while ``set_network(False)`` holds.
NETWORK_OFF_RULE = "network off"
_OFF_MESSAGE = "the sandbox's network is off (set_network(False)): no connection is made"
#: The most bytes of a request head read before the 403 of a network that is off.
_OFF_HEAD_BYTES = 16 * 1024
#: The most bytes of the image's system trust bundle read (to put the session CA after it).
_BUNDLE_LIMIT = 8 << 20


@dataclass(frozen=True)
class _Live:
    """One live proxied connection: where it goes and how to end it (``set_network``)."""

    host: str
    port: int
    policy: NetworkPolicy
    close: CloseHandle


def still_allowed(old: NetworkPolicy, new: bool | NetworkPolicy, host: str, port: int) -> bool:
    """Whether a connection made under ``old`` to ``host:port`` may go on under ``new``.

    Only under a policy that allows the name, and pins it to the same addresses (or leaves it to DNS as
    before): a connection to an address the new policy would not reach is closed too.
    """
    if not isinstance(new, NetworkPolicy):
        return False
    return new.decide(host, port).allowed and new.hosts.get(host) == old.hosts.get(host)


class SessionEgress:
    """The host side of one session's network (docs/network.md); thread-safe.

    ``network`` is the network the session starts with: ``False`` (none), ``True`` (the engine's route
    out: nothing is served here) or a policy (the agent serves the proxy endpoint from the start).
    ``engine_hosts`` names the engine's machine when it is not this one (a remote Docker host, the
    Kubernetes API server): its addresses are refused like this machine's own
    (:func:`~adk_sandbox.executor.network.addresses.infrastructure_addresses`, looked up once, at the
    first connection).
    """

    def __init__(self, network: bool | NetworkPolicy, *, engine_hosts: Sequence[str] = ()) -> None:
        self._network = network
        self._engine_hosts = tuple(engine_hosts)
        self._infrastructure: frozenset[IPAddress | IPNetwork] | None = None
        #: Whether the agent serves the proxy endpoint (a policy now or before; off: every request a 403).
        self._proxied = isinstance(network, NetworkPolicy)
        self._lock = threading.Lock()  # the network and the live connections
        self._serving = threading.RLock()  # one LISTEN at a time, and the CA written once per agent
        self._live: dict[ConnectionStream | PassedSocket, _Live] = {}
        #: Every connection the sandbox asked for under its network policy (bounded).
        self.log = ConnectionLog()
        self._port: int | None = None
        self._served_by: tuple[AgentTransport, int | None] | None = None
        self._interceptor: Interceptor | None = None
        self._interceptor_key: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        self._intercept_env: Mapping[str, str] = MappingProxyType({})
        self._direct: SessionSocket | None = None
        self._mode: EgressMode | None = None
        #: Seconds each connection has to send its request head (and, for CONNECT, its ClientHello).
        self.head_timeout = DEFAULT_HEAD_TIMEOUT

    # -- what is in force ----------------------------------------------------------------------------
    @property
    def network(self) -> bool | NetworkPolicy:
        """The network in force: False (none), True (the engine's route out) or a :class:`NetworkPolicy`."""
        with self._lock:
            return self._network

    @property
    def policy(self) -> NetworkPolicy | None:
        """The policy in force (None: none, or the network is off); ``capabilities().network_policy``."""
        network = self.network
        return network if isinstance(network, NetworkPolicy) else None

    @property
    def proxied(self) -> bool:
        """Whether the session's agent serves (or is to serve) the proxy endpoint."""
        return self._proxied

    @property
    def port(self) -> int | None:
        """The port the agent's proxy endpoint listens on inside the sandbox (None: not served yet)."""
        return self._port

    @property
    def interceptor(self) -> Interceptor | None:
        """The session's interceptor (header injection), once a policy with headers was in force."""
        return self._interceptor

    @property
    def mode(self) -> EgressMode | None:
        """How the served endpoint's connections reach this process.

        ``"unix"`` (the direct path) or ``"frames"`` (over the agent channel); None while nothing is served.
        """
        return self._mode

    @property
    def direct_directory(self) -> str | None:
        """The host directory to bind read-only at :data:`DIRECT_MOUNT` (None: no direct path)."""
        return self._direct.socket_directory if self._direct is not None else None

    def enable_direct(self) -> str:
        """Make the session's direct path (once): the directory to bind read-only at :data:`DIRECT_MOUNT`.

        For every container of the session, on a local engine only (the directory must be this machine's).
        Whether the sandbox reaches the socket is the agent's to find out (a probe at LISTEN).
        """
        with self._serving:
            if self._direct is None:
                self._direct = SessionSocket(self.handle, self.log)
            return self._direct.socket_directory

    def close(self) -> None:
        """End the live connections and remove the direct path's socket and directory; idempotent."""
        with self._lock:
            live = list(self._live.values())
        for connection in live:
            connection.close("the session was closed")
        direct = self._direct
        if direct is not None:
            direct.close()

    def open_connections(self) -> list[tuple[str, int]]:
        """The live proxied connections, as (host, port)."""
        with self._lock:
            return [(live.host, live.port) for live in self._live.values()]

    def snapshot(self) -> LogSnapshot:
        """The connections the sandbox asked for (``session.network_log()``)."""
        return self.log.snapshot()

    def env(self) -> dict[str, str]:
        """The variables a command gets: the proxy's (both cases), ``NO_PROXY`` and the CA bundle's."""
        if not self._proxied or self._port is None:
            return {}
        url = f"http://127.0.0.1:{self._port}"
        local = "localhost,127.0.0.1"
        return {
            "HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url,
            "NO_PROXY": local, "no_proxy": local, **self._intercept_env,
        }  # fmt: skip

    # -- the endpoint --------------------------------------------------------------------------------
    def ensure(self, transport: CommandTransport | None, user: str) -> None:
        """Before a command: the endpoint served by ``user``'s agent, if this session proxies at all."""
        if self._proxied and transport is not None:
            self.serve(transport, user)

    def serve(self, transport: CommandTransport, user: str) -> None:
        """Have ``user``'s agent serve the proxy endpoint (again for a new agent or a new transport).

        :class:`PolicyNotEnforceableError` for a transport without the agent channel, or an agent that does
        not serve the endpoint: a network policy is never weakened to no policy.
        """
        if not isinstance(transport, AgentTransport):
            raise PolicyNotEnforceableError(
                "a NetworkPolicy needs the in-sandbox agent, which serves its proxy endpoint: the "
                f"{transport.channel} transport has none; it is refused"
            )
        with self._serving:
            pid = transport.agent_pids.get(user)
            served = self._served_by
            if (
                pid is not None
                and served is not None
                and served[0] is transport
                and served[1] == pid
                and self._port is not None
            ):
                return
            direct = self._direct
            if direct is not None:
                inside = os.path.join(DIRECT_MOUNT, SOCKET_NAME)
                self._port, mode = transport.serve_proxy(user, self.handle, direct=(inside, direct.token))
                self._mode = "unix" if mode == "unix" else "frames"
            else:
                self._port, self._mode = transport.serve_connections(user, self.handle), "frames"
            network = self.network
            if isinstance(network, NetworkPolicy):
                self._trust_intercept_ca(transport, user, network)  # a fresh agent: the CA file again
            self._served_by = (transport, transport.agent_pids.get(user))

    def carried(self, transport: CommandTransport) -> KeptEndpoint | None:
        """The endpoint a copy of the sandbox's memory (a fork) keeps listening on; None: none is served.

        Only an endpoint served as frames is carried: the direct path's socket is this session's own.
        """
        with self._serving:
            served, port = self._served_by, self._port
            if served is None or port is None or served[0] is not transport:
                return None
            if self._mode != "frames":
                raise PolicyNotEnforceableError(
                    "the proxy endpoint is served over this session's own socket (the direct path), which a "
                    "copy cannot share; nothing was copied"
                )
            agent_transport = served[0]
            for user, pid in agent_transport.agent_pids.items():
                if pid == served[1]:
                    listeners = agent_transport.listeners_of(user, self.handle)
                    return KeptEndpoint(user=user, listeners=listeners, port=port)
        return None

    def adopt(self, carried: KeptEndpoint) -> dict[int, ConnectionHandler]:
        """Serve ``carried`` (a copy's endpoint) here: the handlers to reattach its agent with.

        The copy's connections then go through this session's network (a policy, or a 403 when it has
        none), and its commands are told the same port. :meth:`served_again` completes it once the agent
        is served.
        """
        with self._serving:
            self._port, self._mode = carried.port, "frames"
            self._proxied = True
        return dict.fromkeys(carried.listeners, self.handle)

    def served_again(self, transport: AgentTransport, carried: KeptEndpoint) -> None:
        """The copy's agent is served (with :meth:`adopt`'s handlers): no new LISTEN is needed for it.

        A policy with headers gets this session's own CA written into the copy (the copy's host side never
        holds the parent's key), as for a fresh agent.
        """
        with self._serving:
            self._served_by = (transport, transport.agent_pids.get(carried.user))
            network = self.network
            if isinstance(network, NetworkPolicy):
                self._trust_intercept_ca(transport, carried.user, network)

    def switch(self, network: bool | NetworkPolicy, transport: CommandTransport | None, user: str) -> None:
        """Put ``network`` in force (the engine checked it may); close the connections it does not allow.

        To a policy: the endpoint is served first (a refusal leaves the network as it was), and its hosts
        with headers get the session CA (a new one for other hosts: its name constraints are fixed).
        """
        if isinstance(network, NetworkPolicy) and transport is not None:
            with self._serving:
                self.serve(transport, user)
                if isinstance(transport, AgentTransport):
                    self._trust_intercept_ca(transport, user, network)
                self._proxied = True
        with self._lock:
            self._network = network
            cut = [
                live
                for live in self._live.values()
                if not still_allowed(live.policy, network, live.host, live.port)
            ]
        why = (
            "the sandbox's network was turned off (set_network(False))"
            if network is False
            else "the sandbox's new network policy does not allow it"
        )
        for live in cut:
            live.close(why)

    # -- one connection ------------------------------------------------------------------------------
    def handle(self, stream: ConnectionStream | PassedSocket) -> None:
        """Serve one connection of the proxy endpoint under the network in force when it arrived.

        Carried as frames (a :class:`ConnectionStream`) or by the direct path (the client's own socket,
        passed by the agent after the token, checked): one path for both, so policy, ``set_network``, the
        log and header injection are the same.
        """
        with self._lock:
            network = self._network
        if not isinstance(network, NetworkPolicy):
            self._refuse_off(stream)
            return

        def connected(host: str, port: int, close: CloseHandle) -> None:
            # switch() may have run while this one was deciding: it goes on only if still allowed.
            with self._lock:
                if still_allowed(network, self._network, host, port):
                    self._live[stream] = _Live(host, port, network, close)
                    return
            close("the sandbox's network changed before the connection started")

        try:
            intercept = self._interceptor_for(network)
            relay(
                stream,
                network,
                self.log,
                extra_refused=self.infrastructure(),
                head_timeout=self.head_timeout,
                on_connected=connected,
                intercept=intercept,
            )
        finally:
            with self._lock:
                self._live.pop(stream, None)

    def infrastructure(self) -> frozenset[IPAddress | IPNetwork]:
        """The engine's own addresses, refused to every connection (unless pinned): found once, kept."""
        found = self._infrastructure
        if found is None:
            found = self._infrastructure = frozenset(infrastructure_addresses(self._engine_hosts))
        return found

    def _refuse_off(self, stream: ConnectionStream | PassedSocket) -> None:
        """The network is off: read the request head (so the client reads the answer) and answer 403."""
        started, host, port = time.time(), "", 0
        buffer = b""
        deadline = time.monotonic() + DEFAULT_HEAD_TIMEOUT
        try:
            while head_end(buffer) is None and len(buffer) < _OFF_HEAD_BYTES:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                stream.settimeout(left)
                chunk = stream.recv(_OFF_HEAD_BYTES)
                if not chunk:
                    break
                buffer += chunk
            end = head_end(buffer)
            if end is not None:
                with contextlib.suppress(HeadError):
                    request = parse_head(buffer[:end])
                    host, port = request.host, request.port
            stream.sendall(forbidden(_OFF_MESSAGE, NETWORK_OFF_RULE))
        except OSError:  # TimeoutError included: the client gave up or was too slow; it is refused anyway
            pass
        finally:
            stream.close()
        entry = ConnectionEntry(
            time=started, host=host, port=port, decision="refused", rule=NETWORK_OFF_RULE, detail=_OFF_MESSAGE
        )
        self.log.record(entry)

    # -- header injection (executor/network/intercept.py) --------------------------------------------
    @staticmethod
    def _intercept_key(policy: NetworkPolicy) -> tuple[tuple[str, ...], tuple[str, ...]]:
        # What a session CA is made for: its name constraints (the hosts with headers) and upstream trust.
        return tuple(sorted(policy.headers)), tuple(policy.upstream_ca)

    def _interceptor_for(self, policy: NetworkPolicy) -> Interceptor | None:
        """The interceptor made for ``policy``'s hosts with headers (None: none, or not made for them)."""
        if policy.headers and self._interceptor_key == self._intercept_key(policy):
            return self._interceptor
        return None

    def _trust_intercept_ca(self, transport: AgentTransport, user: str, policy: NetworkPolicy) -> None:
        """For a policy with headers: the session's interceptor, its CA certificate trusted inside.

        The certificate (the public part only) is written after the image's system bundle, so hosts without
        headers still verify; commands get the variables naming it (:data:`.intercept.TRUST_ENV_NAMES`).
        """
        if not policy.headers:
            return
        key = self._intercept_key(policy)
        if self._interceptor is None or self._interceptor_key != key:
            self._interceptor, self._interceptor_key = Interceptor(policy), key
        assert self._interceptor is not None  # noqa: S101 - made just above
        deadline = time.monotonic() + 30
        system = None
        for path in SYSTEM_BUNDLE_PATHS:
            read = {"op": "read", "path": path, "offset": 0, "limit": _BUNDLE_LIMIT}
            body, data = transport.file_op(user, read, deadline=deadline, max_output=_BUNDLE_LIMIT)
            if body.get("error") is None:
                system = data
                break
        trust = self._interceptor.sandbox_trust(system)
        write = {"op": "write", "path": trust.path, "mode": 0o644, "exclusive": False, "append": False}
        body, _ = transport.file_op(user, write, trust.pem, deadline=deadline)
        if body.get("error") is not None:
            raise PolicyNotEnforceableError(
                f"the session CA could not be written to {trust.path}: {body['error']}"
            )
        self._intercept_env = MappingProxyType(dict(trust.env))


class SessionNetwork:
    """The network methods every session on the agent channel shares, read from its :class:`SessionEgress`.

    A Docker, Kubernetes or microVM session mixes this in and sets ``_egress``; each keeps its own
    ``set_network``, because which networks it can switch between is the engine's (a container's network
    mode, a Pod's label, a VM without a network device), and checks its argument with
    :func:`check_network_argument`.
    """

    _egress: SessionEgress

    @property
    def network(self) -> bool | NetworkPolicy:
        """The network in force: False (none), True (the engine's route out) or a :class:`NetworkPolicy`."""
        return self._egress.network

    def open_connections(self) -> list[tuple[str, int]]:
        """The live proxied connections, as (host, port)."""
        return self._egress.open_connections()

    def network_log(self) -> LogSnapshot:
        """The connections this session's sandbox asked for under its network policy (bounded)."""
        return self._egress.snapshot()

    @property
    def network_log_store(self) -> ConnectionLog:
        """The session's connection log itself (``network_log()`` gives a snapshot of it)."""
        return self._egress.log


def check_network_argument(network: object, *, route: bool = True) -> None:
    """Refuse a ``set_network`` argument that is not a network: False, True (where ``route``) or a policy."""
    if not isinstance(network, bool | NetworkPolicy):
        takes = "False, True or a NetworkPolicy" if route else "False or a NetworkPolicy"
        raise InvalidRequestError(f"set_network takes {takes}, not {type(network).__name__}")
