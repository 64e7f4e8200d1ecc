"""A Kubernetes session with a host workspace, run for real: the mirror over ``pods/exec`` into a stand-in.

No cluster can exist here, so the Pod is a real hardened container made from the session's own Pod spec
and ``pods/exec`` a real ``docker exec`` spoken in the v5 channel framing (tests/integration/
k8s_on_docker.py); everything of the session above the API calls is the real one: ``pod_spec`` with the
workspace at the host path, ``pod_violations``, the ``ExecBridge``, the agent channel, the start-up probe
and the mirror. The hostile pull-back, the disk bomb and the edit cases run here too, parametrised with the
Docker ones in test_docker_mirror.py (its ``mirrored`` fixture).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from adk_sandbox.executor import ExecRequest, ExecResult, Language
from adk_sandbox.executor.backends.kubernetes import KubernetesSession
from adk_sandbox.executor.errors import PolicyNotEnforceableError
from adk_sandbox.executor.workspace.mirror import MirrorWorkspace
from adk_sandbox.executor.workspace.protocol import Run
from tests.integration.k8s_on_docker import DockerPodApi, backend_on, docker_pod_api
from tests.integration.test_docker_mirror import workspace

pytestmark = [pytest.mark.docker]

__all__ = ["workspace"]  # the mirror suite's fixture: a uid-1000 workspace beside an ``outside``


@pytest.fixture
def pod_api() -> Iterator[DockerPodApi]:
    """The stand-in API; every container it made is gone after the test (checked)."""
    with docker_pod_api() as api:
        yield api


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


def test_a_close_whose_last_pull_back_fails_still_deletes_the_pod(
    pod_api: DockerPodApi, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not only the documented errors: whatever the last pull-back raises, the Pod goes (it leaked)."""

    def broken(self: MirrorWorkspace, run: Run) -> None:
        raise RuntimeError("a bug in the last pull-back")

    with backend_on(pod_api) as backend:
        session = backend.session(workspace=workspace)
        assert sh(session, "true").exit_code == 0
        name = session.pod_name
        container = pod_api.containers[name]
        monkeypatch.setattr(MirrorWorkspace, "closing", broken)
        with pytest.raises(RuntimeError, match="a bug"):
            session.close()
        assert session.closed and pod_api.deleted == [name]
        with pytest.raises(docker.errors.NotFound):
            pod_api.client.api.inspect_container(container)
