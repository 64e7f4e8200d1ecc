"""The conformance suite (adk_sandbox.testing) on Docker sessions on the local engine: runc and gVisor.

One session each (a workspace owned by uid 1000, as a checkout is), agent channel; processes are looked
for from inside the container (gVisor's are not host processes), what a closed session left from the
engine's list of containers labelled with its id.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import docker
import pytest

from adk_sandbox.executor import ResourceLimits, SandboxFailedError
from adk_sandbox.executor.backends.docker import DockerBackend
from adk_sandbox.testing import ConformanceSuite, ConformanceTarget, KnownDifference
from tests.conformance.docker_targets import LIMITS, containers_left
from tests.conftest import require

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]


def _target(
    backend: DockerBackend, tmp_path_factory: pytest.TempPathFactory, **known: KnownDifference
) -> ConformanceTarget:
    workspace = tmp_path_factory.mktemp("conformance-ws")
    os.chown(workspace, 1000, 1000)
    limits = backend.config.limits
    return ConformanceTarget(
        backend,
        workspace=workspace,
        memory_limit_mb=limits.memory_mb,
        pids_limit=limits.pids,
        leftovers=containers_left(backend._client),
        known_differences=known,
    )


#: gVisor's limits: its sentry's own threads count against the container's pids limit (see below).
GVISOR_LIMITS = ResourceLimits(memory_mb=LIMITS.memory_mb)


class TestDockerRuncConformance(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConformanceTarget]:
        with DockerBackend(limits=LIMITS) as backend:
            yield _target(backend, tmp_path_factory)


class TestDockerGvisorConformance(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConformanceTarget]:
        runtimes = docker.from_env().info().get("Runtimes", {})
        require(
            "runsc" in runtimes, "gVisor's runsc is not registered with the Docker daemon (scripts/setup)"
        )
        with DockerBackend(runtime="runsc", limits=GVISOR_LIMITS) as backend:
            yield _target(
                backend,
                tmp_path_factory,
                pids_limit=KnownDifference(
                    "under gVisor the container's pids limit counts the sandbox's host threads (its sentry "
                    "and gofer), not the processes inside: a limit of 128 starves the sentry, and a few "
                    "hundred sleeping processes kill or wedge the sandbox (the session replaces its "
                    "container) before the limit refuses a fork; not run, as it would break the shared "
                    "session",
                    run=False,
                ),
                memory_limit=KnownDifference(
                    "under gVisor the memory limit covers the whole sandbox, its sentry included: an "
                    "allocation past it kills or wedges the sandbox, so the command ends in "
                    "SandboxFailedError (the session then replaces its container), not in an oom_killed "
                    "result",
                    raises=SandboxFailedError,
                ),
            )
