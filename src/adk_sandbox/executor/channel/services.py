"""Several services of one sample, linked with no route out: each reaches its siblings' ports by name.

:class:`ServiceLinks` is the host side for one sample (the inspect provider makes one): each service
gets a loopback address (:func:`service_addresses`), its agent listens there for the siblings' ports, and
each connection is spliced to a DIAL in the sibling. See docs/network.md, section "Several services".
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from adk_sandbox.executor.channel.agent_transport import AgentTransport
from adk_sandbox.executor.channel.connections import ConnectionStream, pump
from adk_sandbox.executor.errors import ExecutorError, InvalidRequestError

__all__ = ["DIAL_SECONDS", "MAX_SERVICES", "LinkedService", "ServiceLinks", "Splice", "service_addresses"]

log = logging.getLogger(__name__)

#: How long a sibling's agent may take to answer a DIAL before the connection is given up.
DIAL_SECONDS = 10.0
#: The most services of one sample (their addresses are ``127.0.0.2`` .. ``127.0.0.254``).
MAX_SERVICES = 253

#: The transport and the user of a service's agent now (the transport changes with a new container).
AgentOf = Callable[[], tuple[AgentTransport, str]]


def service_addresses(names: Sequence[str]) -> dict[str, str]:
    """Each service's loopback address, by its place in ``names``: ``127.0.0.2``, ``127.0.0.3``, ...

    ``127.0.0.1`` stays each sandbox's own.
    """
    if len(names) > MAX_SERVICES:
        raise InvalidRequestError(f"at most {MAX_SERVICES} services in one sample, not {len(names)}")
    return {name: f"127.0.0.{2 + index}" for index, name in enumerate(names)}


@dataclass(frozen=True)
class LinkedService:
    """One service of the sample: its name, the ports it exposes to its siblings, and its agent."""

    name: str
    ports: tuple[int, ...]
    agent: AgentOf


@dataclass(frozen=True)
class Splice:
    """One connection carried between two services (kept for the sample's record)."""

    source: str
    target: str
    port: int
    error: str | None = None


@dataclass
class _Served:
    transport: AgentTransport | None = None
    pid: int | None = None
    ports: dict[tuple[str, int], int] = field(default_factory=dict)


class ServiceLinks:
    """The links between one sample's services (docs/network.md, "Several services"); thread-safe.

    ``services`` in their order (which gives their addresses); :meth:`serve` has a service's agent listen
    for its siblings' ports (again after its agent or container was replaced), :meth:`close` ends every
    spliced connection. Two services exposing the same port are refused: a server of one listening on
    all addresses would take the sibling's port on ``127.0.0.<k>`` (or be refused it).
    """

    def __init__(self, services: Sequence[LinkedService]) -> None:
        names = [service.name for service in services]
        if len(set(names)) != len(names):
            raise InvalidRequestError(f"service names must be distinct: {names}")
        owner: dict[int, str] = {}
        for service in services:
            for port in service.ports:
                if not (isinstance(port, int) and 1 <= port <= 65535):
                    raise InvalidRequestError(f"service {service.name!r}: port {port!r} is not 1..65535")
                if port in owner and owner[port] != service.name:
                    raise InvalidRequestError(
                        f"services {owner[port]!r} and {service.name!r} both expose port {port}: sibling "
                        "services share one port space on their loopback addresses here, so each port may "
                        "be exposed by one service only"
                    )
                owner[port] = service.name
        self._services = {service.name: service for service in services}
        self.addresses = service_addresses(names)
        self._lock = threading.Lock()  # the streams, the record
        self._serving = threading.Lock()  # one service's listeners at a time
        self._served: dict[str, _Served] = {name: _Served() for name in names}
        self._streams: set[ConnectionStream] = set()
        self._closed = False
        #: Every connection carried so far (bounded: the last 1000).
        self.splices: list[Splice] = []

    def hosts_for(self, name: str) -> dict[str, str]:
        """The ``/etc/hosts`` entries of service ``name``: each sibling's address, its own name at home."""
        return {
            other: ("127.0.0.1" if other == name else address) for other, address in self.addresses.items()
        }

    def serve(self, name: str) -> None:
        """Have service ``name``'s agent listen for every port its siblings expose (once per agent).

        ``OSError`` when a port is taken there (``EADDRINUSE``), :class:`PolicyNotEnforceableError` for an
        agent that cannot listen on another loopback address.
        """
        transport, user = self._services[name].agent()
        served = self._served[name]
        with self._serving:
            pid = transport.agent_pids.get(user)
            if served.transport is transport and pid is not None and served.pid == pid:
                return
            served.ports.clear()
            for other, service in self._services.items():
                if other == name:
                    continue
                for port in service.ports:
                    served.ports[(other, port)] = transport.serve_connections(
                        user, self._handler(name, other, port), port=port, address=self.addresses[other]
                    )
            served.transport, served.pid = transport, transport.agent_pids.get(user)

    def ready(self, name: str, timeout: float) -> list[int]:
        """Wait until service ``name`` accepts on each port it exposes; the ports that did not in time."""
        service = self._services[name]
        until = time.monotonic() + timeout
        waiting = list(service.ports)
        while waiting:
            transport, user = service.agent()
            for port in list(waiting):
                with contextlib.suppress(OSError):
                    transport.dial(user, port, timeout=max(until - time.monotonic(), 0.1)).close()
                    waiting.remove(port)
            if not waiting or time.monotonic() >= until:
                break
            time.sleep(0.1)
        return waiting

    def close(self) -> None:
        """End every spliced connection; nothing more is carried."""
        with self._lock:
            self._closed = True
            streams, self._streams = list(self._streams), set()
        for stream in streams:
            stream.close()

    # -- one connection ------------------------------------------------------------------------------
    def _handler(self, source: str, target: str, port: int) -> Callable[[ConnectionStream], None]:
        def handle(stream: ConnectionStream) -> None:
            self._splice(stream, source, target, port)

        return handle

    def _splice(self, inbound: ConnectionStream, source: str, target: str, port: int) -> None:
        service = self._services[target]
        try:
            transport, user = service.agent()
            outbound = transport.dial(user, port, timeout=DIAL_SECONDS)
        except (OSError, ExecutorError) as exc:
            self._record(Splice(source, target, port, error=str(exc)))
            log.info("service %s -> %s:%d not connected: %s", source, target, port, exc)
            return  # the handler's end closes the inbound connection
        with self._lock:
            if self._closed:
                outbound.close()
                return
            self._streams |= {inbound, outbound}
        self._record(Splice(source, target, port))
        back = threading.Thread(
            target=pump, args=(outbound, inbound), name="adk-sandbox-service-link", daemon=True
        )
        back.start()
        try:
            pump(inbound, outbound)
            back.join()
        finally:
            outbound.close()
            inbound.close()
            with self._lock:
                self._streams -= {inbound, outbound}

    def _record(self, splice: Splice) -> None:
        with self._lock:
            self.splices.append(splice)
            del self.splices[:-1000]
