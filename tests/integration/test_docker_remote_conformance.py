"""The conformance a remote engine owes (issue 13, "On that engine over TLS and over ssh"): the mirror
suite (round trips, 10k files, hostile pull-back, the disk bomb at the cap), the whole tree-kill matrix
over ssh, gVisor registered on the remote engine (both ways; its tree kill too), and the backends'
conformance suite (``adk_sandbox.testing``) on a session over TLS with a mirrored workspace.

The engine is the private ``dockerd`` of :mod:`tests.integration.private_engine`, started for this module
(the fixtures are those of :mod:`tests.integration.test_docker_remote_engine`): in a mount namespace of its
own, with a tmpfs over the directory the workspaces live in, so it can never see the host's copy. The
mirror tests are the local suite's own functions (:mod:`tests.integration.test_docker_mirror`), collected
here again with a ``mirror_backend`` on the remote engine, over TLS and over ssh: the same assertions, no
second copy of them.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from adk_sandbox.executor import ExecRequest, IsolationClass
from adk_sandbox.executor.backends.docker import DockerBackend, Engine
from adk_sandbox.executor.backends.docker.images import BASE_IMAGE
from adk_sandbox.testing import ConformanceSuite, ConformanceTarget
from tests.conformance.docker_targets import LIMITS, containers_left
from tests.integration.private_engine import PrivateEngine, PrivateSshd
from tests.integration.test_docker_mirror import (
    Mirrored,
    docker_mirrored,
    test_a_disk_bomb_stops_at_the_cap_and_no_more_comes_back,
    test_devtools_over_a_mirrored_workspace,
    test_hostile_pull_back_writes_nothing_outside_and_nothing_in_git,
    test_round_trip_create_modify_delete_binary_and_empty_dirs,
    test_ten_thousand_small_files_travel_and_only_changes_come_back,
)
from tests.integration.test_docker_remote_engine import check_tree_kill, hidden, remote, sshd
from tests.integration.test_docker_tree_kill import ENDINGS

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]

# Collected here with this module's fixtures (pytest collects the imported names as this module's tests).
__all__ = [
    "hidden",
    "remote",
    "sshd",
    "test_a_disk_bomb_stops_at_the_cap_and_no_more_comes_back",
    "test_devtools_over_a_mirrored_workspace",
    "test_hostile_pull_back_writes_nothing_outside_and_nothing_in_git",
    "test_round_trip_create_modify_delete_binary_and_empty_dirs",
    "test_ten_thousand_small_files_travel_and_only_changes_come_back",
]

_numbers = itertools.count()


@pytest.fixture(scope="module")
def ssh_engine(sshd: PrivateSshd) -> Iterator[Engine]:
    """The remote engine over ssh; HOME holds the client's key and known hosts (paramiko reads them there)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(sshd.home))
        yield Engine(host=sshd.host)


@pytest.fixture(scope="module", params=["tls", "ssh"])
def remote_engine(request: pytest.FixtureRequest, remote: PrivateEngine) -> Engine:
    """The remote engine, over TLS or over ssh."""
    engine: Engine = remote.engine() if request.param == "tls" else request.getfixturevalue("ssh_engine")
    assert engine.kind == {"tls": "tcp", "ssh": "ssh"}[request.param]
    return engine


@pytest.fixture(scope="module")
def mirror_backend(remote_engine: Engine) -> Iterator[DockerBackend]:
    """A backend on the remote engine: every workspace travels as a mirror."""
    with DockerBackend(engine=remote_engine, mirror_size_mb=64) as backend:
        assert backend.capabilities().workspace == "mirror"
        yield backend


@pytest.fixture
def mirrored(request: pytest.FixtureRequest, remote_engine: Engine) -> Mirrored:
    """The mirror suite's backends, here on the remote engine (TLS or ssh): no Kubernetes variant.

    ``remote_engine`` is asked for by name so that pytest parametrizes the tests by it (the backends are
    looked up by name, which a parametrized fixture does not allow on its own).
    """
    return docker_mirrored(request)


@pytest.fixture(scope="module")
def small_mirror_backend(remote_engine: Engine) -> Iterator[DockerBackend]:
    """The disk bomb's 16 MiB mirror, on the remote engine."""
    with DockerBackend(engine=remote_engine, mirror_size_mb=16) as backend:
        yield backend


@pytest.fixture
def workspace(hidden: Path) -> Path:
    """A workspace owned by uid 1000, in the directory the engine cannot see, beside an ``outside``."""
    parent = hidden / f"conformance-{next(_numbers)}"
    (parent / "ws").mkdir(parents=True)
    (parent / "outside").mkdir()
    os.chown(parent / "ws", 1000, 1000)
    return parent / "ws"


@pytest.mark.parametrize("ending", ENDINGS)
def test_tree_kill_matrix_over_ssh(ssh_engine: Engine, ending: str) -> None:
    """Every ending of the matrix (exit, timeout, cancel), each kill travelling from the host over ssh."""
    with DockerBackend(engine=ssh_engine) as backend, backend.session() as session:
        assert backend.engine.kind == "ssh"
        check_tree_kill(backend, session, ending)


@pytest.fixture(scope="module")
def gvisor_backend(remote: PrivateEngine, remote_engine: Engine) -> Iterator[DockerBackend]:
    """gVisor on the remote engine (the private engine registers the system daemon's runtimes)."""
    client = remote.client()
    runtimes = client.info().get("Runtimes") or {}
    assert "runsc" in runtimes, f"the private engine has no runsc runtime: {sorted(runtimes)}"
    with DockerBackend(engine=remote_engine, runtime="runsc", image=BASE_IMAGE) as backend:
        yield backend


def test_gvisor_on_a_remote_engine_is_reported_from_its_inspect(
    gvisor_backend: DockerBackend, remote: PrivateEngine
) -> None:
    with gvisor_backend.session() as session:
        assert session.container_id in remote.containers()
        inspect = remote.client().api.inspect_container(session.container_id)
        assert inspect["HostConfig"]["Runtime"] == "runsc"
        capabilities = session.capabilities()
        assert capabilities.isolation is IsolationClass.GVISOR == session.isolation()
        assert capabilities.channel == "agent" and capabilities.network and capabilities.memory
        # A command sees gVisor's kernel, not the host's.
        uname = session.execute(ExecRequest(argv=("uname", "-r"), timeout=30)).stdout.strip()
        assert uname != os.uname().release


@pytest.mark.parametrize("ending", ENDINGS)
def test_tree_kill_matrix_under_gvisor_on_a_remote_engine(gvisor_backend: DockerBackend, ending: str) -> None:
    with gvisor_backend.session() as session:
        check_tree_kill(gvisor_backend, session, ending)


@pytest.fixture(scope="module")
def conformance_target(remote: PrivateEngine, hidden: Path) -> Iterator[ConformanceTarget]:
    """A backend on the remote engine over TLS; the shared session's workspace (uid 1000's) is mirrored."""
    workspace = hidden / "conformance-suite"
    workspace.mkdir()
    os.chown(workspace, 1000, 1000)
    with DockerBackend(engine=remote.engine(), limits=LIMITS) as backend:
        yield ConformanceTarget(
            backend,
            workspace=workspace,
            memory_limit_mb=LIMITS.memory_mb,
            pids_limit=LIMITS.pids,
            leftovers=containers_left(backend._client),
        )


class TestRemoteEngineConformance(ConformanceSuite):
    """Every check of the suite on a session of the remote engine."""
