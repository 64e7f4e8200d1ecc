"""A current Docker engine (issue 22, "A modern engine too"): Debian trixie's docker.io 26.x beside the
machine's own 20.10, the backends' conformance suite on it with runc and with gVisor, workspaces that
travel there as the mirror, ``workspace_transport="auto"`` choosing it by itself, and the task profile's
key checks (attacks as root, a writable root, dpkg and set-id files, the disk bomb at the root cap) with
runc and with gVisor.

The engine is :mod:`tests.integration.modern_engine`'s (one for the whole run, shared with any other module
that asks for it): its own root filesystem, so it cannot see this machine's files, reached through a Unix
socket, so it counts as local and the identity check is what sends a workspace to the mirror. The mirror
tests are the local suite's own functions (:mod:`tests.integration.test_docker_mirror`), collected here again
with backends on the modern engine: the same assertions, no second copy of them. The task profile's checks
are :mod:`tests.integration.test_docker_task_profile`'s ``check_*`` functions, called with a task backend
on the modern engine (one per runtime, and one session of it shared by the checks that leave nothing).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adk_sandbox.executor import ExecRequest, IsolationClass
from adk_sandbox.executor.backends.docker import BASE_IMAGE, DockerBackend
from adk_sandbox.executor.errors import PolicyNotEnforceableError
from adk_sandbox.testing import ConformanceSuite, ConformanceTarget
from tests.conformance.docker_targets import GVISOR_KNOWN_DIFFERENCES, GVISOR_LIMITS, LIMITS, docker_target
from tests.conftest import require
from tests.integration import test_docker_task_profile as task_profile
from tests.integration.modern_engine import ModernEngine
from tests.integration.test_docker_mirror import (
    Mirrored,
    docker_mirrored,
    test_a_disk_bomb_stops_at_the_cap_and_no_more_comes_back,
    test_devtools_over_a_mirrored_workspace,
    test_hostile_pull_back_writes_nothing_outside_and_nothing_in_git,
    test_mirror_volume_goes_with_the_container,
    test_round_trip_create_modify_delete_binary_and_empty_dirs,
    workspace,
)

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]

# Collected here with this module's fixtures (pytest collects the imported names as this module's tests).
__all__ = [
    "test_a_disk_bomb_stops_at_the_cap_and_no_more_comes_back",
    "test_devtools_over_a_mirrored_workspace",
    "test_hostile_pull_back_writes_nothing_outside_and_nothing_in_git",
    "test_mirror_volume_goes_with_the_container",
    "test_round_trip_create_modify_delete_binary_and_empty_dirs",
    "workspace",
]


def _has_runsc(modern_engine: ModernEngine) -> bool:
    client = modern_engine.client()
    try:
        return "runsc" in (client.info().get("Runtimes") or {})
    finally:
        client.close()


def test_the_engine_is_current_and_has_the_system_engines_runtimes(
    modern_engine: ModernEngine, docker_backend: DockerBackend
) -> None:
    version = modern_engine.version()
    assert int(version["Version"].split(".")[0]) >= 26, version
    assert tuple(map(int, version["ApiVersion"].split("."))) >= (1, 45), version
    system = docker_backend._client.info().get("Runtimes") or {}
    if "runsc" in system:
        assert _has_runsc(modern_engine), "the system engine's runsc is not registered on the modern engine"


# -- workspaces: the mirror, chosen by "auto" -------------------------------------------------------------
@pytest.fixture(scope="module")
def mirror_backend(modern_engine: ModernEngine) -> Iterator[DockerBackend]:
    """A backend on the modern engine with the default ``workspace_transport="auto"``."""
    with DockerBackend(engine=modern_engine.local_engine(), mirror_size_mb=64) as backend:
        assert backend.engine.local and backend.workspace_transport == "auto"
        yield backend


@pytest.fixture(scope="module")
def small_mirror_backend(modern_engine: ModernEngine) -> Iterator[DockerBackend]:
    """The disk bomb's 16 MiB mirror, on the modern engine."""
    with DockerBackend(engine=modern_engine.local_engine(), mirror_size_mb=16) as backend:
        yield backend


@pytest.fixture
def mirrored(request: pytest.FixtureRequest) -> Mirrored:
    """The mirror suite's backends, here on the modern engine (no Kubernetes variant)."""
    return docker_mirrored(request)


def test_auto_mirrors_a_workspace_the_engine_cannot_see_and_a_forced_bind_is_refused(
    mirror_backend: DockerBackend, modern_engine: ModernEngine, workspace: Path
) -> None:
    (workspace / "notes.txt").write_text("the host's copy\n")
    # The identity check answers before any session: the engine's filesystem has no such directory.
    assert mirror_backend.capabilities(workspace=workspace).workspace == "mirror"
    with mirror_backend.session(workspace=workspace) as session:
        assert session.workspace_transport == "mirror"
        result = session.execute(ExecRequest(argv=("cat", "notes.txt"), timeout=30))
        assert result.stdout == "the host's copy\n"
    with (
        DockerBackend(engine=modern_engine.local_engine(), workspace_transport="bind") as forced,
        pytest.raises(PolicyNotEnforceableError),
    ):
        forced.session(workspace=workspace).start()
    assert modern_engine.containers() == []


# -- the conformance suite ---------------------------------------------------------------------------------
class TestModernEngineRuncConformance(ConformanceSuite):
    """Every check of the suite on a runc session of the modern engine; its workspace is mirrored."""

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(
        cls, modern_engine: ModernEngine, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[ConformanceTarget]:
        with DockerBackend(engine=modern_engine.local_engine(), limits=LIMITS) as backend:
            yield docker_target(backend, tmp_path_factory)


class TestModernEngineGvisorConformance(ConformanceSuite):
    """Every check of the suite on a gVisor session of the modern engine (gVisor's known differences)."""

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(
        cls, modern_engine: ModernEngine, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[ConformanceTarget]:
        require(_has_runsc(modern_engine), "gVisor's runsc is not registered on the modern engine")
        with DockerBackend(
            engine=modern_engine.local_engine(), runtime="runsc", limits=GVISOR_LIMITS
        ) as backend:
            yield docker_target(backend, tmp_path_factory, **GVISOR_KNOWN_DIFFERENCES)


def test_gvisor_on_the_modern_engine_is_reported_from_its_inspect(modern_engine: ModernEngine) -> None:
    require(_has_runsc(modern_engine), "gVisor's runsc is not registered on the modern engine")
    with (
        DockerBackend(engine=modern_engine.local_engine(), runtime="runsc", image=BASE_IMAGE) as backend,
        backend.session() as session,
    ):
        assert backend._client.api.inspect_container(session.container_id)["HostConfig"]["Runtime"] == "runsc"
        assert session.capabilities().isolation is IsolationClass.GVISOR == session.isolation()
        uname = session.execute(ExecRequest(argv=("uname", "-r"), timeout=30)).stdout.strip()
        assert uname != os.uname().release  # gVisor's kernel, not the host's


# -- the task profile --------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=task_profile.RUNTIMES)
def task_backend(request: pytest.FixtureRequest, modern_engine: ModernEngine) -> Iterator[DockerBackend]:
    """A task-profile backend on the modern engine, per runtime (runc, gVisor)."""
    runtime = str(request.param)
    if runtime == "runsc":
        require(_has_runsc(modern_engine), "gVisor's runsc is not registered on the modern engine")
    with DockerBackend(task_profile.IMAGE, engine=modern_engine.local_engine(), limits=task_profile.LIMITS,
                       runtime=None if runtime == "runc" else runtime, profile="task") as made:  # fmt: skip
        yield made


@pytest.fixture(scope="module")
def task_session(task_backend: DockerBackend) -> Iterator[Any]:
    """One task session per runtime, shared by the checks that leave nothing behind."""
    with task_backend.session() as opened:
        yield opened


@pytest.fixture
def task_workspace(tmp_path: Path) -> Path:
    """A host workspace for a task session (it travels as the mirror)."""
    (tmp_path / "README").write_text("hello\n")
    return tmp_path


def test_task_profile_runs_as_the_images_user_with_a_writable_root(task_session: Any) -> None:
    task_profile.check_writable_root(task_session)


@pytest.mark.parametrize("attack", sorted(task_profile.ATTACKS))
def test_task_profile_attacks_as_root_get_nowhere(
    task_backend: DockerBackend, task_session: Any, attack: str
) -> None:
    task_profile.check_attack(task_backend.runtime, task_session, attack)


def test_task_profile_dpkg_installs_a_set_uid_program(
    task_backend: DockerBackend, task_workspace: Path
) -> None:
    task_profile.check_dpkg_installs_a_set_uid_program(task_backend, task_workspace)


def test_task_profile_set_id_files_come_back_plain(task_backend: DockerBackend, task_workspace: Path) -> None:
    task_profile.check_set_id_files_come_back_plain(task_backend, task_workspace)


#: The disk bomb paced (16 MiB, then a pause): this engine's data root is a tmpfs, whose pages count against
#: the container's memory limit, so the task profile's bomb at full speed (1.3 GB in about a second) is
#: OOM-killed at 512 MiB before the watch's next read; paced, the watch (every 0.5 s) stops it at the cap.
PACED_DISK_BOMB = (
    "i=0; while [ $i -lt 40 ]; do dd if=/dev/zero of=/bomb$i bs=1M count=16 2>/dev/null || exit 3; "
    "sleep 0.3; i=$((i+1)); done; sleep 5"
)


def test_task_profile_disk_bomb_stops_at_the_root_cap(
    task_backend: DockerBackend, modern_engine: ModernEngine
) -> None:
    """The cap is gVisor's memory under runsc; under runc the watch, as this engine's data root is a tmpfs
    (overlay2 on tmpfs takes no ``--storage-opt size``)."""
    assert task_backend.root_cap is not None
    cap = task_backend.root_cap[0]
    assert (
        cap
        == task_backend.capabilities().root_cap
        == ("memory" if task_backend.runtime == "runsc" else "watched")
    )
    bomb = task_profile.DISK_BOMB if cap == "memory" else PACED_DISK_BOMB
    client = modern_engine.client()
    try:
        task_profile.check_disk_bomb(task_backend, client, bomb, engine=modern_engine.local_engine())
    finally:
        client.close()
