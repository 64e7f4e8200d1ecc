"""Isolation and capabilities read from recorded Pod + RuntimeClass JSON (tests/unit/fixtures/k8s/)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from adk_sandbox.executor.backends.kubernetes import (
    KubernetesConfig,
    capabilities_from_pod,
    isolation_of_pod,
    pod_violations,
)
from adk_sandbox.executor.types import IsolationClass, Language

FIXTURES = Path(__file__).parent / "fixtures" / "k8s"
CONFIG = KubernetesConfig(namespace="evals", image="registry.example.com/adk-sandbox/base:1.4")


def load(name: str) -> Any:
    return json.loads((FIXTURES / f"{name}.json").read_text())


@pytest.mark.parametrize(
    ("pod", "runtime_class", "expected"),
    [
        ("pod_gvisor_running", "runtimeclass_gvisor", IsolationClass.GVISOR),
        ("pod_gvisor_running", None, IsolationClass.CONTAINER),  # the class could not be read: no evidence
        ("pod_gvisor_running", "runtimeclass_kata", IsolationClass.CONTAINER),  # another class's handler
        ("pod_runc_running", None, IsolationClass.CONTAINER),
        ("pod_runc_running", "runtimeclass_gvisor", IsolationClass.CONTAINER),  # the Pod does not name it
    ],
)
def test_isolation_from_pod_and_runtime_class(
    pod: str, runtime_class: str | None, expected: IsolationClass
) -> None:
    assert isolation_of_pod(load(pod), load(runtime_class) if runtime_class else None) is expected


def test_a_runtime_class_named_gvisor_with_another_handler_is_not_gvisor() -> None:
    impostor = {**load("runtimeclass_gvisor"), "handler": "runc"}
    assert isolation_of_pod(load("pod_gvisor_running"), impostor) is IsolationClass.CONTAINER


def test_capabilities_of_the_recorded_gvisor_pod() -> None:
    caps = capabilities_from_pod(
        load("pod_gvisor_running"),
        load("runtimeclass_gvisor"),
        (Language.COMMAND, Language.PYTHON),
        network_denied=True,
    )
    assert caps.isolation is IsolationClass.GVISOR
    assert (caps.memory, caps.cpu, caps.timeout, caps.env, caps.fs_read, caps.fs_write) == (True,) * 6
    assert caps.pids is False  # a Pod spec cannot limit processes
    assert caps.network is True
    assert caps.channel == "agent"
    assert not (caps.host_filesystem or caps.host_environment or caps.host_programs)


def test_network_is_reported_only_from_the_callers_finding() -> None:
    caps = capabilities_from_pod(load("pod_runc_running"), None, (Language.COMMAND,), network_denied=False)
    assert caps.network is False


def test_a_host_path_volume_unconfines_the_filesystem() -> None:
    caps = capabilities_from_pod(
        load("pod_mutated_by_webhook"), None, (Language.COMMAND,), network_denied=False
    )
    assert caps.fs_read is False and caps.fs_write is False


def test_recorded_running_pods_pass_the_hardening_check() -> None:
    assert pod_violations(load("pod_runc_running"), CONFIG) == []
    gvisor = CONFIG.model_copy(update={"runtime_class_name": "gvisor"})
    assert pod_violations(load("pod_gvisor_running"), gvisor) == []


def test_a_pod_changed_by_a_webhook_is_refused_with_every_reason() -> None:
    problems = " | ".join(pod_violations(load("pod_mutated_by_webhook"), CONFIG))
    for expected in ("service-account token", "NET_RAW", "/var/log", "credentials", "istio-proxy"):
        assert expected in problems


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (("spec", "containers", 0, "securityContext", "privileged"), True, "privileged"),
        (
            ("spec", "containers", 0, "securityContext", "allowPrivilegeEscalation"),
            True,
            "allowPrivilegeEscalation",
        ),
        (("spec", "containers", 0, "securityContext", "readOnlyRootFilesystem"), False, "root filesystem"),
        (("spec", "securityContext", "seccompProfile"), {"type": "Unconfined"}, "seccomp"),
        (("spec", "securityContext", "runAsUser"), 0, "runAsUser"),
        (("spec", "hostNetwork"), True, "hostNetwork"),
        (("spec", "enableServiceLinks"), True, "service links"),
        (("spec", "runtimeClassName"), "runc-fast", "runtimeClassName"),
        (("spec", "containers", 0, "securityContext", "procMount"), "Unmasked", "/proc"),
    ],
)
def test_each_loosened_field_is_a_violation(path: tuple[Any, ...], value: Any, expected: str) -> None:
    pod = load("pod_gvisor_running")
    target = pod
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    if path[-1] == "seccompProfile":  # the container's own setting would win: loosen both
        pod["spec"]["containers"][0]["securityContext"]["seccompProfile"] = value
    if path[-1] == "runAsUser" and path[1] == "securityContext":
        del pod["spec"]["containers"][0]["securityContext"]["runAsUser"]
    gvisor = CONFIG.model_copy(update={"runtime_class_name": "gvisor"})
    problems = pod_violations(pod, gvisor)
    assert any(expected in problem for problem in problems), problems
