"""Egress by domain on the real cluster: the proxy over ``pods/exec`` is the only way out of a Pod.

The cluster's bridge CNI ignores NetworkPolicy, so the default-deny policy alone would stop nothing: a Pod
would reach the node (its bridge address, where the kubelet and this host's services listen). What stops
it is the Pod's interfaces being down (the ``network-off`` init container). The servers here record every
connection, so "nothing was delivered" is checked on the server: an allowed one on this host's loopback
(reached through a ``hosts`` pin, as the policy says), and one on the node's bridge address that only a
direct connection from the Pod could reach. A design relying on the NetworkPolicy alone fails the bypass.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from adk_sandbox.executor import ExecRequest, ExecResult, Language
from adk_sandbox.executor.backends.kubernetes import KubernetesBackend, KubernetesSession
from adk_sandbox.executor.network.policy import NetworkPolicy
from tests.integration.egress_servers import BODY, Upstream
from tests.integration.k8s_cluster import CONTEXT, cluster_config, require_cluster
from tests.integration.test_docker_egress import FETCH
from tests.integration.test_k8s_egress_on_docker import BYPASS

pytestmark = require_cluster()

NODE_ADDRESS = "10.244.0.1"  # the one-node cluster's bridge: the node as its Pods see it (../shared/k8s)


@pytest.fixture
def servers() -> Iterator[tuple[Upstream, Upstream]]:
    allowed, on_node = Upstream(), Upstream(host=NODE_ADDRESS)
    yield allowed, on_node
    allowed.close()
    on_node.close()


def python(session: KubernetesSession, code: str) -> ExecResult:
    return session.execute(ExecRequest(language=Language.PYTHON, code=code, timeout=60))


def test_names_go_through_the_policy_and_every_bypass_fails(servers: tuple[Upstream, Upstream]) -> None:
    allowed, on_node = servers
    policy = NetworkPolicy(
        allow=[f"allowed.test:{allowed.port}"],
        hosts={"allowed.test": ["127.0.0.1"], "denied.test": ["127.0.0.1"]},
    )
    config = cluster_config(network=policy)
    with KubernetesBackend(config, context=CONTEXT) as backend, backend.session() as session:
        fetched = python(session, f"URL = 'http://allowed.test:{allowed.port}/file'\n{FETCH}")
        assert fetched.stdout == "200 " + BODY.decode(), fetched
        assert allowed.received[0].startswith(b"GET /file HTTP/1.1\r\n")

        refused = python(session, f"URL = 'http://denied.test:{allowed.port}/'\n{FETCH}")
        assert refused.stdout.startswith("403 ") and "no rule allows it" in refused.stdout, refused

        # Around the proxy: the node's address (its kubelet, the server on it), a public resolver.
        targets = [(NODE_ADDRESS, on_node.port), (NODE_ADDRESS, 10250), ("8.8.8.8", 53)]
        bypass = python(session, f"TARGETS = {targets!r}\n{BYPASS}")
        assert "CONNECTED" not in bypass.stdout and bypass.stdout.count("refused") == 3, bypass
        assert on_node.raw == [] and len(allowed.received) == 1

        # Off at run time: the proxy refuses too, and still nothing goes around it.
        session.set_network(False)
        off = python(session, f"URL = 'http://allowed.test:{allowed.port}/again'\n{FETCH}")
        assert "200" not in off.stdout, off
        assert len(allowed.received) == 1
        assert session.capabilities().network is True  # reported denied: the probe found no route


def test_network_true_pods_keep_the_cluster_network(servers: tuple[Upstream, Upstream]) -> None:
    """The control: with ``network=True`` the same direct connection reaches the node's server."""
    _, on_node = servers
    with (
        KubernetesBackend(cluster_config(network=True), context=CONTEXT) as backend,
        backend.session() as session,
    ):
        for _ in range(5):  # a Pod just started may wait on its first ARP exchange with the node: again
            reached = python(session, f"TARGETS = {[(NODE_ADDRESS, on_node.port)]!r}\n{BYPASS}")
            if "CONNECTED" in reached.stdout:
                break
        assert "CONNECTED" in reached.stdout, reached
        assert session.capabilities().network is False
