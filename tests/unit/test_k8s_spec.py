"""The Kubernetes session Pod and NetworkPolicy as pure functions of the config, tested as tables."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from adk_sandbox.executor._owner import owner_labels
from adk_sandbox.executor.backends.kubernetes import KubernetesConfig, PodRequests, network_policy, pod_spec
from adk_sandbox.executor.backends.kubernetes._spec import (
    NETWORK_LABEL,
    PER_SESSION_FIELDS,
    network_policy_in_force,
    network_probe_argv,
    network_probe_found_no_route,
    network_probe_targets,
    pod_violations,
)
from adk_sandbox.executor.network.policy import NetworkPolicy
from adk_sandbox.executor.types import ResourceLimits

CONFIG = KubernetesConfig(
    namespace="evals",
    image="registry.example.com/adk-sandbox/base:1.4",
    runtime_class_name="gvisor",
    limits=ResourceLimits(memory_mb=1536, cpus=1.5, tmpfs_mb=128),
    workspace_mb=512,
    user="1234:2345",
    labels={"example.org/run": "r42"},
    active_deadline_seconds=3600,
)


def _get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = obj[int(part)] if isinstance(obj, list) else obj[part]
    return obj


SPEC = pod_spec(CONFIG)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("spec.automountServiceAccountToken", False),
        ("spec.enableServiceLinks", False),
        ("spec.hostNetwork", False),
        ("spec.hostPID", False),
        ("spec.hostIPC", False),
        ("spec.shareProcessNamespace", False),
        ("spec.restartPolicy", "Never"),
        ("spec.activeDeadlineSeconds", 3600),
        ("spec.runtimeClassName", "gvisor"),
        ("spec.securityContext.runAsNonRoot", True),
        ("spec.securityContext.runAsUser", 1234),
        ("spec.securityContext.runAsGroup", 2345),
        ("spec.securityContext.seccompProfile", {"type": "RuntimeDefault"}),
        ("spec.containers.0.securityContext.allowPrivilegeEscalation", False),
        ("spec.containers.0.securityContext.privileged", False),
        ("spec.containers.0.securityContext.readOnlyRootFilesystem", True),
        ("spec.containers.0.securityContext.runAsNonRoot", True),
        ("spec.containers.0.securityContext.runAsUser", 1234),
        ("spec.containers.0.securityContext.capabilities", {"drop": ["ALL"]}),
        ("spec.containers.0.securityContext.seccompProfile", {"type": "RuntimeDefault"}),
        ("spec.containers.0.resources.limits", {"cpu": "1500m", "memory": "1536Mi"}),
        # Requests far below the limits: idle sessions pack a node (PodRequests' defaults).
        ("spec.containers.0.resources.requests", {"cpu": "10m", "memory": "64Mi"}),
        ("spec.initContainers.0.name", "network-off"),
        ("spec.initContainers.0.securityContext.capabilities", {"drop": ["ALL"], "add": ["NET_ADMIN"]}),
        ("spec.initContainers.0.securityContext.readOnlyRootFilesystem", True),
        ("spec.initContainers.0.securityContext.allowPrivilegeEscalation", False),
        ("spec.containers.0.image", "registry.example.com/adk-sandbox/base:1.4"),
        ("spec.containers.0.command", ["sleep", "3600"]),
        ("spec.containers.0.workingDir", "/workspace"),
        ("spec.volumes.0", {"name": "workspace", "emptyDir": {"medium": "Memory", "sizeLimit": "512Mi"}}),
        ("spec.volumes.1", {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "128Mi"}}),
        ("spec.volumes.2", {"name": "home", "emptyDir": {"medium": "Memory", "sizeLimit": "128Mi"}}),
        (
            "spec.containers.0.volumeMounts",
            [
                {"name": "workspace", "mountPath": "/workspace"},
                {"name": "tmp", "mountPath": "/tmp"},
                {"name": "home", "mountPath": "/home/sandbox"},
            ],
        ),
        ("metadata.namespace", "evals"),
        ("metadata.labels.io.adk-sandbox.project", "adk-sandbox"),
        ("metadata.labels.example.org/run", "r42"),
    ],
)
def test_pod_spec_table(path: str, expected: Any) -> None:
    if path.startswith("metadata.labels."):
        assert SPEC["metadata"]["labels"][path.removeprefix("metadata.labels.")] == expected
    else:
        assert _get(SPEC, path) == expected


def test_network_off_pods_carry_the_policy_label_and_network_on_pods_do_not() -> None:
    assert SPEC["metadata"]["labels"][NETWORK_LABEL] == "off"
    assert NETWORK_LABEL not in pod_spec(CONFIG.model_copy(update={"network": True}))["metadata"]["labels"]


def test_no_runtime_class_and_no_node_selector_unless_asked() -> None:
    spec = pod_spec(KubernetesConfig())["spec"]
    assert "runtimeClassName" not in spec and "nodeSelector" not in spec
    assert pod_spec(KubernetesConfig(node_selector={"sandbox": "gvisor"}))["spec"]["nodeSelector"] == {
        "sandbox": "gvisor"
    }


def test_cpu_is_rounded_up_never_looser() -> None:
    config = KubernetesConfig(limits=ResourceLimits(cpus=0.0001))
    assert pod_spec(config)["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "1m"


def _paths(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for key, value in obj.items():
            out.update(_paths(value, f"{prefix}.{key}" if prefix else key))
        return out
    return {prefix: obj}


def test_two_sessions_differ_only_in_the_per_session_fields() -> None:
    # What lets a warm pool built from pod_spec(config) match every session of the config.
    first = pod_spec(CONFIG, owner_labels("aaaaaaaaaaaa", 3600), "adk-sandbox-aaaaaaaaaaaa")
    second = pod_spec(CONFIG, owner_labels("bbbbbbbbbbbb", 7200), "adk-sandbox-bbbbbbbbbbbb")
    a, b = _paths(first), _paths(second)
    differing = {key for key in a.keys() | b.keys() if a.get(key) != b.get(key)}
    allowed = {
        field.replace("[", ".").rstrip("]") for field in PER_SESSION_FIELDS
    }  # "metadata.labels[k]" -> "metadata.labels.k"
    assert differing and differing <= allowed
    # Without the session, the template is exactly the shared part: nothing per session leaks in.
    template = _paths(pod_spec(CONFIG))
    assert not template.keys() & allowed
    assert {key: value for key, value in a.items() if key not in allowed} == template


def test_the_pod_it_asks_for_passes_its_own_check() -> None:
    assert pod_violations(pod_spec(CONFIG, name="x"), CONFIG) == []


def test_a_host_workspace_path_moves_the_mount_and_the_working_directory() -> None:
    config = CONFIG.model_copy(update={"workspace_path": "/home/me/project"})
    container = pod_spec(config)["spec"]["containers"][0]
    assert container["workingDir"] == "/home/me/project"
    assert container["volumeMounts"][0] == {"name": "workspace", "mountPath": "/home/me/project"}
    assert pod_violations(pod_spec(config, name="x"), config) == []


def _with_workspace_mounts(*mounts: dict[str, Any]) -> dict[str, Any]:
    """A Pod of CONFIG whose first volume mount (the workspace's) is replaced by ``mounts``."""
    pod = pod_spec(CONFIG, name="x")
    container = pod["spec"]["containers"][0]
    container["volumeMounts"] = [*mounts, *container["volumeMounts"][1:]]
    return pod


WORKSPACE = {"name": "workspace", "mountPath": "/workspace"}


@pytest.mark.parametrize(
    ("pod", "config", "expected"),
    [
        # A warm pool's template keeps /workspace: a session whose workspace is a host path cannot use it.
        (
            pod_spec(CONFIG),
            CONFIG.model_copy(update={"workspace_path": "/src/repo"}),
            "not mounted at /src/repo",
        ),
        (_with_workspace_mounts(), CONFIG, "not mounted at /workspace (0 mounts there)"),
        (_with_workspace_mounts(WORKSPACE, {"name": "tmp", "mountPath": "/workspace"}), CONFIG, "2 mounts"),
        (_with_workspace_mounts({**WORKSPACE, "readOnly": True}), CONFIG, "mounted read-only"),
        (_with_workspace_mounts({**WORKSPACE, "subPath": "x"}), CONFIG, "subPath"),
        (_with_workspace_mounts({**WORKSPACE, "name": "nothing"}), CONFIG, "not an emptyDir"),
    ],
)
def test_the_workspace_mount_is_checked(pod: dict[str, Any], config: KubernetesConfig, expected: str) -> None:
    problems = pod_violations(pod, config)
    assert any(expected in problem for problem in problems), problems


def test_network_policy_denies_everything_for_the_session_pods() -> None:
    policy = network_policy(CONFIG)
    assert policy["kind"] == "NetworkPolicy"
    assert policy["metadata"]["namespace"] == "evals"
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policy["spec"]["ingress"] == [] and policy["spec"]["egress"] == []
    assert policy["spec"]["podSelector"] == {
        "matchLabels": {"io.adk-sandbox.project": "adk-sandbox", NETWORK_LABEL: "off"}
    }
    assert network_policy_in_force(policy, SPEC)


@pytest.mark.parametrize(
    ("change", "in_force"),
    [
        (lambda p: p, True),
        (lambda p: None, False),
        (lambda p: {**p, "spec": {**p["spec"], "egress": [{}]}}, False),  # allow-all egress rule
        (lambda p: {**p, "spec": {**p["spec"], "policyTypes": ["Ingress"]}}, False),
        (lambda p: {**p, "spec": {**p["spec"], "podSelector": {"matchLabels": {"app": "other"}}}}, False),
        (lambda p: {**p, "spec": {**p["spec"], "podSelector": {}}}, False),
    ],
)
def test_network_policy_in_force_reads_the_stored_policy(change: Any, in_force: bool) -> None:
    assert network_policy_in_force(change(network_policy(CONFIG)), SPEC) is in_force


def test_a_network_on_pod_is_not_selected_by_the_policy() -> None:
    on = pod_spec(CONFIG.model_copy(update={"network": True}))
    assert not network_policy_in_force(network_policy(CONFIG), on)


TARGETS = network_probe_targets({"status": {"hostIP": "10.244.0.1"}})


@pytest.mark.parametrize(
    ("stdout", "no_route"),
    [
        (
            "blocked 1.1.1.1:53 OSError\nblocked 8.8.8.8:53 OSError\nblocked 10.244.0.1:10250 OSError\n"
            "probe-done\n",
            True,
        ),
        # The node's kubelet answers: a CNI that ignores NetworkPolicy, had the interfaces stayed up.
        (
            "blocked 1.1.1.1:53 TimeoutError\nblocked 8.8.8.8:53 TimeoutError\nreached 10.244.0.1:10250\n"
            "probe-done\n",
            False,
        ),
        ("blocked 1.1.1.1:53 TimeoutError\n", False),  # cut short: not evidence
        ("", False),
        ("blocked 1.1.1.1:53 OSError\nblocked 8.8.8.8:53 OSError\nprobe-done\n", False),  # kubelet not tried
    ],
)
def test_network_probe_reading(stdout: str, no_route: bool) -> None:
    assert network_probe_found_no_route(stdout, TARGETS) is no_route


def test_the_probe_tries_the_node_by_address_and_no_name() -> None:
    assert TARGETS == (("1.1.1.1", 53), ("8.8.8.8", 53), ("10.244.0.1", 10250))
    assert network_probe_targets({"status": {}}) == (("1.1.1.1", 53), ("8.8.8.8", 53))
    assert network_probe_argv((("fd00::1", 10250),))[-1] == "[fd00::1]:10250"


def _tampered(change: Any) -> dict[str, Any]:
    pod = pod_spec(CONFIG, name="x")
    change(pod["spec"])
    return pod


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (_tampered(lambda s: s.pop("initContainers")), "the init containers are [], not ['network-off']"),
        (
            _tampered(lambda s: s["initContainers"][0].update(command=["true"])),
            "'network-off' has another command",
        ),
        (
            _tampered(lambda s: s["initContainers"][0]["securityContext"].update(privileged=True)),
            "'network-off' has another securityContext",
        ),
        (
            _tampered(lambda s: s["initContainers"].append({"name": "istio-init"})),
            "the init containers are ['network-off', 'istio-init']",
        ),
        (
            _tampered(lambda s: s["containers"][0]["resources"]["requests"].update(cpu="1")),
            "the resources are",
        ),
    ],
)
def test_a_changed_init_container_or_resources_is_a_violation(pod: dict[str, Any], expected: str) -> None:
    problems = pod_violations(pod, CONFIG)
    assert any(expected in problem for problem in problems), problems


def test_quantities_the_server_rewrote_are_the_same_resources() -> None:
    pod = pod_spec(CONFIG.model_copy(update={"limits": ResourceLimits(cpus=2, memory_mb=2048)}), name="x")
    pod["spec"]["containers"][0]["resources"]["limits"] = {"cpu": "2", "memory": "2Gi"}
    config = CONFIG.model_copy(update={"limits": ResourceLimits(cpus=2, memory_mb=2048)})
    assert pod_violations(pod, config) == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("namespace", "Evals"),
        ("user", "0:0"),
        ("user", "root"),
        ("labels", {"io.adk-sandbox.session": "x"}),
        ("labels", {"bad key!": "x"}),
        ("labels", {"ok": "a" * 64}),
        ("workspace_path", "relative"),
        ("workspace_path", "/tmp"),
        ("workspace_path", "/home/sandbox"),
        ("workspace_path", "/proc/1/root"),
        ("workspace_path", "/sys"),
        ("workspace_path", "/dev/shm/ws"),
        ("workspace_path", "/a/../b"),
        ("workspace_path", "/a//b"),
        ("workspace_path", "//a"),
        ("workspace_path", "/a/"),
        ("runtime_class_name", "GVisor"),
        ("active_deadline_seconds", 0),
    ],
)
def test_config_refuses(field: str, value: Any) -> None:
    with pytest.raises(ValidationError):
        KubernetesConfig(**{field: value})


def test_config_bare_uid_means_uid_uid() -> None:
    assert KubernetesConfig(user="4321").user == "4321:4321"


def test_the_pod_sets_no_fs_group() -> None:
    # fsGroup makes every emptyDir set-gid; a copy keeping modes (pip install -e) then asks for the bit with
    # chmod, which the agent's set-id filter refuses: seen on a real cluster, not on the stand-in.
    assert "fsGroup" not in SPEC["spec"]["securityContext"]
    assert "fsGroup" not in SPEC["spec"]["containers"][0]["securityContext"]


def test_requests_none_asks_for_the_limits_guaranteed() -> None:
    resources = pod_spec(CONFIG.model_copy(update={"requests": None}))["spec"]["containers"][0]["resources"]
    assert resources["requests"] == resources["limits"] == {"cpu": "1500m", "memory": "1536Mi"}


def test_default_requests_are_lowered_to_smaller_limits_and_set_ones_are_checked() -> None:
    small = KubernetesConfig(limits=ResourceLimits(cpus=0.005, memory_mb=32))
    assert pod_spec(small)["spec"]["containers"][0]["resources"]["requests"] == {
        "cpu": "5m",
        "memory": "32Mi",
    }
    with pytest.raises(ValidationError, match="must not exceed the limits"):
        KubernetesConfig(limits=ResourceLimits(cpus=1), requests=PodRequests(cpus=2))
    with pytest.raises(ValidationError, match="must not exceed the limits"):
        KubernetesConfig.model_validate({"limits": {"memory_mb": 64}, "requests": {"memory_mb": 65}})


def test_only_network_off_pods_take_their_interfaces_down() -> None:
    assert [c["name"] for c in SPEC["spec"]["initContainers"]] == ["network-off"]
    policy = pod_spec(CONFIG.model_copy(update={"network": NetworkPolicy(allow=["example.com"])}))
    assert [c["name"] for c in policy["spec"]["initContainers"]] == [
        "network-off"
    ]  # the proxy is the way out
    assert "initContainers" not in pod_spec(CONFIG.model_copy(update={"network": True}))["spec"]
