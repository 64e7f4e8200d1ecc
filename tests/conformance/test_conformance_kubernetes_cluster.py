"""The conformance suite (adk_sandbox.testing) on a Kubernetes session of the real cluster.

The one-node cluster of ``../shared/k8s`` in CI (tests/integration/k8s_cluster.py: fails there rather than
skips). The session has a host workspace (mirrored into the Pod's ``emptyDir``); a closed session must
have deleted its Pod, as the API server says; the warm pool is the backend's own (``pool=``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence

import pytest

from adk_sandbox.executor import ResourceLimits, SandboxBackend
from adk_sandbox.executor.backends.kubernetes import KubernetesBackend
from adk_sandbox.testing import ConformanceSuite, ConformanceTarget
from tests.conformance.table import column
from tests.conformance.test_conformance_kubernetes import KNOWN_DIFFERENCES
from tests.integration.k8s_cluster import CONTEXT, cluster_config, require_cluster

pytestmark = require_cluster()

MEMORY_MB = 128


def pods_left(backend: KubernetesBackend) -> Callable[[SandboxBackend], Sequence[str]]:
    """For a closed session: its Pod, if the API server still has it (deleted with grace 0: at once)."""

    def left(session: SandboxBackend) -> list[str]:
        name = getattr(session, "pod_name")  # noqa: B009 - a Kubernetes session's
        found = backend._api.read_pod(backend.config.namespace, name)
        return [] if found is None else [f"Pod {name} ({(found.get('status') or {}).get('phase')})"]

    return left


@pytest.fixture(scope="module")
def conformance_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConformanceTarget]:
    workspace = tmp_path_factory.mktemp("conformance-ws")
    os.chown(workspace, 1000, 1000)
    config = cluster_config(workspace_mb=64, limits=ResourceLimits(memory_mb=MEMORY_MB))
    with KubernetesBackend(config, context=CONTEXT) as backend:
        yield ConformanceTarget(
            backend,
            workspace=workspace,
            memory_limit_mb=MEMORY_MB,
            leftovers=pods_left(backend),
            table=column("kubernetes"),
            warm_pool=lambda: KubernetesBackend(config, context=CONTEXT, pool=1),
            known_differences=KNOWN_DIFFERENCES,
        )


class TestKubernetesClusterConformance(ConformanceSuite):
    pass
