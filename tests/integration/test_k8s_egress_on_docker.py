"""A Kubernetes session under a NetworkPolicy, run for real on the stand-in: the proxy over ``pods/exec``.

No cluster can exist here, so the Pod is a real hardened container made from the session's own Pod spec,
with network none, and ``pods/exec`` a real ``docker exec`` spoken in the v5 channel framing
(tests/integration/k8s_on_docker.py). The session's agent serves the proxy endpoint on the Pod's
``127.0.0.1``; each connection crosses the exec's stdin and stdout to this process, whose relay
(:class:`~adk_sandbox.executor.channel.egress.SessionEgress`, the Docker session's own) decides and
connects. The servers are loopback servers of this process, reached only through ``hosts`` pins (as in
``test_docker_egress.py``); each records what it received, so "nothing was delivered" is checked there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from adk_sandbox.executor import ExecRequest, ExecResult, Language
from adk_sandbox.executor.backends.docker.images import BASE_IMAGE
from adk_sandbox.executor.backends.kubernetes import KubernetesBackend, KubernetesConfig, KubernetesSession
from adk_sandbox.executor.backends.kubernetes._spec import NETWORK_LABEL
from adk_sandbox.executor.errors import PolicyNotEnforceableError
from adk_sandbox.executor.network.intercept import SANDBOX_CA_PATH
from adk_sandbox.executor.network.policy import NetworkPolicy
from tests.integration.egress_servers import BODY, Upstream, make_certificate, server_context
from tests.integration.k8s_on_docker import DockerPodApi, docker_pod_api
from tests.integration.test_docker_egress import FETCH
from tests.integration.test_docker_set_network import DOWNLOAD, SlowServer
from tests.unit.test_network_intercept import BODY as API_BODY
from tests.unit.test_network_intercept import TlsServer, make_test_pki
from tests.unit.test_network_intercept import server_context as api_context

pytestmark = [pytest.mark.docker]

SECRET = "Bearer s3cr3t-for-the-k8s-stand-in-only"  # noqa: S105 - a test credential


@pytest.fixture
def pod_api() -> Iterator[DockerPodApi]:
    """The stand-in API; every container it made is gone after the test (checked)."""
    with docker_pod_api() as api:
        yield api


def backend_with(api: DockerPodApi, network: bool | NetworkPolicy) -> KubernetesBackend:
    return KubernetesBackend(KubernetesConfig(image=BASE_IMAGE, workspace_mb=64, network=network), api=api)


def python(session: KubernetesSession, code: str) -> ExecResult:
    return session.execute(ExecRequest(language=Language.PYTHON, code=code, timeout=60))


def wait_for(condition: object, timeout: float = 20.0) -> None:
    assert callable(condition)
    until = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < until, "timed out waiting"
        time.sleep(0.05)


BYPASS = """
import socket
for target in TARGETS:
    try:
        socket.create_connection(target, timeout=3).close(); print('CONNECTED', target)
    except OSError as error:
        print('refused', target, type(error).__name__)
"""


def test_fetches_go_through_the_policy_and_the_rest_fails_closed(
    pod_api: DockerPodApi, tmp_path: Path
) -> None:
    upstream, denied = Upstream(), Upstream()
    tls = Upstream(server_context(make_certificate(tmp_path)))
    policy = NetworkPolicy(
        allow=[f"allowed.test:{upstream.port}", f"allowed.test:{tls.port}"],
        hosts={"allowed.test": ["127.0.0.1"], "denied.test": ["127.0.0.1"]},
    )
    try:
        with backend_with(pod_api, policy) as backend, backend.session() as session:
            env = python(session, "import os; print(os.environ['HTTP_PROXY'], os.environ['NO_PROXY'])")
            assert env.stdout.startswith("http://127.0.0.1:") and "localhost,127.0.0.1" in env.stdout, env
            # The Pod is denied as with network=False: the default-deny policy selects it.
            (pod,) = pod_api.created
            assert pod["metadata"]["labels"][NETWORK_LABEL] == "off"

            allowed = python(session, f"URL = 'http://allowed.test:{upstream.port}/file'\n{FETCH}")
            assert allowed.stdout == "200 " + BODY.decode(), allowed
            assert upstream.received[0].startswith(b"GET /file HTTP/1.1\r\n")

            # HTTPS through CONNECT: the sandbox's client verifies the real server's own certificate.
            pem = (tmp_path / "cert.pem").read_text()
            secure = python(
                session,
                f"import ssl, urllib.request\ncontext = ssl.create_default_context(cadata={pem!r})\n"
                f"url = 'https://allowed.test:{tls.port}/secure'\n"
                "with urllib.request.urlopen(url, context=context, timeout=20) as answer:\n"
                "    print(answer.status, answer.read().decode(), end='')\n",
            )
            assert secure.stdout == "200 " + BODY.decode(), secure
            assert tls.received[0].startswith(b"GET /secure HTTP/1.1\r\n")

            refused = python(session, f"URL = 'http://denied.test:{denied.port}/'\n{FETCH}")
            assert refused.stdout.startswith("403 ") and "no rule allows it" in refused.stdout, refused
            assert denied.received == [] and denied.raw == []

            # Ignoring the proxy (curl --noproxy '*'): no name resolves, 127.0.0.1 is the Pod's own.
            targets = [("allowed.test", upstream.port), ("127.0.0.1", upstream.port), ("8.8.8.8", 53)]
            bypass = python(session, f"TARGETS = {targets!r}\n{BYPASS}")
            assert "CONNECTED" not in bypass.stdout and bypass.stdout.count("refused") == 3, bypass
            assert len(upstream.received) == 1

            decisions = sorted((entry.host, entry.decision) for entry in session.network_log().entries)
            assert decisions == [
                ("allowed.test", "allowed"),
                ("allowed.test", "allowed"),
                ("denied.test", "refused"),
            ]
            capabilities = session.capabilities()
            assert (capabilities.network, capabilities.network_policy) == (True, policy)
            assert session.network == policy
    finally:
        for server in (upstream, denied, tls):
            server.close()


def test_set_network_cuts_a_live_download_then_refuses_and_switches_back(pod_api: DockerPodApi) -> None:
    slow, other = SlowServer(), Upstream()
    policy = NetworkPolicy(
        allow=[f"allowed.test:{slow.port}", f"allowed.test:{other.port}"],
        hosts={"allowed.test": ["127.0.0.1"]},
    )
    try:
        # Created with no network at all: the policy is given at run time (the agent starts serving).
        with backend_with(pod_api, False) as backend, backend.session() as session:
            assert session.capabilities().network_policy is None
            session.set_network(policy)
            assert session.capabilities().network_policy == policy

            results: list[ExecResult] = []
            code = f"URL = 'http://allowed.test:{slow.port}/slow'\n{DOWNLOAD}"
            thread = threading.Thread(target=lambda: results.append(python(session, code)), daemon=True)
            thread.start()
            wait_for(lambda: slow.sent > 8 * 1024 and session.open_connections())
            assert session.open_connections() == [("allowed.test", slow.port)]

            started = time.monotonic()
            session.set_network(False)
            thread.join(timeout=15)
            assert not thread.is_alive() and time.monotonic() - started < 10
            assert results[0].stdout.startswith("DROPPED "), results[0]
            wait_for(slow.cut.is_set)  # the server saw it go too
            assert session.open_connections() == [] and session.network is False

            # Off: a new request gets a 403 that says why, and nothing reaches the server.
            refused = python(session, f"URL = 'http://allowed.test:{other.port}/'\n{FETCH}")
            assert refused.stdout.startswith("403 ") and "network off" in refused.stdout, refused
            assert other.received == [] and other.raw == []
            assert session.capabilities().network_policy is None

            # The cluster network cannot be given to a Pod the default-deny policy selects.
            with pytest.raises(PolicyNotEnforceableError, match="cluster network"):
                session.set_network(True)

            session.set_network(policy)
            again = python(session, f"URL = 'http://allowed.test:{other.port}/again'\n{FETCH}")
            assert again.stdout == "200 " + BODY.decode(), again
            cut = [entry for entry in session.network_log().entries if entry.port == slow.port]
            assert len(cut) == 1 and "closed: the sandbox's network was turned off" in cut[0].detail
    finally:
        slow.close()
        other.close()


def test_headers_are_injected_on_this_host_and_never_enter_the_pod(
    pod_api: DockerPodApi, tmp_path: Path
) -> None:
    test_ca, cert, key = make_test_pki("api.test")
    api = TlsServer(api_context(cert, key, tmp_path))
    policy = NetworkPolicy(
        allow=[f"api.test:{api.port}"],
        hosts={"api.test": ["127.0.0.1"]},
        headers={"api.test": {"Authorization": SECRET}},
        upstream_ca=(test_ca,),
    )
    try:
        with backend_with(pod_api, policy) as backend, backend.session() as session:
            # The default trust: the bundle the session wrote in the Pod, named by SSL_CERT_FILE.
            code = (
                "import os, urllib.request\n"
                f"request = urllib.request.Request('https://api.test:{api.port}/v1', "
                "headers={'Authorization': 'Bearer forged'})\n"
                "with urllib.request.urlopen(request, timeout=20) as answer:\n"
                "    print(answer.status, answer.read().decode().strip())\n"
                "print(os.environ['SSL_CERT_FILE'], 'Bearer' in repr(dict(os.environ)))\n"
            )
            result = python(session, code)
            assert result.stdout.splitlines() == [
                f"200 {API_BODY.decode().strip()}",
                f"{SANDBOX_CA_PATH} False",
            ], result
            (got,) = api.received
            authorizations = [h for h in got.split(b"\r\n") if h.lower().startswith(b"authorization:")]
            assert authorizations == [f"Authorization: {SECRET}".encode()]
            bundle = session.files.read_bytes(SANDBOX_CA_PATH, limit=8 << 20)
            assert b"PRIVATE KEY" not in bundle and SECRET.encode() not in bundle
            (entry,) = session.network_log().entries
            assert "headers injected (Authorization)" in entry.detail
    finally:
        api.close()
