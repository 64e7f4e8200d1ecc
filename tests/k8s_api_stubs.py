"""What every fake Kubernetes API of the tests answers alike: a cluster with no leaks, no RuntimeClasses
and no agent-sandbox CRDs, whose NetworkPolicies are stored as given.

The fakes differ in their Pods (tests/unit/test_k8s_session.py replays recorded ones;
tests/integration/k8s_on_docker.py makes real containers), so only this part is shared.
"""

from __future__ import annotations

from typing import Any


class ClusterWithoutClaims:
    """The ``KubernetesApi`` calls that are the same for every fake; ``policies`` records the policies."""

    def __init__(self) -> None:
        self.policies: list[dict[str, Any]] = []

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """Nothing leaked (tests/unit/test_k8s_reaper.py lists some)."""
        return []

    def list_nodes(self) -> list[dict[str, Any]] | None:
        """The nodes may not be listed (RBAC): the messages do without their capacity."""
        return None

    def read_runtime_class(self, name: str) -> dict[str, Any] | None:
        """No RuntimeClasses."""
        return None

    def apply_network_policy(self, namespace: str, policy: dict[str, Any]) -> dict[str, Any]:
        """Stored as given."""
        self.policies.append(policy)
        return policy

    def has_claims(self) -> bool:
        """No agent-sandbox CRDs."""
        return False

    def server_host(self) -> str | None:
        """An API server on this machine (its own addresses are refused anyway)."""
        return None

    def create_claim(self, namespace: str, claim: dict[str, Any]) -> dict[str, Any]:
        """Never called without the CRDs."""
        raise AssertionError("no claims here")

    def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Never called without the CRDs."""
        raise AssertionError("no claims here")

    def delete_claim(self, namespace: str, name: str) -> None:
        """Never called without the CRDs."""
        raise AssertionError("no claims here")

    def read_sandbox(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Never called without the CRDs."""
        raise AssertionError("no claims here")
