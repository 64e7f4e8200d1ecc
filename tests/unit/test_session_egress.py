"""The host side of a session's network (the Docker and Kubernetes sessions' own), and the Kubernetes config.

:class:`SessionEgress` against a fake agent transport (what it asks the agent: LISTEN, the CA file), and a
socket pair standing in for one proxied connection; the Kubernetes config, Pod spec and ``set_network``
refusals without a cluster. The whole path over a real agent runs in tests/integration/
test_k8s_egress_on_docker.py and the Docker egress tests.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from adk_sandbox.executor.backends.kubernetes import (
    KubernetesBackend,
    KubernetesConfig,
    network_policy,
    pod_spec,
    workspace_config,
)
from adk_sandbox.executor.backends.kubernetes._spec import NETWORK_LABEL, network_policy_in_force
from adk_sandbox.executor.channel.agent_transport import AgentTransport
from adk_sandbox.executor.channel.connections import ConnectionHandler
from adk_sandbox.executor.channel.egress import NETWORK_OFF_RULE, SessionEgress, still_allowed
from adk_sandbox.executor.errors import InvalidRequestError, PolicyNotEnforceableError
from adk_sandbox.executor.network.addresses import ENGINE_REASON
from adk_sandbox.executor.network.intercept import SANDBOX_CA_PATH
from adk_sandbox.executor.network.policy import NetworkPolicy
from adk_sandbox.executor.network.relay import relay
from tests.k8s_api_stubs import ClusterWithoutClaims

USER = "1000:1000"
POLICY = NetworkPolicy(allow=["pypi.org"], hosts={"pypi.org": ["127.0.0.1"]})


class FakeTransport(AgentTransport):
    """An agent transport that records LISTENs and file operations; its agent's pid is :attr:`pid`."""

    def __init__(self) -> None:
        super().__init__(lambda argv, user, until: None)  # type: ignore[arg-type,return-value]
        self.pid = 7
        self.listens: list[tuple[str, ConnectionHandler]] = []
        self.writes: dict[str, bytes] = {}

    @property
    def agent_pids(self) -> dict[str, int]:
        return {USER: self.pid}

    def serve_connections(
        self, user: str, handler: ConnectionHandler, *, port: int = 0, timeout: float = 0
    ) -> int:
        self.listens.append((user, handler))
        return 40000 + len(self.listens)

    def file_op(
        self,
        user: str,
        request: dict[str, Any],
        data: bytes | None = None,
        *,
        deadline: float,
        max_output: int = 0,
    ) -> tuple[dict[str, Any], bytes]:
        if request["op"] == "read":
            return {"error": {"errno": 2}}, b""
        self.writes[request["path"]] = data or b""
        return {}, b""


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    sandbox, host = socket.socketpair()
    yield sandbox, host
    sandbox.close()
    host.close()


def test_the_endpoint_is_served_once_per_agent_and_again_for_a_new_one() -> None:
    egress, transport = SessionEgress(POLICY), FakeTransport()
    assert egress.proxied and egress.env() == {}  # nothing served yet: no variables
    egress.ensure(transport, USER)
    egress.ensure(transport, USER)
    assert len(transport.listens) == 1
    env = egress.env()
    assert env["HTTP_PROXY"] == env["https_proxy"] == "http://127.0.0.1:40001"
    assert env["NO_PROXY"] == "localhost,127.0.0.1" and "SSL_CERT_FILE" not in env  # no headers: no CA
    transport.pid = 8  # the agent was restarted
    egress.ensure(transport, USER)
    assert len(transport.listens) == 2 and egress.port == 40002
    other = FakeTransport()  # a replacement container: the same pid in a new transport is a new agent
    egress.ensure(other, USER)
    assert len(other.listens) == 1


def test_without_a_policy_nothing_is_served_and_a_transport_without_the_agent_is_refused() -> None:
    egress, transport = SessionEgress(False), FakeTransport()
    egress.ensure(transport, USER)
    assert transport.listens == [] and egress.env() == {} and egress.policy is None

    class WithoutAgent:  # a test's stand-in transport: no agent, so no proxy endpoint
        channel = "scripted"

    with pytest.raises(PolicyNotEnforceableError, match="the scripted transport has none"):
        SessionEgress(POLICY).serve(WithoutAgent(), USER)  # type: ignore[arg-type]


def test_a_policy_with_headers_writes_the_session_ca_and_names_it() -> None:
    policy = NetworkPolicy(allow=["api.test"], headers={"api.test": {"Authorization": "Bearer x"}})
    egress, transport = SessionEgress(False), FakeTransport()
    egress.switch(policy, transport, USER)
    assert egress.network == policy and egress.proxied and len(transport.listens) == 1
    assert egress.interceptor is not None
    assert b"BEGIN CERTIFICATE" in transport.writes[SANDBOX_CA_PATH]
    assert b"PRIVATE KEY" not in transport.writes[SANDBOX_CA_PATH]
    assert egress.env()["SSL_CERT_FILE"] == SANDBOX_CA_PATH


def test_a_network_that_is_off_answers_403_and_logs_it(pair: tuple[socket.socket, socket.socket]) -> None:
    sandbox, host = pair
    egress = SessionEgress(POLICY)
    egress.switch(False, None, USER)
    sandbox.sendall(b"GET http://pypi.org/simple/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n")
    egress.handle(host)  # type: ignore[arg-type]  # a socket is a ByteStream
    answer = sandbox.recv(65536)
    assert answer.startswith(b"HTTP/1.1 403 ") and NETWORK_OFF_RULE.encode() in answer
    (entry,) = egress.snapshot().entries
    assert (entry.host, entry.port, entry.rule, entry.decision) == (
        "pypi.org",
        80,
        NETWORK_OFF_RULE,
        "refused",
    )


@pytest.mark.parametrize(
    ("new", "allowed"),
    [
        (False, False),
        (True, False),
        (POLICY, True),
        (NetworkPolicy(allow=["pypi.org"], hosts={"pypi.org": ["10.0.0.1"]}), False),  # pinned elsewhere
        (NetworkPolicy(allow=["other.org"], hosts=POLICY.hosts), False),
    ],
)
def test_still_allowed(new: bool | NetworkPolicy, allowed: bool) -> None:
    assert still_allowed(POLICY, new, "pypi.org", 443) is allowed


# -- the Kubernetes config ---------------------------------------------------------------------------


def test_kubernetes_config_takes_a_bool_a_policy_or_a_policys_mapping() -> None:
    assert KubernetesConfig().network is False and KubernetesConfig().egress is None
    assert KubernetesConfig(network=True).egress is None
    config = KubernetesConfig(network={"allow": ["pypi.org"], "hosts": {"pypi.org": ["127.0.0.1"]}})
    assert config.network == POLICY and config.egress == POLICY
    for wrong in ("yes", 1, None):
        # A ValidationError, as for the config's other fields, saying what is accepted.
        with pytest.raises(ValidationError, match="network must be False, True or a NetworkPolicy"):
            KubernetesConfig(network=wrong)
    with pytest.raises(ValidationError, match="network: not a NetworkPolicy: alow"):
        KubernetesConfig(network={"alow": ["pypi.org"]})


def test_a_policy_pod_is_denied_like_a_network_off_one(tmp_path: Path) -> None:
    config = KubernetesConfig(network=POLICY)
    pod = pod_spec(config)
    assert pod["metadata"]["labels"][NETWORK_LABEL] == "off"
    assert network_policy_in_force(network_policy(config), pod)
    assert pod_spec(KubernetesConfig()) == pod  # the same Pod as network=False: a warm pool serves both
    moved, _ = workspace_config(config, tmp_path)  # the policy survives the config's round trip
    assert moved.network == POLICY
    api = ClusterWithoutClaims()
    KubernetesBackend(config, api=api)._network_policy()  # type: ignore[arg-type]
    assert api.policies and api.policies[0]["kind"] == "NetworkPolicy"


def test_kubernetes_set_network_refuses_what_a_pod_cannot_change() -> None:
    api = ClusterWithoutClaims()
    with KubernetesBackend(KubernetesConfig(network=POLICY), api=api) as backend:  # type: ignore[arg-type]
        session = backend.session()
        with pytest.raises(PolicyNotEnforceableError, match="cannot be given the cluster network"):
            session.set_network(True)
        with pytest.raises(InvalidRequestError, match="set_network takes False, True or a NetworkPolicy"):
            session.set_network("off")  # type: ignore[arg-type]
        assert session.network == POLICY
    with KubernetesBackend(KubernetesConfig(network=True), api=api) as backend:  # type: ignore[arg-type]
        session = backend.session()
        session.set_network(True)  # kept as it is
        with pytest.raises(PolicyNotEnforceableError, match="cannot be taken from a running Pod"):
            session.set_network(False)


def test_the_engines_own_host_is_refused_to_a_name_that_resolves_to_it(
    pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A remote engine's (or API server's) address is refused by the relay, not connected (issue 23)."""

    def engine_dns(*args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("8.8.8.8", 443))]

    monkeypatch.setattr(
        "adk_sandbox.executor.channel.egress.relay", lambda *a, **k: relay(*a, getaddrinfo=engine_dns, **k)
    )
    sandbox, host = pair
    egress = SessionEgress(NetworkPolicy(allow=["engine.test"]), engine_hosts=("8.8.8.8",))
    sandbox.sendall(b"CONNECT engine.test:443 HTTP/1.1\r\nHost: engine.test:443\r\n\r\n")
    egress.handle(host)  # type: ignore[arg-type]  # a socket is a ByteStream
    answer = sandbox.recv(65536)
    assert answer.startswith(b"HTTP/1.1 403 ") and ENGINE_REASON.encode() in answer
    (entry,) = egress.snapshot().entries
    assert (entry.host, entry.decision, entry.rule) == ("engine.test", "refused", "address")


def test_the_sessions_pass_their_engines_machine() -> None:
    """The Kubernetes session refuses its API server's address; a loopback one adds nothing."""

    class RemoteServer(ClusterWithoutClaims):
        def server_host(self) -> str | None:
            return "9.9.9.9"

    with KubernetesBackend(KubernetesConfig(network=POLICY), api=RemoteServer()) as backend:  # type: ignore[arg-type]
        session = backend.session()
        assert ipaddress.ip_address("9.9.9.9") in session._egress.infrastructure()
    assert (
        ipaddress.ip_address("127.0.0.1")
        not in SessionEgress(POLICY, engine_hosts=("127.0.0.1",)).infrastructure()
    )
