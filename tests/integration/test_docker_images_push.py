"""Images on a remote engine (issue 13): ``images push`` and the session's image-id check.

One private engine (:mod:`tests.integration.private_engine`) over TCP+TLS for the module. The image pushed
is a tiny one made here with ``docker import`` of the host's static busybox (as
:mod:`tests.integration.test_docker_static_agent` does), so a push takes well under a second; a session
runs on it with the static agent. Nothing is left on either engine at the end.
"""

from __future__ import annotations

import os
import subprocess
import warnings
from collections.abc import Iterator

import docker.errors
import pytest

from adk_sandbox.executor import ExecRequest, Language
from adk_sandbox.executor.backends.docker import DockerBackend
from adk_sandbox.executor.backends.docker.images import ImageMismatchWarning, ImagePushError, push_images
from adk_sandbox.executor.cli import _doctor_engine, main
from adk_sandbox.executor.errors import PolicyNotEnforceableError
from tests.conftest import require
from tests.integration.private_engine import DOCKERD, PrivateEngine, PrivateEngineError
from tests.integration.test_docker_static_agent import _busybox_rootfs

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]

TAG = f"adk-sandbox-test/push:{os.getpid()}"
OTHER_TAG = f"adk-sandbox-test/push-other:{os.getpid()}"


def _import(host: str | None, tag: str, change: str) -> str:
    """``docker [-H host] import`` of the busybox rootfs as ``tag``; its id."""
    where = ["-H", host] if host else []
    subprocess.run(
        ["docker", *where, "import", "--change", "ENV PATH=/bin", "--change", change, "-", tag],
        input=_busybox_rootfs(), check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    inspect = ["docker", *where, "image", "inspect", "-f", "{{.Id}}", tag]
    return subprocess.run(inspect, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def local_id() -> Iterator[str]:
    """The tiny image on this machine's engine (also under OTHER_TAG); removed at the end."""
    image_id = _import(None, TAG, "ENV ADK_PUSH_TEST=local")
    subprocess.run(["docker", "tag", TAG, OTHER_TAG], check=True, capture_output=True)
    try:
        yield image_id
    finally:
        subprocess.run(["docker", "rmi", "-f", TAG, OTHER_TAG], capture_output=True, check=False)


@pytest.fixture(scope="module")
def remote() -> Iterator[PrivateEngine]:
    """The private engine over TCP+TLS, started once for the module."""
    require(os.geteuid() == 0 and os.access(DOCKERD, os.X_OK), f"a private dockerd needs root and {DOCKERD}")
    engine = PrivateEngine(tls=True, data_in_memory=True)
    try:
        engine.start()
    except PrivateEngineError as exc:
        engine.destroy()
        require(False, f"the private Docker engine could not start: {exc}")
    try:
        yield engine
        assert engine.containers() == [], "a container was left on the remote engine"
    finally:
        engine.destroy()
        assert engine.leftover_processes() == []


def _remote_id(remote: PrivateEngine, tag: str) -> str | None:
    client = remote.client()
    try:
        return str(client.api.inspect_image(tag)["Id"])
    except docker.errors.ImageNotFound:
        return None
    finally:
        client.close()


def _echo(backend: DockerBackend) -> str:
    with backend.session() as session:
        result = session.execute(ExecRequest(language=Language.COMMAND, code="echo ran", timeout=20))
        assert session.image_id.startswith("sha256:")
        return result.stdout


def test_push_copies_the_image_with_its_id_then_skips_it(remote: PrivateEngine, local_id: str) -> None:
    assert _remote_id(remote, TAG) is None
    lines: list[str] = []
    [first] = push_images(remote.engine(), [TAG], progress=lines.append)
    assert (first.action, first.image_id) == ("pushed", local_id)
    assert first.bytes_sent > 500_000  # the static busybox alone is ~1-2 MB: the archive really travelled
    assert _remote_id(remote, TAG) == local_id
    assert any("MB sent" in line for line in lines), lines

    [second] = push_images(remote.engine(), [TAG], progress=lines.append)
    assert (second.action, second.bytes_sent) == ("up to date", 0)
    assert lines[-1].startswith(f"==> {TAG}: up to date")


def test_cli_push_tags_an_image_the_engine_has_under_another_name(
    remote: PrivateEngine, local_id: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    push_images(remote.engine(), [TAG])  # idempotent: the test may run alone
    monkeypatch.setenv("DOCKER_TLS_VERIFY", "1")
    monkeypatch.setenv("DOCKER_CERT_PATH", str(remote.tls_dir))
    assert main(["images", "push", "--engine", remote.tcp_host, OTHER_TAG]) == 0
    out = capsys.readouterr().out
    assert "under another name; tagged it" in out, out
    assert f"pushed: {OTHER_TAG}" in out
    assert _remote_id(remote, OTHER_TAG) == local_id
    assert main(["images", "push", "--engine", remote.tcp_host, OTHER_TAG, TAG]) == 0
    assert "all images already there" in capsys.readouterr().out


def test_push_of_a_missing_image_says_so(remote: PrivateEngine) -> None:
    with pytest.raises(ImagePushError, match="no image 'adk-sandbox-test/absent:0' on this machine"):
        push_images(remote.engine(), ["adk-sandbox-test/absent:0"])


def test_a_pinned_image_id_is_enforced_on_the_remote_engine(remote: PrivateEngine, local_id: str) -> None:
    push_images(remote.engine(), [TAG])
    with DockerBackend(image=TAG, engine=remote.engine(), image_id=local_id) as backend:
        assert _echo(backend) == "ran\n"
    wrong = "sha256:" + "0" * 64
    refused = r"runs image \w{12} .*not 000000000000.*Nothing ran"
    with (
        DockerBackend(image=TAG, engine=remote.engine(), image_id=wrong) as backend,
        pytest.raises(PolicyNotEnforceableError, match=refused),
    ):
        _echo(backend)


def test_a_remote_image_differing_from_the_local_one_warns(remote: PrivateEngine, local_id: str) -> None:
    # The same name on the remote engine, but another image (another ENV: another config, another id).
    remote_id = _import(remote.host, OTHER_TAG, "ENV ADK_PUSH_TEST=remote")
    assert remote_id != local_id
    try:
        with DockerBackend(image=OTHER_TAG, engine=remote.engine()) as backend:
            assert backend.expect_image is not None and backend.expect_image.image_id == local_id
            with pytest.warns(ImageMismatchWarning, match="adk-sandbox images push --engine"):
                assert _echo(backend) == "ran\n"  # warned, not refused: the engine's own build is allowed
        push_images(remote.engine(), [OTHER_TAG])  # makes them equal again: no warning
        with DockerBackend(image=OTHER_TAG, engine=remote.engine()) as backend, warnings.catch_warnings():
            warnings.simplefilter("error", ImageMismatchWarning)
            assert _echo(backend) == "ran\n"
    finally:
        remove = ["docker", "-H", remote.host, "rmi", "-f", OTHER_TAG]
        subprocess.run(remove, capture_output=True, check=False)


def test_doctor_names_a_remote_engine_and_its_dialect(
    remote: PrivateEngine, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", remote.tcp_host)
    monkeypatch.setenv("DOCKER_TLS_VERIFY", "1")
    monkeypatch.setenv("DOCKER_CERT_PATH", str(remote.tls_dir))
    _doctor_engine()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["engine", "tcp+TLS", remote.tcp_host, "over", "TLS", "(remote)"], lines
    assert lines[1].split()[:3] == ["dialect", "docker", "docker"], lines
