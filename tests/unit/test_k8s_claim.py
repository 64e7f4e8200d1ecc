"""agent-sandbox SandboxClaim objects and status reading (objects written from its v1beta1 types)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from adk_sandbox.executor._owner import owner_labels
from adk_sandbox.executor.backends.kubernetes import (
    KubernetesConfig,
    claim_object,
    claim_state,
    sandbox_pod_name,
)
from adk_sandbox.executor.backends.kubernetes._spec import pod_owner_labels

FIXTURES = Path(__file__).parent / "fixtures" / "k8s"
CLAIMS = json.loads((FIXTURES / "sandbox_claims.json").read_text())
CONFIG = KubernetesConfig(namespace="evals", warm_pool="python-pool", active_deadline_seconds=3600)
NOW = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)


def test_claim_object() -> None:
    session = owner_labels("3f9c2a7d10be", 3600)
    claim = claim_object(CONFIG, "adk-sandbox-3f9c2a7d10be", session, now=NOW)
    assert claim["apiVersion"] == "extensions.agents.x-k8s.io/v1beta1"
    assert claim["kind"] == "SandboxClaim"
    assert claim["metadata"] == {
        "name": "adk-sandbox-3f9c2a7d10be",
        "namespace": "evals",
        "labels": {"io.adk-sandbox.project": "adk-sandbox", "io.adk-sandbox.session": "3f9c2a7d10be"},
    }
    assert claim["spec"]["warmPoolRef"] == {"name": "python-pool"}
    # The Pod's form of the owner labels: the controller copies them onto the Pod, whose API refuses a
    # label value like the pid namespace's "pid:[N]".
    assert claim["spec"]["additionalPodMetadata"] == {"labels": pod_owner_labels(session)}
    assert all("[" not in value for value in claim["spec"]["additionalPodMetadata"]["labels"].values())
    assert claim["spec"]["lifecycle"] == {"shutdownTime": "2026-01-01T13:00:00Z", "shutdownPolicy": "Delete"}
    # Setting env makes agent-sandbox cold-start every claim: never sent.
    assert "env" not in claim["spec"]


def test_claim_object_needs_a_pool() -> None:
    with pytest.raises(ValueError, match="warm_pool"):
        claim_object(KubernetesConfig(), "x", owner_labels("3f9c2a7d10be", 60), now=NOW)


@pytest.mark.parametrize(
    ("case", "ready", "sandbox", "failure", "waiting"),
    [
        ("just_created", False, None, None, "not reported"),
        ("bound_ready", True, "python-pool-x8k2p", None, ""),
        ("bound_not_ready", False, "python-pool-x8k2p", None, "SandboxNotReady"),
        ("expired", False, "python-pool-x8k2p", "expired", ""),
    ],
)
def test_claim_state(case: str, ready: bool, sandbox: str | None, failure: str | None, waiting: str) -> None:
    state = claim_state(CLAIMS[case])
    assert state.ready is ready
    assert state.sandbox == sandbox
    assert (failure in (state.failure or "")) if failure else state.failure is None
    assert waiting in state.waiting


def test_sandbox_pod_name() -> None:
    assert sandbox_pod_name(CLAIMS["sandbox_adopted"]) == "python-pool-pod-7fd2q"
    assert sandbox_pod_name(CLAIMS["sandbox_own_pod"]) == "python-pool-x8k2p"


@pytest.mark.parametrize(
    "reason", ["InvalidMetadata", "EnvVarsInjectionRejected", "SandboxExpired", "PodFailed"]
)
def test_claim_state_the_controllers_terminal_reasons_fail(reason: str) -> None:
    claim = {
        "status": {"conditions": [{"type": "Ready", "status": "False", "reason": reason, "message": "m"}]}
    }
    assert claim_state(claim).failure == f"{reason}: m"


@pytest.mark.parametrize("reason", ["WarmPoolNotFound", "TemplateNotFound", "DependenciesNotReady"])
def test_claim_state_what_the_controller_retries_is_waited_for(reason: str) -> None:
    claim = {
        "status": {"conditions": [{"type": "Ready", "status": "False", "reason": reason, "message": "m"}]}
    }
    state = claim_state(claim)
    assert state.failure is None and state.waiting == f"{reason}: m"
