"""The conformance suite (adk_sandbox.testing) on Docker sessions on the local engine: runc and gVisor.

One session each (a workspace owned by uid 1000, as a checkout is), agent channel; processes are looked
for from inside the container (gVisor's are not host processes), what a closed session left from the
engine's list of containers labelled with its id.
"""

from __future__ import annotations

from collections.abc import Iterator

import docker
import pytest

from adk_sandbox.executor.backends.docker import DockerBackend
from adk_sandbox.testing import ConformanceSuite, ConformanceTarget
from tests.conformance.docker_targets import GVISOR_KNOWN_DIFFERENCES, GVISOR_LIMITS, LIMITS, docker_target
from tests.conftest import require

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]


class TestDockerRuncConformance(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConformanceTarget]:
        with DockerBackend(limits=LIMITS) as backend:
            yield docker_target(
                backend,
                tmp_path_factory,
                table="docker (runc)",
                warm_pool=lambda: DockerBackend(limits=LIMITS, pool=1),
            )


class TestDockerGvisorConformance(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConformanceTarget]:
        runtimes = docker.from_env().info().get("Runtimes", {})
        require(
            "runsc" in runtimes, "gVisor's runsc is not registered with the Docker daemon (scripts/setup)"
        )
        with DockerBackend(runtime="runsc", limits=GVISOR_LIMITS) as backend:
            yield docker_target(
                backend,
                tmp_path_factory,
                table="docker (gVisor)",
                warm_pool=lambda: DockerBackend(runtime="runsc", limits=GVISOR_LIMITS, pool=1),
                **GVISOR_KNOWN_DIFFERENCES,
            )
