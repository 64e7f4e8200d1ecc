"""What a session Pod looks like: the objects asked of the API server, and the reading of what it made.

Pure, table-tested: :func:`pod_spec` and :func:`network_policy` say what is asked; :func:`pod_violations`
and :func:`capabilities_from_pod` read the Pod as stored (isolation is reported from that, never from the
request). Only :data:`PER_SESSION_FIELDS` differ between sessions. Depth: docs/KUBERNETES.md, "The Pod".
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from adk_sandbox.executor._layout import HOME_DIR
from adk_sandbox.executor._owner import (
    EXPIRES,
    OWNER_BOOT,
    OWNER_HOST,
    OWNER_PID,
    OWNER_PIDNS,
    OWNER_START,
    PROJECT_LABEL,
    SESSION,
)
from adk_sandbox.executor.backends.kubernetes.config import LABEL_PREFIX, KubernetesConfig
from adk_sandbox.executor.types import Capabilities, IsolationClass, Language

__all__ = [
    "CONTAINER_NAME",
    "GVISOR_HANDLER",
    "NETWORK_LABEL",
    "NETWORK_OFF_CONTAINER",
    "NETWORK_POLICY_NAME",
    "PER_SESSION_FIELDS",
    "capabilities_from_pod",
    "isolation_of_pod",
    "network_off_container",
    "network_policy",
    "network_policy_in_force",
    "network_probe_argv",
    "network_probe_found_no_route",
    "network_probe_targets",
    "owner_labels_of_pod",
    "pod_name",
    "pod_owner_labels",
    "pod_resources",
    "pod_spec",
    "pod_violations",
    "quantity",
    "selector_labels",
]

#: The one container of a session Pod.
CONTAINER_NAME = "sandbox"
#: The RuntimeClass handler of gVisor.
GVISOR_HANDLER = "runsc"
#: Label that marks Pods whose network is denied: the NetworkPolicy selects on it.
NETWORK_LABEL = LABEL_PREFIX + "network"
#: The default-deny NetworkPolicy of a namespace's session Pods (one per namespace, shared).
NETWORK_POLICY_NAME = "adk-sandbox-deny-all"
#: The Pod fields that are per session; nothing else may differ, or a warm pool could not match.
PER_SESSION_FIELDS = (
    "metadata.name",
    f"metadata.labels[{SESSION}]",
    f"metadata.labels[{OWNER_PID}]",
    f"metadata.labels[{OWNER_START}]",
    f"metadata.labels[{OWNER_BOOT}]",
    f"metadata.labels[{EXPIRES}]",
    f"metadata.labels[{OWNER_HOST}]",
    f"metadata.labels[{OWNER_PIDNS}]",
)
#: A valid label value (Kubernetes: at most 63 characters, alphanumerics at both ends).
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
#: The pid namespace as /proc names it ("pid:[4026531836]"); a label holds the number alone.
_PIDNS = re.compile(r"pid:\[(\d+)\]")
_MIB = "Mi"


def pod_owner_labels(session: Mapping[str, str]) -> dict[str, str]:
    """The owner labels of a container, as valid Pod label values.

    The owner's host and pid namespace say where its pid means something (:mod:`._reaper`): the pid
    namespace "pid:[N]" is labelled as N; a host name that is no valid label value is left out, and a Pod
    without both is judged by its expiry alone.
    """
    own = {key: value for key, value in session.items() if key not in (OWNER_HOST, OWNER_PIDNS)}
    host, pidns = session.get(OWNER_HOST, ""), _PIDNS.fullmatch(session.get(OWNER_PIDNS, ""))
    if host and _LABEL_VALUE.fullmatch(host) and pidns:
        own[OWNER_HOST], own[OWNER_PIDNS] = host, pidns.group(1)
    return own


def owner_labels_of_pod(labels: Mapping[str, str]) -> dict[str, str] | None:
    """A Pod's labels with the owner in the containers' form again (undoing :func:`pod_owner_labels`).

    None when the Pod does not say where its owner runs: then only its expiry counts.
    """
    host, pidns = labels.get(OWNER_HOST, ""), labels.get(OWNER_PIDNS, "")
    if not host or not pidns.isdigit():
        return None
    return {**labels, OWNER_PIDNS: f"pid:[{pidns}]"}


def pod_name(session_id: str) -> str:
    """The Pod name of a session (its id is 12 hex digits: a valid DNS label)."""
    return f"adk-sandbox-{session_id}"


def selector_labels(config: KubernetesConfig) -> dict[str, str]:
    """The labels every Pod of this config carries, whatever the session: the pool's and policy's selector."""
    labels = {PROJECT_LABEL: "adk-sandbox"}
    if config.network is not True:  # off, or a policy: no route out but the agent's channel
        labels[NETWORK_LABEL] = "off"
    return labels


def _memory(mib: int) -> str:
    return f"{mib}{_MIB}"


def _cpu(cores: float) -> str:
    # Millicores, rounded up: a limit is never looser than asked (the API server refuses < 1m anyway).
    return f"{max(math.ceil(cores * 1000), 1)}m"


def pod_resources(config: KubernetesConfig) -> dict[str, dict[str, str]]:
    """The sandbox container's ``resources``: the limits, and the requests it is scheduled by.

    ``config.requests`` None asks for the limits themselves (Guaranteed QoS, the last class evicted under
    node pressure); the default asks for far less (:class:`PodRequests`), so idle sessions pack a node.
    """
    limits, requests = config.limits, config.requests
    limited = {"cpu": _cpu(limits.cpus), "memory": _memory(limits.memory_mb)}
    if requests is None:
        return {"requests": dict(limited), "limits": limited}
    cpus, memory_mb = min(requests.cpus, limits.cpus), min(requests.memory_mb, limits.memory_mb)
    return {"requests": {"cpu": _cpu(cpus), "memory": _memory(memory_mb)}, "limits": limited}


#: The init container that takes the Pod's network down (network off, or a policy served by the proxy).
NETWORK_OFF_CONTAINER = "network-off"
# Sets every interface but loopback down (SIOCGIFFLAGS, then SIOCSIFFLAGS without IFF_UP), then checks it.
# The Pod's network namespace is shared by its containers; the sandbox container has no CAP_NET_ADMIN in
# it (capabilities dropped, no privilege escalation, and a user namespace it makes does not own this
# network namespace), so nothing inside can bring an interface back: the Pod has loopback only, whatever
# the cluster's CNI does with NetworkPolicy.
_NETWORK_OFF_SOURCE = r"""
import fcntl, socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _, name in socket.if_nameindex():
    if name == "lo":
        continue
    raw = name.encode()
    flags = struct.unpack("16sH14x", fcntl.ioctl(s, 0x8913, struct.pack("16sH14x", raw, 0)))[1]
    fcntl.ioctl(s, 0x8914, struct.pack("16sH14x", raw, flags & ~1))
    flags = struct.unpack("16sH14x", fcntl.ioctl(s, 0x8913, struct.pack("16sH14x", raw, 0)))[1]
    if flags & 1:
        raise SystemExit("interface " + name + " is still up")
    print("down", name)
"""


def network_off_container(config: KubernetesConfig) -> dict[str, Any]:
    """The init container that sets the Pod's interfaces down before the sandbox container starts.

    It runs the session image's ``python3`` as root with ``NET_ADMIN`` alone (every other capability
    dropped, no privilege escalation, a read-only root), and nothing else: the sandbox container that
    follows has no capability to undo it. So network off holds on any CNI, the NetworkPolicy being a
    second layer; an admission that refuses ``NET_ADMIN`` (Pod Security ``restricted``) refuses the Pod,
    which the start reports.
    """
    return {
        "name": NETWORK_OFF_CONTAINER,
        "image": config.image,
        "imagePullPolicy": config.image_pull_policy,
        "command": ["python3", "-I", "-S", "-c", _NETWORK_OFF_SOURCE],
        # The sandbox's own: the Pod is scheduled (and its QoS class set) as the sandbox container alone.
        "resources": pod_resources(config),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": False,
            "runAsUser": 0,
            "runAsGroup": 0,
            "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "stdin": False,
        "tty": False,
    }


def pod_spec(
    config: KubernetesConfig, session: Mapping[str, str] | None = None, name: str | None = None
) -> dict[str, Any]:
    """The Pod of a session as a JSON object for ``POST /api/v1/namespaces/{ns}/pods``.

    ``session`` are the per-session labels (:func:`adk_sandbox.executor._owner.owner_labels`)
    and
    ``name`` the Pod's name; without them the result is the warm-pool template (``metadata`` without a
    name), identical for every session of ``config``.
    """
    limits = config.limits
    own = pod_owner_labels(session or {})
    metadata: dict[str, Any] = {
        "labels": {**config.labels, **selector_labels(config), **own},
        "namespace": config.namespace,
    }
    if name is not None:
        metadata["name"] = name
    spec: dict[str, Any] = {
        # No API credentials inside, no environment variables naming the namespace's services.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        # Its own PID, IPC and network namespaces (the defaults, stated so a reader sees them).
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "shareProcessNamespace": False,
        # A session Pod is never restarted in place: a died keeper fails the Pod, the session reports it.
        "restartPolicy": "Never",
        # The self-expiry: the kubelet kills the Pod after this, whether or not its owner is alive.
        "activeDeadlineSeconds": config.active_deadline_seconds,
        # Nothing inside needs a graceful stop: deletion is immediate.
        "terminationGracePeriodSeconds": 0,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": config.uid,
            "runAsGroup": config.gid,
            # No fsGroup: it makes every emptyDir set-gid, each directory made in one inherits the bit, and
            # a copy that keeps modes (shutil.copytree: pip install -e) then asks for it with chmod, which
            # the agent's set-id filter refuses. Without it an emptyDir is root's 1777, writable by the user.
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": CONTAINER_NAME,
                "image": config.image,
                "imagePullPolicy": config.image_pull_policy,
                # The keeper: the container lives as long as the Pod may (commands run through exec).
                "command": ["sleep", str(config.active_deadline_seconds)],
                "workingDir": config.workspace_path,
                "env": [{"name": "HOME", "value": HOME_DIR}],
                "resources": pod_resources(config),
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "privileged": False,
                    "readOnlyRootFilesystem": True,
                    "runAsNonRoot": True,
                    "runAsUser": config.uid,
                    "runAsGroup": config.gid,
                    "capabilities": {"drop": ["ALL"]},
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "volumeMounts": [
                    {"name": "workspace", "mountPath": config.workspace_path},
                    {"name": "tmp", "mountPath": "/tmp"},
                    {"name": "home", "mountPath": HOME_DIR},
                ],
                "stdin": False,
                "tty": False,
            }
        ],
        # Memory-backed emptyDirs (tmpfs): the only writable places; their pages count against the limit.
        "volumes": [
            {
                "name": "workspace",
                "emptyDir": {"medium": "Memory", "sizeLimit": _memory(config.workspace_mb)},
            },
            {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": _memory(limits.tmpfs_mb)}},
            {"name": "home", "emptyDir": {"medium": "Memory", "sizeLimit": _memory(limits.tmpfs_mb)}},
        ],
    }
    if config.network is not True:
        spec["initContainers"] = [network_off_container(config)]
    if config.runtime_class_name is not None:
        spec["runtimeClassName"] = config.runtime_class_name
    if config.node_selector:
        spec["nodeSelector"] = dict(config.node_selector)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def network_policy(config: KubernetesConfig) -> dict[str, Any]:
    """The default-deny NetworkPolicy (no ingress, no egress: DNS included) of the session Pods.

    It selects on :data:`NETWORK_LABEL`, which only network-off Pods carry, so one policy per namespace
    serves every such backend. Only a CNI plugin that implements NetworkPolicy enforces it: see
    :func:`network_policy_in_force` and the in-Pod probe (:func:`network_probe_argv`).
    """
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": NETWORK_POLICY_NAME,
            "namespace": config.namespace,
            "labels": {PROJECT_LABEL: "adk-sandbox"},
        },
        "spec": {
            "podSelector": {"matchLabels": {PROJECT_LABEL: "adk-sandbox", NETWORK_LABEL: "off"}},
            "policyTypes": ["Ingress", "Egress"],
            # Both lists empty (given, not omitted): nothing is allowed in either direction.
            "ingress": [],
            "egress": [],
        },
    }


def network_policy_in_force(policy: Mapping[str, Any] | None, pod: Mapping[str, Any]) -> bool:
    """True when ``policy`` (as read back) denies all ingress and egress of ``pod``.

    Selects the Pod by ``matchLabels`` (no ``matchExpressions``: not ours), lists both policy types and
    allows no rule. Another policy in the namespace may still *allow* traffic (policies add up), which
    only the in-Pod probe can see.
    """
    if not policy:
        return False
    spec = policy.get("spec") or {}
    selector = spec.get("podSelector") or {}
    if selector.get("matchExpressions"):
        return False
    match = selector.get("matchLabels") or {}
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if not match or any(labels.get(key) != value for key, value in match.items()):
        return False
    types = set(spec.get("policyTypes") or [])
    return {"Ingress", "Egress"} <= types and not spec.get("ingress") and not spec.get("egress")


#: Where the in-Pod probe always tries to connect: public resolvers, by address (no name: with the network
#: off there is no DNS, and a resolver's timeouts once cost every session start 20 s). The session adds
#: its node's kubelet (:func:`network_probe_targets`).
NETWORK_PROBE_TARGETS = (("1.1.1.1", 53), ("8.8.8.8", 53))
#: The kubelet's port: on every node, reachable from a Pod unless something stops it.
KUBELET_PORT = 10250
# Every target at once (threads), each bounded by 2 s: the probe costs one timeout at most.
_PROBE_SOURCE = r"""
import socket, sys, threading
found = {}
def attempt(target):
    host, _, port = target.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=2).close()
        found[target] = "reached " + target
    except OSError as exc:
        found[target] = "blocked " + target + " " + type(exc).__name__
threads = [threading.Thread(target=attempt, args=(t,)) for t in sys.argv[1:]]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("\n".join(found[t] for t in sys.argv[1:]))
print("probe-done")
"""


def network_probe_targets(pod: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    """The probe's targets for a running Pod: the public resolvers and its node's kubelet (``hostIP``)."""
    host = (pod.get("status") or {}).get("hostIP")
    return (*NETWORK_PROBE_TARGETS, *(((str(host), KUBELET_PORT),) if host else ()))


def network_probe_argv(targets: Sequence[tuple[str, int]] = NETWORK_PROBE_TARGETS) -> tuple[str, ...]:
    """The command that tries each target from inside the Pod, all at once (needs ``python3``)."""
    return ("python3", "-I", "-S", "-c", _PROBE_SOURCE, *(_target(host, port) for host, port in targets))


def _target(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def network_probe_found_no_route(
    stdout: str, targets: Sequence[tuple[str, int]] = NETWORK_PROBE_TARGETS
) -> bool:
    """True only when the probe ran to its end and every target was blocked."""
    lines = stdout.splitlines()
    if "probe-done" not in lines:
        return False
    blocked = {line.split()[1] for line in lines if line.startswith("blocked ")}
    reached = [line for line in lines if line.startswith("reached ")]
    return not reached and all(_target(host, port) in blocked for host, port in targets)


def _container(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") == CONTAINER_NAME:
            return dict(container)
    return {}


def _effective(pod_context: Mapping[str, Any], container_context: Mapping[str, Any], key: str) -> Any:
    """A container's security setting: its own, else the Pod's (Kubernetes' precedence)."""
    return container_context.get(key, pod_context.get(key))


def isolation_of_pod(pod: Mapping[str, Any], runtime_class: Mapping[str, Any] | None) -> IsolationClass:
    """The Pod's isolation: gVisor under a RuntimeClass whose handler is ``runsc``, else a container.

    ``runtime_class`` is the RuntimeClass the Pod names (``spec.runtimeClassName``), as read from the API
    server; one of another name, or none, is no evidence of gVisor.
    """
    name = (pod.get("spec") or {}).get("runtimeClassName")
    if not name or not runtime_class:
        return IsolationClass.CONTAINER
    if (runtime_class.get("metadata") or {}).get("name") != name:
        return IsolationClass.CONTAINER
    return (
        IsolationClass.GVISOR if runtime_class.get("handler") == GVISOR_HANDLER else IsolationClass.CONTAINER
    )


def pod_violations(pod: Mapping[str, Any], config: KubernetesConfig) -> list[str]:
    """What the stored Pod lacks of the hardening :func:`pod_spec` asked for (empty when all is in force).

    Read from the Pod the API server returns, after admission: a mutating webhook that loosened it
    (added a capability, a hostPath, a service-account token) makes the session refuse to start.
    """
    spec = pod.get("spec") or {}
    problems: list[str] = []

    def want(condition: bool, problem: str) -> None:
        if not condition:
            problems.append(problem)

    container = _container(pod)
    if not container:
        return [f"the Pod has no container named {CONTAINER_NAME!r}"]
    pod_context = spec.get("securityContext") or {}
    context = container.get("securityContext") or {}
    want(spec.get("automountServiceAccountToken") is False, "a service-account token is mounted")
    want(
        spec.get("enableServiceLinks") is False,
        "service links put the namespace's services in the environment",
    )
    for namespace in ("hostNetwork", "hostPID", "hostIPC"):
        want(not spec.get(namespace), f"{namespace} shares the node's namespace")
    want(not spec.get("shareProcessNamespace"), "the Pod's containers share a process namespace")
    want(_effective(pod_context, context, "runAsNonRoot") is True, "runAsNonRoot is not set")
    uid = _effective(pod_context, context, "runAsUser")
    want(uid == config.uid, f"runAsUser is {uid!r}, not {config.uid}")
    want(context.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation is not false")
    want(not context.get("privileged"), "the container is privileged")
    want(context.get("readOnlyRootFilesystem") is True, "the root filesystem is writable")
    capabilities = context.get("capabilities") or {}
    want(
        "ALL" in [str(cap).upper() for cap in capabilities.get("drop") or []],
        "capabilities are not all dropped",
    )
    want(not capabilities.get("add"), f"capabilities are added: {capabilities.get('add')}")
    seccomp = (_effective(pod_context, context, "seccompProfile") or {}).get("type")
    want(seccomp in ("RuntimeDefault", "Localhost"), f"the seccomp profile is {seccomp or 'Unconfined'!r}")
    want(context.get("procMount", "Default") == "Default", "/proc is not masked (procMount Unmasked)")
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    want(bool(limits.get("memory")), "no memory limit")
    want(bool(limits.get("cpu")), "no cpu limit")
    want(
        _same_resources(resources, pod_resources(config)),
        f"the resources are {resources}, not {pod_resources(config)}",
    )
    want(spec.get("activeDeadlineSeconds") is not None, "no activeDeadlineSeconds (the Pod never expires)")
    if config.runtime_class_name is not None:
        name = spec.get("runtimeClassName")
        want(
            name == config.runtime_class_name,
            f"runtimeClassName is {name!r}, not {config.runtime_class_name!r}",
        )
    problems.extend(_workspace_violations(spec, container, config.workspace_path))
    for volume in spec.get("volumes") or []:
        if "hostPath" in volume:
            problems.append(
                f"the volume {volume.get('name')!r} mounts the node's {volume['hostPath'].get('path')}"
            )
        elif "projected" in volume or "secret" in volume:
            problems.append(f"the volume {volume.get('name')!r} mounts credentials or API data")
    for other in spec.get("containers") or []:
        if other.get("name") != CONTAINER_NAME:
            problems.append(
                f"an extra container {other.get('name')!r} was added (a sidecar shares the network)"
            )
    problems.extend(_init_violations(spec, config))
    return problems


_SUFFIXES = {
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def quantity(value: object) -> float | None:
    """A Kubernetes quantity as a number (``"2"``, ``"2000m"``, ``"64Mi"``: the server may rewrite one)."""
    match = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(value))
    if match is None or (match.group(2) and match.group(2) not in _SUFFIXES):
        return None
    return float(match.group(1)) * _SUFFIXES.get(match.group(2), 1)


def _same_resources(have: Mapping[str, Any], want: Mapping[str, Mapping[str, str]]) -> bool:
    for kind, amounts in want.items():
        stored = have.get(kind) or {}
        if set(stored) != set(amounts):
            return False
        if any(quantity(stored[key]) != quantity(amount) for key, amount in amounts.items()):
            return False
    return set(have) <= set(want)


def _init_violations(spec: Mapping[str, Any], config: KubernetesConfig) -> list[str]:
    """Init containers: exactly the network-off one when the network is off, none otherwise."""
    wanted = [network_off_container(config)] if config.network is not True else []
    found = list(spec.get("initContainers") or [])
    names, wanted_names = [c.get("name") for c in found], [c["name"] for c in wanted]
    if names != wanted_names:
        return [f"the init containers are {names}, not {wanted_names}"]
    problems = []
    for have, want in zip(found, wanted, strict=True):
        for key in ("image", "command", "securityContext"):
            if have.get(key) != want[key]:
                problems.append(f"the init container {want['name']!r} has another {key} ({have.get(key)!r})")
    return problems


def _workspace_violations(spec: Mapping[str, Any], container: Mapping[str, Any], path: str) -> list[str]:
    """What is wrong with the workspace mount: it must be one writable ``emptyDir`` at ``path``.

    For a session with a host workspace ``path`` is that directory's own path: its mirror is copied there.
    """
    mounts = [m for m in container.get("volumeMounts") or [] if m.get("mountPath") == path]
    if len(mounts) != 1:
        return [f"the workspace emptyDir is not mounted at {path} ({len(mounts)} mounts there)"]
    mount = mounts[0]
    volumes = [v for v in spec.get("volumes") or [] if v.get("name") == mount.get("name")]
    problems = []
    if len(volumes) != 1 or "emptyDir" not in volumes[0]:
        problems.append(f"{path} is not an emptyDir volume")
    if mount.get("readOnly"):
        problems.append(f"{path} is mounted read-only")
    if mount.get("subPath") or mount.get("subPathExpr"):
        problems.append(f"{path} mounts a subPath of its volume")
    return problems


def capabilities_from_pod(
    pod: Mapping[str, Any],
    runtime_class: Mapping[str, Any] | None,
    languages: tuple[Language, ...],
    *,
    network_denied: bool,
    channel: str | None = "agent",
) -> Capabilities:
    """What a running session Pod enforces, read from the Pod and its RuntimeClass as stored.

    ``network_denied`` is the caller's finding that the default-deny policy selects the Pod *and* an
    in-Pod probe found no route (:func:`network_policy_in_force`, :func:`network_probe_found_no_route`):
    neither alone is evidence (a CNI without NetworkPolicy support stores the policy and ignores it).
    ``pids`` is False: a Pod spec cannot limit processes (a node's ``podPidsLimit`` may, unseen here).
    """
    spec = pod.get("spec") or {}
    container = _container(pod)
    context = container.get("securityContext") or {}
    limits = (container.get("resources") or {}).get("limits") or {}
    host_volume = any("hostPath" in volume for volume in spec.get("volumes") or [])
    return Capabilities(
        isolation=isolation_of_pod(pod, runtime_class),
        timeout=True,
        memory=bool(limits.get("memory")),
        cpu=bool(limits.get("cpu")),
        pids=False,
        network=network_denied,
        fs_read=not host_volume,
        fs_write=not host_volume and context.get("readOnlyRootFilesystem") is True,
        env=True,
        languages=languages,
        channel=channel,
    )
