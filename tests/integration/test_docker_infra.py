"""DockerBackend plumbing against the real engine: what a backend holds, what errors its daemon calls
raise, which connection they use, and what a container that cannot start reports (issue 10).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from adk_sandbox.executor import ExecRequest, ExecutorError, Language, ResourceLimits, SandboxFailedError
from adk_sandbox.executor.backend import SandboxBackend
from adk_sandbox.executor.backends.docker import BASE_IMAGE, DockerBackend, images
from adk_sandbox.executor.backends.docker._daemon import connect
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
        assert backend.sessions() == ()
        assert len(backend._sessions) <= 1  # at most the last one closed: dropped by the next open


def test_backend_close_still_closes_the_sessions_left_open(owned_workspace: Path) -> None:
    backend = DockerBackend()
    session = backend.session(workspace=owned_workspace)
    container_id = session.container_id
    assert backend.sessions() == (session,) and backend.session_by_id(session.session_id) is session
    client = connect()
    try:
        assert container_id in project_containers(client, os.getpid())
        backend.close()
        assert container_id not in project_containers(client, os.getpid())
    finally:
        client.close()
    assert backend.sessions() == () and session.closed
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


# -- image code raises this library's errors ---------------------------------------------------------


def test_an_invalid_base_image_reference_is_a_library_error() -> None:
    # The daemon answers 400 (not 404) to the inspect: docker-py raised a bare APIError here before.
    with pytest.raises(ExecutorError, match="invalid reference format"):
        images.build_images(base_image="NOT A VALID REF!!", root=images.images_dir())


def test_images_build_with_an_invalid_base_image_fails_in_one_line_without_a_traceback() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "adk_sandbox", "images", "build", "--base-image", "NOT A VALID REF!!"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    errors = done.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("adk-sandbox: error:"), done.stderr
    assert "invalid reference format" in errors[0]


@contextlib.contextmanager
def scratch_images(tmp_path: Path, base_body: str, rust_body: str) -> Iterator[tuple[Path, str]]:
    """Two tiny build contexts under a unique test tag prefix; every image they made removed afterwards."""
    prefix = f"adk-sandbox-test-{uuid.uuid4().hex[:8]}"
    root = tmp_path / "images"
    for name, body in (("base", base_body), ("rust", rust_body)):
        (root / name).mkdir(parents=True)
        (root / name / "Dockerfile").write_text(f"ARG BASE_IMAGE=none\nFROM ${{BASE_IMAGE}}\n{body}\n")
    client = docker.from_env()
    try:
        yield root, prefix
    finally:
        for image in client.images.list(name=f"{prefix}/*"):
            for tag in image.tags:
                with contextlib.suppress(docker.errors.APIError):
                    client.images.remove(tag)
        remaining = client.images.list(name=f"{prefix}/*")
        client.close()
        assert not remaining


def test_an_invalid_version_tag_is_a_library_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Checking and making the version tag: before, the daemon's 400 escaped as a bare APIError.
    monkeypatch.setattr(images, "_version", lambda: "not a valid tag!")
    with scratch_images(tmp_path, "LABEL step=base", "LABEL step=rust") as (root, prefix):
        with pytest.raises(ExecutorError, match="invalid reference format") as failure:
            images.build_images(base_image=BASE_IMAGE, root=root, tag_prefix=prefix)
        assert "\n" not in str(failure.value)


def test_a_refused_tag_is_an_image_build_error() -> None:
    client = connect()
    try:
        image_id = str(client.api.inspect_image(BASE_IMAGE)["Id"])
        with pytest.raises(images.ImageBuildError, match=r"tagging .* as NOT VALID:x failed: .*invalid"):
            images._tag(client, image_id, "NOT VALID:x")
    finally:
        client.close()


def test_a_broken_dockerfile_is_an_image_build_error(tmp_path: Path) -> None:
    with (
        scratch_images(tmp_path, "FROMM nothing", "LABEL step=rust") as (root, prefix),
        pytest.raises(images.ImageBuildError, match=f"building {prefix}/base:latest failed"),
    ):
        images.build_images(base_image=BASE_IMAGE, root=root, tag_prefix=prefix)


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
