"""What the tests on the real cluster share: its context, a session config for it, and the fail-or-skip rule.

The cluster is the one-node cluster of ``../shared/k8s`` that ``scripts/test`` starts (or any cluster
``ADK_SANDBOX_K8S_CONTEXT`` names). Where its state directory exists and ``CI`` is set, a missing context
fails the tests instead of skipping them: the cluster is there, so a skip would hide a broken start.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from adk_sandbox.executor.backends.kubernetes import KubernetesConfig

CONTEXT = os.environ.get("ADK_SANDBOX_K8S_CONTEXT")
F = TypeVar("F", bound=Callable[..., Any])
K8S_HOME = Path(os.environ.get("K8S_HOME", "/var/tmp/adk-k8s"))


def require_cluster() -> list[pytest.MarkDecorator]:
    """The marks of a module that needs the cluster: none with a context; in CI where a cluster can run,
    a collection error (the module fails); else a skip with the reason."""
    if CONTEXT:
        return []
    if os.environ.get("CI") and (K8S_HOME / "run").is_dir():
        raise RuntimeError(
            f"CI is set and {K8S_HOME} holds a Kubernetes cluster, but ADK_SANDBOX_K8S_CONTEXT is not set "
            "(scripts/test exports it once the cluster is up)"
        )
    return [
        pytest.mark.skip(reason="no Kubernetes cluster: set ADK_SANDBOX_K8S_CONTEXT (docs/KUBERNETES.md)")
    ]


def needs_cluster(function: F) -> F:
    """:func:`require_cluster`'s marks on one test (for a module whose other tests need no cluster)."""
    for mark in require_cluster():
        function = mark(function)
    return function


def import_image(image: str) -> None:
    """Put the Docker engine's ``image`` into the one-node cluster's containerd (no registry here)."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "k8s-cluster"
    subprocess.run([str(script), "import", image], check=True, timeout=600)


def cluster_config(**changes: Any) -> KubernetesConfig:
    """A session config for the cluster: its imported image, never pulled (there is no registry here)."""
    base = {
        "namespace": os.environ.get("ADK_SANDBOX_K8S_NAMESPACE", "default"),
        "image": os.environ.get("ADK_SANDBOX_K8S_IMAGE", "adk-sandbox/base:latest"),
        "image_pull_policy": os.environ.get("ADK_SANDBOX_K8S_PULL_POLICY", "Never"),
        "runtime_class_name": os.environ.get("ADK_SANDBOX_K8S_RUNTIME_CLASS"),
        "startup_timeout_seconds": 120.0,
    }
    return KubernetesConfig.model_validate({**base, **changes})
