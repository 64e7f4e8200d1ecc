"""Kubernetes failures as this library's errors, in one place (pure: status codes and API objects in).

:func:`api_error` maps a refused API call, :func:`pod_failure` what a session Pod's status says went
wrong, and :func:`pod_waiting_reason` what a starting Pod waits for. The table and what each error means:
docs/KUBERNETES.md, "Failures".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from adk_sandbox.executor.backends.kubernetes._spec import quantity
from adk_sandbox.executor.errors import (
    BackendUnavailableError,
    ExecutorError,
    PolicyNotEnforceableError,
    SandboxFailedError,
)

__all__ = [
    "IMAGE_PULL_REASONS",
    "api_error",
    "capacity_text",
    "never_schedulable",
    "pod_failure",
    "pod_waiting_reason",
    "status_message",
]

#: Container ``waiting`` reasons that mean the image cannot be had (it will not get better by waiting).
IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
#: Container ``waiting`` reasons that mean the runtime refused the container as configured.
_CREATE_REASONS = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})


def status_message(body: object) -> str:
    """The ``message`` of a metav1.Status body (JSON text or object), else the body as text."""
    if isinstance(body, (bytes, str)):
        text = body.decode(errors="replace") if isinstance(body, bytes) else body
        try:
            body = json.loads(text)
        except ValueError:
            return text.strip()[:1000]
    if isinstance(body, Mapping):
        return str(body.get("message") or body.get("reason") or "")[:1000]
    return str(body)[:1000]


def api_error(status: int, body: object, action: str) -> ExecutorError:  # noqa: PLR0911 - one per cause
    """The error for an API call that answered ``status`` (0: no answer) with ``body``, doing ``action``.

    ``action`` says what was asked, for the message (e.g. ``"create the session Pod"``).
    """
    message = status_message(body)
    if (
        isinstance(body, str) and " -+-+- " in body
    ):  # a refused websocket upgrade: "status -+-+- headers -+-+- body"
        message = status_message(body.rsplit(" -+-+- ", 1)[1]) or message
    lowered = message.lower()
    if status == 403 and "exceeded quota" in lowered:
        return BackendUnavailableError(
            f"could not {action}: the namespace's ResourceQuota is used up ({message}). Each session Pod "
            "counts KubernetesConfig.requests (its limits with requests=None) against it: wait for sessions "
            "to end, lower ResourceLimits or the requests, or raise the quota"
        )
    if status == 403 and "runtimeclass" in lowered and "not found" in lowered:
        return PolicyNotEnforceableError(
            f"could not {action}: the cluster has no such RuntimeClass ({message}); install gVisor on the "
            "nodes and create the RuntimeClass (handler runsc), or leave runtime_class_name unset"
        )
    if status == 403 and "podsecurity" in lowered:
        return PolicyNotEnforceableError(
            f"could not {action}: the namespace's Pod Security admission refused the Pod ({message})"
        )
    if status in (401, 403):
        return BackendUnavailableError(
            f"could not {action}: the API server refused the credentials ({status}: {message}). The "
            "context's user needs create/get/delete on pods, create on pods/exec, get on runtimeclasses "
            "and create/get on networkpolicies in the namespace (docs/KUBERNETES.md, RBAC)"
        )
    if status == 404 and "namespaces" in lowered:
        return BackendUnavailableError(f"could not {action}: {message}; create the namespace first")
    if "error dialing backend" in lowered:
        return SandboxFailedError(
            f"could not {action}: the Pod's node does not answer ({message}): its kubelet is down or "
            "unreachable, and what runs in the Pod is out of reach; open a new session (the scheduler "
            "places it on a node that answers)"
        )
    if status == 0 or status >= 500:
        return BackendUnavailableError(
            f"could not {action}: the Kubernetes API server did not answer ({message or 'no response'}); "
            "check the context (kubectl --context ... get pods) and the network to the cluster"
        )
    if status == 422:
        return PolicyNotEnforceableError(f"could not {action}: the API server refused the object ({message})")
    return SandboxFailedError(f"could not {action}: the API server answered {status} ({message})")


def _container_statuses(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    status = pod.get("status") or {}
    return list(status.get("initContainerStatuses") or []) + list(status.get("containerStatuses") or [])


def _image_of(pod: Mapping[str, Any], state: Mapping[str, Any]) -> str:
    if state.get("image"):
        return str(state["image"])
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return str(containers[0].get("image", "?"))


def pod_failure(pod: Mapping[str, Any]) -> ExecutorError | None:  # noqa: PLR0911 - one return per cause
    """The error a session Pod's status shows, or None while it is healthy or still starting normally."""
    status = pod.get("status") or {}
    name = (pod.get("metadata") or {}).get("name", "?")
    reason, message = str(status.get("reason") or ""), str(status.get("message") or "")
    deadline = (pod.get("spec") or {}).get("activeDeadlineSeconds")
    if reason == "DeadlineExceeded":
        return SandboxFailedError(
            f"the session Pod {name} reached its activeDeadlineSeconds ({deadline} s) and was stopped by the "
            "kubelet (its self-expiry); open a new session (or raise active_deadline_seconds)"
        )
    if reason == "Evicted":
        return SandboxFailedError(
            f"the session Pod {name} was evicted by its node ({message or 'node pressure'}); what ran in it "
            "is lost; open a new session"
        )
    for condition in status.get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            return SandboxFailedError(
                f"the session Pod {name} is being removed by the cluster ({condition.get('reason')}: "
                f"{condition.get('message', '')}); what ran in it is lost; open a new session"
            )
    for container in status.get("initContainerStatuses") or []:
        ended = (container.get("state") or {}).get("terminated") or {}
        if ended and ended.get("exitCode") != 0:
            return PolicyNotEnforceableError(
                f"the session Pod {name}'s init container {container.get('name')!r}, which takes the Pod's "
                f"network down (network off, or a NetworkPolicy served by the proxy), failed (exit code "
                f"{ended.get('exitCode')}: {str(ended.get('message') or ended.get('reason') or '').strip()}) "
                "; it needs python3 in the image and NET_ADMIN for that container. Use an image with python3 "
                "or KubernetesConfig(network=True) for the cluster network"
            )
    for container in _container_statuses(pod):
        state = container.get("state") or {}
        if container in (status.get("initContainerStatuses") or []) and state.get("terminated"):
            continue  # an init container that ended well (a failed one is above)
        waiting = state.get("waiting") or {}
        why, detail = str(waiting.get("reason") or ""), str(waiting.get("message") or "")
        if why in IMAGE_PULL_REASONS:
            return BackendUnavailableError(
                f"the cluster cannot pull the session image {_image_of(pod, container)} ({why}: {detail}); "
                "push it to a registry the nodes reach (the local adk-sandbox/base is not in one) and set "
                "KubernetesConfig(image=...), or give the namespace an imagePullSecret"
            )
        if why in _CREATE_REASONS:
            return PolicyNotEnforceableError(
                f"the node's runtime refused the session container ({why}: {detail}); the image must run "
                "as a non-root numeric user (KubernetesConfig.user) with a read-only root filesystem"
            )
        terminated = state.get("terminated")
        if terminated:
            return SandboxFailedError(
                f"the session Pod {name}'s container ended ({terminated.get('reason', '')}, exit code "
                f"{terminated.get('exitCode')}); what ran in it is lost; open a new session"
            )
    phase = status.get("phase")
    if phase in ("Failed", "Succeeded"):
        return SandboxFailedError(
            f"the session Pod {name} is {phase} ({reason}: {message}); open a new session"
        )
    return None


def pod_waiting_reason(pod: Mapping[str, Any]) -> str:
    """What a Pod that is not running yet waits for, for a start-timeout message."""
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"it is not scheduled ({condition.get('reason')}: {condition.get('message', '')})"
    for container in _container_statuses(pod):
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting:
            return f"its container is waiting ({waiting.get('reason')}: {waiting.get('message', '')})"
    return f"it is {status.get('phase', 'Pending')}"


def _requested(pod: Mapping[str, Any], resource: str) -> float:
    """What the Pod asks the scheduler for: its containers' requests summed, or its largest init's."""
    spec = pod.get("spec") or {}

    def asked(container: Mapping[str, Any]) -> float:
        return quantity(((container.get("resources") or {}).get("requests") or {}).get(resource, "0")) or 0.0

    total = sum(asked(c) for c in spec.get("containers") or [])
    return max([total, *(asked(c) for c in spec.get("initContainers") or [])])


def _unschedulable(pod: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def capacity_text(nodes: list[dict[str, Any]] | None) -> str:
    """The nodes' allocatable CPU, memory and Pod count, for a message (empty when they are not known)."""
    if not nodes:
        return ""
    parts = []
    for node in nodes:
        free = (node.get("status") or {}).get("allocatable") or {}
        memory = (quantity(free.get("memory", "0")) or 0) / 2**20
        parts.append(
            f"{(node.get('metadata') or {}).get('name', '?')}: cpu {free.get('cpu', '?')}, "
            f"memory {memory:.0f} MiB, pods {free.get('pods', '?')}"
        )
    return "the nodes can allocate " + "; ".join(parts)


def never_schedulable(pod: Mapping[str, Any], nodes: list[dict[str, Any]] | None) -> ExecutorError | None:
    """An unschedulable Pod that asks more than any node can allocate, even empty; None otherwise.

    Such a Pod waits for ever (nothing ending frees enough), so the start fails at once, naming the
    capacity. A Pod that would fit an emptier node waits for its start timeout (sessions end, nodes are
    added); :func:`pod_waiting_reason` and :func:`capacity_text` then say why.
    """
    if not nodes or not _unschedulable(pod):
        return None
    cpu, memory = _requested(pod, "cpu"), _requested(pod, "memory")
    for node in nodes:
        free = (node.get("status") or {}).get("allocatable") or {}
        if cpu <= (quantity(free.get("cpu", "0")) or 0) and memory <= (
            quantity(free.get("memory", "0")) or 0
        ):
            return None
    return BackendUnavailableError(
        f"no node can ever run the session Pod: it requests cpu {cpu:g} and memory {memory / 2**20:.0f} MiB, "
        f"and {capacity_text(nodes)}. Lower KubernetesConfig(requests=...) (or the limits, when "
        "requests=None asks for them), or add larger nodes"
    )
