"""The conformance suite (adk_sandbox.testing) on a Kubernetes session, against the stand-in cluster.

No cluster can exist here (docs/KUBERNETES.md): the Pod is a real hardened container made from the
session's own Pod spec and ``pods/exec`` a real ``docker exec`` in the v5 framing
(tests/integration/k8s_on_docker.py). The session has a host workspace (mirrored into the Pod's
``emptyDir``); processes are looked for from inside the Pod; a closed session must have deleted its Pod.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence

import docker.errors
import pytest

from adk_sandbox.executor import PolicyNotEnforceableError, ResourceLimits, SandboxBackend
from adk_sandbox.executor.backends.docker.images import BASE_IMAGE
from adk_sandbox.executor.backends.kubernetes import KubernetesBackend, KubernetesConfig
from adk_sandbox.testing import ConformanceSuite, ConformanceTarget, KnownDifference
from tests.conformance.table import column
from tests.integration.k8s_on_docker import DockerPodApi, docker_pod_api

pytestmark = [pytest.mark.docker]

MEMORY_MB = 128
#: What every Kubernetes session does otherwise than the suite asks (the stand-in's and the cluster's).
KNOWN_DIFFERENCES = {
    "user_other": KnownDifference(
        "a pods/exec cannot choose the user: commands run as the Pod's user (KubernetesConfig(user=...)), "
        "another one is refused",
        raises=PolicyNotEnforceableError,
    ),
}


def pods_left(api: DockerPodApi) -> Callable[[SandboxBackend], Sequence[str]]:
    """For a closed session: its Pod, if not deleted, and the container standing in for it, if still there."""

    def left(session: SandboxBackend) -> list[str]:
        name = getattr(session, "pod_name")  # noqa: B009 - a Kubernetes session's
        found = [] if name in api.deleted else [f"Pod {name} (not deleted)"]
        with contextlib.suppress(docker.errors.NotFound):
            api.client.api.inspect_container(api.containers[name])
            found.append(f"the container standing in for Pod {name}")
        return found

    return left


@pytest.fixture(scope="module")
def conformance_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConformanceTarget]:
    workspace = tmp_path_factory.mktemp("conformance-ws")
    os.chown(workspace, 1000, 1000)
    config = KubernetesConfig(image=BASE_IMAGE, workspace_mb=64, limits=ResourceLimits(memory_mb=MEMORY_MB))
    with docker_pod_api() as api, KubernetesBackend(config, api=api) as backend:
        yield ConformanceTarget(
            backend,
            workspace=workspace,
            memory_limit_mb=MEMORY_MB,
            leftovers=pods_left(api),
            table=column("kubernetes (stand-in)"),
            # The backend's own pool (agent-sandbox's claims: tests/integration/test_k8s_cluster_claims.py).
            warm_pool=lambda: KubernetesBackend(config, api=api, pool=1),
            known_differences=KNOWN_DIFFERENCES,
        )


class TestKubernetesStandInConformance(ConformanceSuite):
    pass
