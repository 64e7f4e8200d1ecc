"""A Kubernetes session with a host workspace, run for real: the mirror over ``pods/exec`` into a stand-in.

No cluster can exist here, so the Pod is a real hardened container made from the session's own Pod spec
and ``pods/exec`` a real ``docker exec`` spoken in the v5 channel framing (tests/integration/
k8s_on_docker.py); everything of the session above the API calls is the real one: ``pod_spec`` with the
workspace at the host path, ``pod_violations``, the ``ExecBridge``, the agent channel, the start-up probe
and the mirror. The hostile pull-back, the disk bomb and the edit cases run here too, parametrised with the
Docker ones in test_docker_mirror.py (its ``mirrored`` fixture).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from executor import ExecRequest, ExecResult, Language
from executor.backends.kubernetes import KubernetesSession
from executor.errors import PolicyNotEnforceableError
from tests.integration.k8s_on_docker import DockerPodApi, backend_on, docker_pod_api

pytestmark = [pytest.mark.docker]


@pytest.fixture
def pod_api() -> Iterator[DockerPodApi]:
    """The stand-in API; every container it made is gone after the test (checked)."""
    with docker_pod_api() as api:
        yield api


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A workspace owned by uid 1000 (the Pod's user) inside a parent watched for escapes (``outside``)."""
    root = tmp_path / "ws"
    root.mkdir()
    (tmp_path / "outside").mkdir()
    os.chown(root, 1000, 1000)
    return root


def sh(session: KubernetesSession, code: str, timeout: float = 60) -> ExecResult:
    return session.execute(ExecRequest(language=Language.COMMAND, code=code, timeout=timeout))


def test_the_workspace_travels_both_ways_and_close_brings_the_last_back(
    pod_api: DockerPodApi, workspace: Path
) -> None:
    (workspace / "keep.txt").write_text("keep\n")
    (workspace / "sub").mkdir()
    (workspace / "sub" / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (workspace / "sub" / "run.sh").chmod(0o755)
    (workspace / "gone.txt").write_text("to delete\n")
    with backend_on(pod_api) as backend, backend.session(workspace=workspace) as session:
        first = sh(
            session,
            f"pwd; id -u; sub/run.sh; cat keep.txt; grep -c ' {workspace} tmpfs ' /proc/mounts",
        )
        assert first.exit_code == 0, first.stderr
        # At the host's own path, as the Pod's user, in the emptyDir (a tmpfs), not the host's directory.
        assert first.stdout.split() == [str(workspace), "1000", "ran", "keep", "1"]
        (pod,) = pod_api.created
        assert pod["spec"]["containers"][0]["workingDir"] == str(workspace)
        assert session.capabilities().workspace == "mirror"
        made = sh(
            session, "echo new > new.txt; mkdir -p d/e; echo deep > d/e/f; rm gone.txt; chmod 600 keep.txt"
        )
        assert made.exit_code == 0, made.stderr
        assert (workspace / "new.txt").read_text() == "new\n"
        assert (workspace / "d" / "e" / "f").read_text() == "deep\n"
        assert not (workspace / "gone.txt").exists()
        assert (workspace / "keep.txt").stat().st_mode & 0o777 == 0o600
        for name in ("new.txt", "d", "d/e/f"):
            info = (workspace / name).stat()
            assert (info.st_uid, info.st_gid) == (1000, 1000), name  # the workspace owner's, not root's
        # Host-side changes are pushed before the next command (the host copy is the truth).
        (workspace / "host.txt").write_text("from the host\n")
        (workspace / "new.txt").unlink()
        seen = sh(session, "cat host.txt; test -e new.txt && echo still-there; true")
        assert seen.stdout == "from the host\n"
        (workspace / "pushed.txt").write_text("pushed now\n")
        session.push_workspace()
        name = session.pod_name
        container = pod_api.containers[name]
        # Written in the Pod with no command after it: only the close can bring it back.
        inside = pod_api.client.api.exec_create(
            container, ["sh", "-c", f"cat {workspace}/pushed.txt; echo last > {workspace}/last.txt"]
        )
        assert pod_api.client.api.exec_start(inside["Id"]) == b"pushed now\n"
    assert (workspace / "last.txt").read_text() == "last\n"
    assert pod_api.deleted == [name]
    with pytest.raises(docker.errors.NotFound):
        pod_api.client.api.inspect_container(container)


def test_a_workspace_larger_than_the_emptydir_is_refused_naming_the_setting(
    pod_api: DockerPodApi, workspace: Path
) -> None:
    (workspace / "big").write_bytes(b"\0" * (3 * 1024 * 1024))
    with (
        backend_on(pod_api, workspace_mb=2) as backend,
        pytest.raises(PolicyNotEnforceableError, match=r"KubernetesConfig\(workspace_mb=\.\.\.\)"),
    ):
        backend.session(workspace=workspace).start()
    assert set(pod_api.deleted) == {pod["metadata"]["name"] for pod in pod_api.created}  # none left running


def test_the_backend_reports_the_mirror_and_a_session_without_a_workspace_none(pod_api: DockerPodApi) -> None:
    with backend_on(pod_api) as backend:
        reported = backend.capabilities()  # from a probe session's Pod (no workspace), then deleted
        assert reported.workspace == "mirror"
        # Its start probed the network under the session's lock (reentrant: it once deadlocked here).
        assert reported.network  # the policy selects the Pod and the probe found no route
        with backend.session() as session:
            assert session.capabilities().workspace is None and session.mirror is None
            assert sh(session, "pwd").stdout == "/workspace\n"
    assert len(pod_api.deleted) == 2
