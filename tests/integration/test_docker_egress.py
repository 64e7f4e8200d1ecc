"""A Docker session under a NetworkPolicy: network none, the agent's proxy on 127.0.0.1, the host's relay.

The servers are loopback servers these tests start on the host, reached only through ``hosts`` pins; each
records what it received, so "nothing was delivered" is checked on the server. The base image has python3
but no curl, so the clients are Python's ``urllib`` (which honours the proxy variables) and raw sockets.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from adk_sandbox.executor import ExecRequest, ExecResult, Language
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from adk_sandbox.executor.network.policy import NetworkPolicy
from tests.conftest import require
from tests.integration.egress_servers import BODY, Upstream, make_certificate, server_context

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_certificate(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    yield server
    server.close()


@pytest.fixture
def tls_upstream(certificate: tuple[Path, Path]) -> Iterator[Upstream]:
    server = Upstream(server_context(certificate))
    yield server
    server.close()


def policy_for(*servers: Upstream) -> NetworkPolicy:
    return NetworkPolicy(
        allow=[f"allowed.test:{server.port}" for server in servers], hosts={"allowed.test": ["127.0.0.1"]}
    )


@pytest.fixture(params=["runc", "runsc"])
def runtime(request: pytest.FixtureRequest, docker_backend: DockerBackend) -> str | None:
    if request.param == "runsc":
        runtimes = docker_backend._client.info().get("Runtimes", {})
        require("runsc" in runtimes, "gVisor (runsc) is not installed in this engine")
        return "runsc"
    return None


def session_for(policy: NetworkPolicy, runtime: str | None) -> Iterator[DockerSession]:
    backend = DockerBackend(network=policy, runtime=runtime)
    try:
        with backend.session() as session:
            yield session
    finally:
        backend.close()


def python(session: DockerSession, code: str) -> ExecResult:
    return session.execute(ExecRequest(language=Language.PYTHON, code=code, timeout=60))


FETCH = """
import sys, urllib.request, urllib.error
try:
    with urllib.request.urlopen(sys.argv[1] if len(sys.argv) > 1 else URL, timeout=20) as answer:
        print(answer.status, answer.read().decode(), end="")
except urllib.error.HTTPError as error:
    print(error.code, error.read().decode(), end="")
"""


def test_http_through_the_policy_and_the_bypasses_fail_closed(
    runtime: str | None, upstream: Upstream
) -> None:
    denied = Upstream()
    try:
        policy = NetworkPolicy(
            allow=[f"allowed.test:{upstream.port}"],
            hosts={"allowed.test": ["127.0.0.1"], "denied.test": ["127.0.0.1"]},
        )
        for session in session_for(policy, runtime):
            env = python(session, "import os; print(os.environ['HTTP_PROXY'], os.environ['NO_PROXY'])")
            assert env.stdout.startswith("http://127.0.0.1:") and "localhost,127.0.0.1" in env.stdout

            allowed = python(session, f"URL = 'http://allowed.test:{upstream.port}/file'\n{FETCH}")
            assert allowed.stdout == "200 " + BODY.decode(), allowed
            assert upstream.received and upstream.received[0].startswith(b"GET /file HTTP/1.1\r\n")

            refused = python(session, f"URL = 'http://denied.test:{denied.port}/'\n{FETCH}")
            assert refused.stdout.startswith("403 "), refused
            assert "no rule allows it" in refused.stdout
            assert denied.received == []

            # Ignoring the proxy (curl --noproxy '*'): no name resolves, and 127.0.0.1 is the sandbox's own.
            bypass = python(
                session,
                "import socket\n"
                f"for target in [('allowed.test', {upstream.port}), ('127.0.0.1', {upstream.port}), "
                f"('172.17.0.1', {upstream.port}), ('8.8.8.8', 53)]:\n"
                "    try:\n"
                "        socket.create_connection(target, timeout=3).close(); print('CONNECTED', target)\n"
                "    except OSError as error:\n"
                "        print('refused', target, type(error).__name__)\n",
            )
            assert "CONNECTED" not in bypass.stdout and bypass.stdout.count("refused") == 4, bypass
            assert len(upstream.received) == 1
            log = session.network_log()
            assert sorted(entry.decision for entry in log.entries) == ["allowed", "refused"]
            # Reported as it is: no route out (network denied), and the policy the host's proxy carries.
            capabilities = session.capabilities()
            assert (capabilities.network, capabilities.network_policy) == (True, policy)
    finally:
        denied.close()


def test_https_through_connect_verifies_the_real_server(
    runtime: str | None, tls_upstream: Upstream, certificate: tuple[Path, Path]
) -> None:
    pem = certificate[0].read_text()
    for session in session_for(policy_for(tls_upstream), runtime):
        code = (
            f"import ssl, urllib.request\nCA = {pem!r}\n"
            "context = ssl.create_default_context(cadata=CA)\n"
            f"url = 'https://allowed.test:{tls_upstream.port}/secure'\n"
            "with urllib.request.urlopen(url, context=context, timeout=20) as answer:\n"
            "    print(answer.status, answer.read().decode(), end='')\n"
        )
        result = python(session, code)
        assert result.stdout == "200 " + BODY.decode(), result
        assert tls_upstream.received[0].startswith(b"GET /secure HTTP/1.1\r\n")
