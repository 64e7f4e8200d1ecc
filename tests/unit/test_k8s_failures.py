"""Kubernetes failures mapped to this library's errors, from recorded API responses and Pod statuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from adk_sandbox.executor.backends.kubernetes import api_error, pod_failure
from adk_sandbox.executor.backends.kubernetes._failures import (
    capacity_text,
    never_schedulable,
    pod_waiting_reason,
)
from adk_sandbox.executor.errors import (
    BackendUnavailableError,
    ExecutorError,
    PolicyNotEnforceableError,
    SandboxFailedError,
)

FIXTURES = Path(__file__).parent / "fixtures" / "k8s"
API = json.loads((FIXTURES / "api_errors.json").read_text())
PODS = json.loads((FIXTURES / "pod_failures.json").read_text())


@pytest.mark.parametrize(
    ("case", "kind", "says"),
    [
        ("quota_exceeded", BackendUnavailableError, ["ResourceQuota", "evals-quota", "lower ResourceLimits"]),
        ("runtime_class_missing", PolicyNotEnforceableError, ["RuntimeClass", "gvisor", "handler runsc"]),
        ("pod_security", PolicyNotEnforceableError, ["Pod Security", "restricted"]),
        ("rbac_forbidden", BackendUnavailableError, ["pods/exec", "cannot create resource"]),
        ("unauthorized", BackendUnavailableError, ["credentials"]),
        ("namespace_missing", BackendUnavailableError, ["create the namespace"]),
        ("invalid", PolicyNotEnforceableError, ["memory limit"]),
        ("unreachable", BackendUnavailableError, ["did not answer", "Connection refused"]),
        ("server_error", BackendUnavailableError, ["did not answer", "webhook"]),
        # Recorded on the two-node cluster: an exec to a Pod whose kubelet was killed (no headers quoted).
        (
            "kubelet_gone",
            SandboxFailedError,
            ["node does not answer (error dialing backend: dial tcp", "new session"],
        ),
    ],
)
def test_api_errors(case: str, kind: type[ExecutorError], says: list[str]) -> None:
    recorded = API[case]
    error = api_error(recorded["status"], recorded["body"], "create the session Pod")
    assert type(error) is kind
    assert str(error).startswith("could not create the session Pod")
    assert "-+-+-" not in str(error)
    for text in says:
        assert text in str(error)


@pytest.mark.parametrize(
    ("case", "kind", "says"),
    [
        ("err_image_pull", BackendUnavailableError, ["cannot pull", "base:1.4", "ErrImagePull", "registry"]),
        ("image_pull_backoff", BackendUnavailableError, ["cannot pull", "ImagePullBackOff"]),
        ("create_config_error", PolicyNotEnforceableError, ["non-root", "CreateContainerConfigError"]),
        ("evicted", SandboxFailedError, ["evicted", "low on resource: memory"]),
        ("evicted_by_api", SandboxFailedError, ["EvictionByEvictionAPI"]),
        ("preempted", SandboxFailedError, ["PreemptionByScheduler"]),
        ("deadline_exceeded", SandboxFailedError, ["activeDeadlineSeconds (600 s)", "self-expiry"]),
        ("keeper_ended", SandboxFailedError, ["OOMKilled", "137"]),
        # Recorded on ../shared/k8s: an image without python3 cannot take the network down.
        ("recorded_init_failed", PolicyNotEnforceableError, ["network-off", "python3", "network=True"]),
    ],
)
def test_pod_failures(case: str, kind: type[ExecutorError], says: list[str]) -> None:
    error = pod_failure(PODS[case])
    assert type(error) is kind
    for text in says:
        assert text in str(error)


@pytest.mark.parametrize(
    ("case", "says"),
    [("unschedulable", "Insufficient memory"), ("container_creating", "ContainerCreating")],
)
def test_a_pod_still_starting_is_no_failure_and_says_what_it_waits_for(case: str, says: str) -> None:
    assert pod_failure(PODS[case]) is None
    assert says in pod_waiting_reason(PODS[case])


def test_a_running_pod_is_no_failure() -> None:
    pod: dict[str, Any] = json.loads((FIXTURES / "pod_gvisor_running.json").read_text())
    assert pod_failure(pod) is None


NODES = json.loads((FIXTURES / "nodes_one_2cpu.json").read_text())


def test_a_pod_larger_than_every_node_fails_at_once_naming_the_capacity() -> None:
    """Recorded on ../shared/k8s: requests=None with 4 CPUs on its 2-CPU node."""
    pod = PODS["recorded_unschedulable_cpu"]
    assert pod_failure(pod) is None and "Insufficient cpu" in pod_waiting_reason(pod)
    error = never_schedulable(pod, NODES)
    assert isinstance(error, BackendUnavailableError)
    assert "requests cpu 4" in str(error) and "adk-node: cpu 2" in str(error) and "pods 110" in str(error)


def test_a_pod_that_fits_an_emptier_node_waits_and_unknown_nodes_say_nothing() -> None:
    pod = json.loads(json.dumps(PODS["recorded_unschedulable_cpu"]))
    for container in pod["spec"]["containers"] + pod["spec"]["initContainers"]:
        container["resources"]["requests"]["cpu"] = "1500m"  # fits the node once others end
    assert never_schedulable(pod, NODES) is None
    assert never_schedulable(PODS["recorded_unschedulable_cpu"], None) is None  # RBAC: nodes not listed
    assert capacity_text(None) == ""
    assert never_schedulable(PODS["container_creating"], NODES) is None  # scheduled: not this question
