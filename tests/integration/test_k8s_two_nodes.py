"""Two nodes of the real cluster: sessions placed on either, the workspace travelling to it, a node lost.

The second node is a second kubelet on this machine with its own containerd, CNI range and cgroup root
(scripts/k8s-second-node), registered with the one-node cluster of ``../shared/k8s``; the module brings it
up and down. Needs that cluster (``ADK_SANDBOX_K8S_CONTEXT``, as tests/integration/test_k8s_cluster.py).
"""

from __future__ import annotations

import os
import subprocess
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from adk_sandbox.executor import ExecRequest, Language
from adk_sandbox.executor.backends.kubernetes import KubernetesBackend, KubernetesConfig
from adk_sandbox.executor.errors import SandboxFailedError
from tests.integration.k8s_cluster import CONTEXT, cluster_config, require_cluster

pytestmark = require_cluster()

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "k8s-second-node"
FIRST, SECOND = "adk-node", "adk-node-2"


def _node(name: str) -> None:
    subprocess.run([str(SCRIPT), name], check=True, timeout=300)


def _bring_up() -> None:
    """``k8s-second-node up``, once more after a ``down`` when the first try fails (a kubelet that came up
    on a machine loaded by the suites before it); the error carries what both tries printed, on one line,
    as a CI log keeps only the summary's lines."""
    reasons = []
    for _ in range(2):
        done = subprocess.run([str(SCRIPT), "up"], capture_output=True, text=True, timeout=300, check=False)
        if done.returncode == 0:
            if reasons:
                warnings.warn(f"the second node came up on a second try; first: {reasons[0]}", stacklevel=1)
            return
        reasons.append(" | ".join(done.stderr.strip().splitlines()[-12:]))
        _node("down")
    raise RuntimeError(f"k8s-second-node up failed twice: {' || '.join(reasons)}")


@pytest.fixture(scope="module")
def second_node() -> Iterator[str]:
    _bring_up()
    try:
        yield SECOND
    finally:
        _node("down")


def _on(node: str) -> KubernetesConfig:
    return cluster_config(node_selector={"kubernetes.io/hostname": node})


def _node_of(backend: KubernetesBackend, pod: str | None) -> str:
    assert pod is not None
    stored = backend._api.read_pod(backend.config.namespace, pod)
    assert stored is not None
    return str(stored["spec"]["nodeName"])


@pytest.mark.parametrize("node", [FIRST, SECOND])
def test_the_workspace_travels_to_the_node_that_runs_the_pod(
    second_node: str, node: str, tmp_path: Path
) -> None:
    os.chown(tmp_path, 1000, 1000)
    (tmp_path / "in.txt").write_text(f"for {node}\n")
    with KubernetesBackend(_on(node), context=CONTEXT) as backend, backend.session(workspace=tmp_path) as s:
        result = s.execute(
            ExecRequest(language=Language.COMMAND, code="cat in.txt; echo back > out.txt", timeout=60)
        )
        assert result.exit_code == 0, result.stderr
        assert result.stdout == f"for {node}\n"
        assert _node_of(backend, s.pod_name) == node
        assert s.capabilities().network is True  # denied: the interfaces are down on either node
    assert (tmp_path / "out.txt").read_text() == "back\n"


def test_a_lost_node_ends_its_sessions_clearly_and_new_ones_go_to_the_other(second_node: str) -> None:
    with KubernetesBackend(_on(SECOND), context=CONTEXT) as pinned:
        lost = pinned.session()
        assert lost.execute(ExecRequest(language=Language.COMMAND, code="true", timeout=30)).exit_code == 0
        _node("kill-kubelet")
        with pytest.raises(SandboxFailedError, match=f"on node {SECOND}.*node does not answer"):
            lost.execute(ExecRequest(language=Language.COMMAND, code="true", timeout=30))
        lost.close()  # the Pod object is deleted at once (grace 0) though its kubelet is gone
        assert pinned._api.read_pod(pinned.config.namespace, lost.pod_name or "") is None
    # The node controller marks the node unreachable after its grace period (40 s), which taints it
    # NoSchedule; from then on every new session is placed on the node that answers.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not _tainted(SECOND):
        time.sleep(2)
    assert _tainted(SECOND), f"{SECOND} was not marked unreachable"
    with KubernetesBackend(cluster_config(), context=CONTEXT) as backend:
        for _ in range(3):
            with backend.session() as session:
                result = session.execute(ExecRequest(language=Language.COMMAND, code="echo up", timeout=30))
                assert result.stdout == "up\n"
                assert _node_of(backend, session.pod_name) == FIRST


def _tainted(node: str) -> bool:
    taints = subprocess.run(
        ["kubectl", "--context", CONTEXT or "", "get", "node", node, "-o", "jsonpath={.spec.taints[*].key}"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    return "node.kubernetes.io/unreachable" in taints
