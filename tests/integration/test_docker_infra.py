"""DockerBackend plumbing against the real engine: what a backend holds, what errors its daemon calls
raise, which connection they use, and what a container that cannot start reports (issue 10).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from executor import ExecRequest, Language, ResourceLimits, SandboxFailedError
from executor.backend import SandboxBackend
from executor.backends.docker import DockerBackend
from executor.backends.docker._daemon import connect
from tests.conftest import project_containers

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]


def echo(backend: SandboxBackend, text: str = "hi") -> str:
    return backend.execute(ExecRequest(language=Language.COMMAND, code=f"echo {text}", timeout=30)).stdout


# -- a backend holds only its open sessions ----------------------------------------------------------


def test_closed_sessions_are_dropped_by_the_backend(owned_workspace: Path) -> None:
    with DockerBackend() as backend:
        for _ in range(50):
            backend.session(workspace=owned_workspace).close()  # never started: no container
        for _ in range(3):
            with backend.session(workspace=owned_workspace) as session:
                assert echo(session) == "hi\n"
        assert echo(backend) == "hi\n"  # a throw-away session
        assert len(backend._sessions) == 0


def test_backend_close_still_closes_the_sessions_left_open(owned_workspace: Path) -> None:
    backend = DockerBackend()
    session = backend.session(workspace=owned_workspace)
    container_id = session.container_id
    assert len(backend._sessions) == 1
    client = connect()
    try:
        assert container_id in project_containers(client, os.getpid())
        backend.close()
        assert container_id not in project_containers(client, os.getpid())
    finally:
        client.close()
    assert len(backend._sessions) == 0
    with pytest.raises(SandboxFailedError, match="closed"):
        session.start()


# -- the daemon connection ignores proxy and CA settings of the environment -------------------------


def test_a_backend_works_with_garbage_proxy_and_ca_variables(
    monkeypatch: pytest.MonkeyPatch, owned_workspace: Path
) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/nonexistent/ca-bundle.pem")
    monkeypatch.setenv("CURL_CA_BUNDLE", "/nonexistent/ca-bundle.pem")
    with DockerBackend() as backend:
        assert backend._client.api.trust_env is False
        with backend.session(workspace=owned_workspace) as session:
            assert echo(session, "through-the-socket") == "through-the-socket\n"


# -- a container that cannot start says why --------------------------------------------------------


def test_a_container_the_runtime_cannot_start_reports_the_daemons_reason(owned_workspace: Path) -> None:
    # Accepted at create, refused at start: a nofile limit above the kernel's fs.nr_open (runc cannot set
    # the rlimit). Before, the start was retried on the 500, found the container erased by auto_remove
    # and said "the sandbox container is gone".
    with open("/proc/sys/fs/nr_open") as handle:
        too_many = int(handle.read()) * 2
    with DockerBackend(limits=ResourceLimits(nofile=too_many)) as backend:
        before = set(project_containers(backend._client, os.getpid()))
        with pytest.raises(SandboxFailedError) as failure:
            backend.execute(ExecRequest(language=Language.COMMAND, code="true", timeout=30))
        message = str(failure.value)
        assert "could not start" in message and "rlimit" in message, message
        assert "is gone" not in message
        assert set(project_containers(backend._client, os.getpid())) <= before
