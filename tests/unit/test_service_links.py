"""Service links: a connection accepted by one real agent on a sibling's address, spliced to another's DIAL.

Both agents run as in :mod:`tests.unit.test_agent_connections` (the host's network namespace): service
``web``'s server is a loopback server of this test on ``127.0.0.1``, which ``web``'s agent dials; the
``default`` service's agent listens on ``web``'s address, ``127.0.0.3``.
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator

import pytest

from adk_sandbox.executor.backends.docker._spec import (
    ContainerSpec,
    host_config_arguments,
    validate_extra_hosts,
)
from adk_sandbox.executor.channel.agent_transport import AgentTransport
from adk_sandbox.executor.channel.services import LinkedService, ServiceLinks, service_addresses
from adk_sandbox.executor.errors import InvalidRequestError
from adk_sandbox.executor.types import ResourceLimits
from tests.conftest import require
from tests.unit.test_agent_connections import USER, Agent, _namespaces_work, read_all, wait_for
from tests.unit.test_agent_dial import Server


@pytest.fixture(scope="module")
def agents() -> Iterator[tuple[Agent, Agent]]:
    require(_namespaces_work(), "unshare with user and PID namespaces is needed to run an agent here")
    require(shutil.which("gcc") is not None or shutil.which("cc") is not None, "no C compiler")
    default, web = Agent(), Agent()
    yield default, web
    default.close()
    web.close()


def _of(agent: Agent) -> tuple[AgentTransport, str]:
    return agent.transport, USER


def test_addresses_and_hosts() -> None:
    assert service_addresses(["default", "web", "db"]) == {
        "default": "127.0.0.2",
        "web": "127.0.0.3",
        "db": "127.0.0.4",
    }
    links = ServiceLinks([LinkedService(name, (), lambda: (None, USER)) for name in ("default", "web")])  # type: ignore[arg-type, return-value]
    assert links.hosts_for("default") == {"default": "127.0.0.1", "web": "127.0.0.3"}


def test_the_same_port_on_two_services_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="both expose port 8000"):
        ServiceLinks(
            [
                LinkedService("web", (8000,), lambda: (None, USER)),  # type: ignore[arg-type, return-value]
                LinkedService("api", (8000,), lambda: (None, USER)),  # type: ignore[arg-type, return-value]
            ]
        )


def test_a_connection_to_a_sibling_reaches_its_server_and_nothing_else(agents: tuple[Agent, Agent]) -> None:
    default, web = agents
    server = Server()
    closed = socket.create_server(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()  # nobody listens there: a port web declares but does not serve
    links = ServiceLinks(
        [
            LinkedService("default", (), lambda: _of(default)),
            LinkedService("web", (server.port, closed_port), lambda: _of(web)),
        ]
    )
    try:
        links.serve("default")
        links.serve("web")  # nothing to listen for: default exposes no port
        links.serve("default")  # the same agent: served once
        assert links.ready("web", 1) == [closed_port]
        with socket.create_connection(("127.0.0.3", server.port), timeout=10) as client:
            client.sendall(b"GET / HTTP/1.0\r\n\r\n")
            client.shutdown(socket.SHUT_WR)
            assert read_all(client) == b"GET / HTTP/1.0\r\n\r\n<eof>"
        wait_for(lambda: any(s.error is None for s in links.splices))
        assert links.splices[-1].source == "default" and links.splices[-1].target == "web"
        with socket.create_connection(("127.0.0.3", closed_port), timeout=10) as client:
            assert read_all(client) == b""  # web's agent could not connect: closed at once
        wait_for(lambda: links.splices[-1].error is not None)
        assert "refused" in (links.splices[-1].error or "")
        for address in ("127.0.0.1", "127.0.0.2", "127.0.0.4"):  # only web's address, only its ports
            with pytest.raises(OSError), socket.create_connection((address, closed_port), timeout=2):
                pass
    finally:
        links.close()
        server.close()


def test_close_ends_spliced_connections(agents: tuple[Agent, Agent]) -> None:
    default, web = agents
    server = Server()
    links = ServiceLinks(
        [
            LinkedService("default", (), lambda: _of(default)),
            LinkedService("web", (server.port,), lambda: _of(web)),
        ]
    )
    links.serve("default")
    with socket.create_connection(("127.0.0.3", server.port), timeout=10) as client:
        client.sendall(b"x")
        assert client.recv(1) == b"x"
        links.close()
        client.settimeout(10)
        assert read_all(client) == b""
    server.close()


def test_extra_hosts_are_loopback_names_only() -> None:
    assert validate_extra_hosts({"web": "127.0.0.3", "db.local": "127.0.0.4"}) == {
        "web": "127.0.0.3",
        "db.local": "127.0.0.4",
    }
    for bad in (
        {"web": "10.0.0.1"},
        {"web": "0.0.0.0"},  # noqa: S104 - refused, never bound
        {"web": "::1"},
        {"-x": "127.0.0.2"},
        {"a b": "127.0.0.2"},
    ):
        with pytest.raises(InvalidRequestError, match="extra_hosts"):
            validate_extra_hosts(bad)
    spec = ContainerSpec(image="x", limits=ResourceLimits(), extra_hosts={"web": "127.0.0.3"})
    assert host_config_arguments(spec)["extra_hosts"] == {"web": "127.0.0.3"}
    assert "extra_hosts" not in host_config_arguments(ContainerSpec(image="x", limits=ResourceLimits()))
