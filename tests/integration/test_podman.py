"""Podman as a dialect of the Docker API (issue 13): the Docker conformance where it applies.

The engine is Debian's podman run as ``podman system service`` in a tmp root for this module
(:mod:`tests.integration.podman_engine`), with the base image loaded into it once. What is checked: the
dialect is recognised; a session starts with the hardening and set-id probe and its capabilities probed
from inside; the isolation report from inspect, with podman's deviations counted and reported; the agent
channel; a subset of the tree-kill matrix; OOM reported only with evidence (a ``kill -9`` is exit 137,
not an OOM); gVisor refused (podman ignores ``runtime="runsc"``); nothing left behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from adk_sandbox.executor import ExecRequest, ExecResult, IsolationClass, Language, ResourceLimits
from adk_sandbox.executor.backends.docker import BASE_IMAGE, DockerBackend, DockerSession
from adk_sandbox.executor.backends.docker._dialect import Dialect, dialect_of
from adk_sandbox.executor.errors import PolicyNotEnforceableError
from tests.conftest import require
from tests.integration.podman_engine import PODMAN, PodmanEngine, PodmanEngineError
from tests.integration.test_docker_tree_kill import alive, check_no_descendant_survives

pytestmark = [pytest.mark.docker, pytest.mark.podman, pytest.mark.usefixtures("docker_backend")]


@pytest.fixture(scope="module")
def podman() -> Iterator[PodmanEngine]:
    """The Podman service with the base image, for this module; stopped and removed at the end."""
    require(os.geteuid() == 0, "a private podman service needs root")
    require(shutil.which("podman") is not None, f"podman is missing ({PODMAN}): scripts/setup installs it")
    engine = PodmanEngine()
    try:
        engine.start()
        engine.load_image(BASE_IMAGE)
    except (PodmanEngineError, subprocess.CalledProcessError) as exc:
        engine.destroy()
        require(False, f"the podman service could not start or load {BASE_IMAGE}: {exc}")
    try:
        yield engine
        assert engine.containers() == [], "a container was left on the podman engine"
    finally:
        engine.destroy()
        assert engine.leftover_processes() == []
        assert not engine.root.exists()


@pytest.fixture(scope="module")
def backend(podman: PodmanEngine) -> Iterator[DockerBackend]:
    with DockerBackend(engine=podman.engine()) as opened:
        yield opened


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    os.chown(tmp_path, 1000, 1000)
    return tmp_path


def run(session: DockerSession, code: str, timeout: float = 20, **kwargs: object) -> ExecResult:
    return session.execute(ExecRequest(language=Language.COMMAND, code=code, timeout=timeout), **kwargs)  # type: ignore[arg-type]


def test_the_dialect_is_read_from_the_engines_version_components(
    backend: DockerBackend, docker_backend: DockerBackend
) -> None:
    assert dialect_of(backend._client) is Dialect.PODMAN
    assert dialect_of(docker_backend._client) is Dialect.DOCKER


def test_a_podman_session_is_hardened_reports_inspect_and_uses_the_agent(
    backend: DockerBackend, podman: PodmanEngine, workspace: Path
) -> None:
    with backend.session(workspace=workspace) as session:  # its start ran the hardening and caps probe
        assert session.container_id in podman.containers()
        capabilities = session.capabilities()
        assert capabilities.channel == session.channel == "agent"
        assert capabilities.isolation is IsolationClass.CONTAINER == session.isolation()
        assert (capabilities.memory, capabilities.cpu, capabilities.pids, capabilities.network) == (
            True, True, True, True,
        )  # fmt: skip
        assert capabilities.fs_read and capabilities.fs_write
        # What podman itself reports, which the dialect had to count (and says so).
        raw = podman.client().api.inspect_container(session.container_id)["HostConfig"]
        assert raw["CapDrop"] != ["ALL"] and {"CHOWN", "SETUID", "NET_RAW"} <= set(raw["CapDrop"])
        assert raw["Runtime"] == "oci" and {"/run", "/var/tmp"} <= set(raw["Tmpfs"])
        deviations = " | ".join(session.deviations)
        assert "CapDrop is reported as the default list" in deviations
        assert "OCIRuntime is 'runc'" in deviations
        assert "tmpfs /run, /var/tmp" in deviations
        # Seen by a command: no capability, no set-id file, the workspace is the host's, podman's tmpfs.
        result = run(
            session,
            'grep -E "^Cap(Bnd|Eff)" /proc/self/status; f=$(mktemp); chmod 4755 "$f" && echo setid; '
            "id -u; echo hi > made; grep -E ' /(run|var/tmp) ' /proc/self/mountinfo | wc -l",
        )
        assert result.exit_code == 0, result.stderr
        assert result.stdout.count("0000000000000000") == 2 and "setid" not in result.stdout
        assert result.stdout.split()[-2:] == ["1000", "2"]
        made = workspace / "made"
        assert made.read_text() == "hi\n" and made.stat().st_uid == 1000


def test_gvisor_is_refused_because_podman_ignores_runsc(podman: PodmanEngine) -> None:
    with (
        DockerBackend(engine=podman.engine(), runtime="runsc") as backend,
        pytest.raises(PolicyNotEnforceableError, match="runtime is 'runc', not 'runsc'"),
    ):
        backend.session().start()
    assert podman.containers() == []  # the container that ran under runc was removed


@pytest.mark.parametrize("ending", ["exit", "timeout"])
def test_tree_kill_on_podman(backend: DockerBackend, workspace: Path, ending: str) -> None:
    with backend.session(workspace=workspace) as session:
        check_no_descendant_survives(backend, session, ending, run, bomb_went_off=(workspace / "bomb").exists)
        assert alive(backend, session, "sleep 60") == []


def test_oom_is_reported_only_with_evidence(podman: PodmanEngine) -> None:
    # Podman never sets State.OOMKilled: the flag comes from the memory cgroup's oom_kill count only.
    with (
        DockerBackend(engine=podman.engine(), limits=ResourceLimits(memory_mb=128)) as backend,
        backend.session() as session,
    ):
        bomb = session.execute(
            ExecRequest(
                language=Language.PYTHON, code="b = b'x' * (600 << 20); print('survived')", timeout=60
            )
        )
        assert bomb.oom_killed and bomb.exit_code is None and "survived" not in bomb.stdout
        # Killed by SIGKILL, not by the OOM killer: exit 137 alone is no evidence of an OOM.
        killed = run(session, "kill -9 $$")
        assert (killed.exit_code, killed.oom_killed) == (137, False)
        assert run(session, "echo alive").stdout == "alive\n"
