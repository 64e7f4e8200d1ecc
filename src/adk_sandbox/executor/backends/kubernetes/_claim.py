"""Sessions claimed from an agent-sandbox warm pool (kubernetes-sigs/agent-sandbox), pure.

:func:`claim_object` is the ``SandboxClaim`` a session creates, :func:`claim_state` reads its status, and
:func:`sandbox_pod_name` names the bound Sandbox's Pod; v1beta1 only. Depth: docs/KUBERNETES.md, "Warm
pools (agent-sandbox)".
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from adk_sandbox.executor._owner import PROJECT_LABEL, SESSION
from adk_sandbox.executor.backends.kubernetes._spec import pod_owner_labels
from adk_sandbox.executor.backends.kubernetes.config import KubernetesConfig

__all__ = [
    "CLAIM_GROUP",
    "CLAIM_PLURAL",
    "CLAIM_VERSION",
    "POD_NAME_ANNOTATION",
    "SANDBOX_GROUP",
    "SANDBOX_PLURAL",
    "SANDBOX_VERSION",
    "ClaimState",
    "claim_object",
    "claim_state",
    "sandbox_pod_name",
]

CLAIM_GROUP = "extensions.agents.x-k8s.io"
CLAIM_VERSION = "v1beta1"
CLAIM_PLURAL = "sandboxclaims"
SANDBOX_GROUP = "agents.x-k8s.io"
SANDBOX_VERSION = "v1beta1"
SANDBOX_PLURAL = "sandboxes"
POD_NAME_ANNOTATION = "agents.x-k8s.io/pod-name"


def claim_object(
    config: KubernetesConfig, name: str, session: Mapping[str, str], *, now: datetime.datetime
) -> dict[str, Any]:
    """The SandboxClaim of one session: from ``config.warm_pool``, with the per-session labels.

    Nothing per-session goes anywhere but the Pod's labels (no ``env``: agent-sandbox cold-starts every
    claim that sets one). The claim expires with the session's lifetime (``shutdownTime``, policy
    ``Delete``), the same bound the Pod's ``activeDeadlineSeconds`` gives a created Pod. The labels are
    the Pod's form of the owner labels (:func:`._spec.pod_owner_labels`): the controller copies them onto
    the Pod, and the API server refuses a Pod whose label value is no valid one (``pid:[N]``).
    """
    if config.warm_pool is None:
        raise ValueError("claim_object needs a config with warm_pool set")
    shutdown = now + datetime.timedelta(seconds=config.active_deadline_seconds)
    return {
        "apiVersion": f"{CLAIM_GROUP}/{CLAIM_VERSION}",
        "kind": "SandboxClaim",
        "metadata": {
            "name": name,
            "namespace": config.namespace,
            "labels": {PROJECT_LABEL: "adk-sandbox", SESSION: session[SESSION]},
        },
        "spec": {
            "warmPoolRef": {"name": config.warm_pool},
            "additionalPodMetadata": {"labels": pod_owner_labels(session)},
            "lifecycle": {
                "shutdownTime": shutdown.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "shutdownPolicy": "Delete",
            },
        },
    }


@dataclass(frozen=True)
class ClaimState:
    """What a SandboxClaim's status says."""

    ready: bool
    """The claim is bound to a Sandbox whose Pod is ready."""
    sandbox: str | None
    """The bound Sandbox's name, once known."""
    failure: str | None = None
    """Why the claim will not become ready (expired, or the controller said it failed), if so."""
    waiting: str = ""
    """What a claim not yet ready waits for (its Ready condition's reason and message)."""


#: The Ready reasons of agent-sandbox's claim controller (and of the Sandbox's, which it forwards) after
#: which it does not retry: the claim's spec or the pool's template is refused, or the Pod has ended.
#: (``WarmPoolNotFound`` and ``TemplateNotFound`` are retried: the pool may yet be created.)
TERMINAL_REASONS = frozenset(
    {
        "InvalidMetadata",
        "EnvVarsInjectionRejected",
        "VolumeClaimTemplatesError",
        "SandboxExpired",
        "PodSucceeded",
    }
)


def claim_state(claim: Mapping[str, Any]) -> ClaimState:
    """Read a SandboxClaim's ``status``: ``conditions[type=Ready]`` and ``sandbox.name``."""
    status = claim.get("status") or {}
    sandbox = (status.get("sandbox") or {}).get("name") or None
    ready = None
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Ready":
            ready = condition
    if ready is None:
        return ClaimState(ready=False, sandbox=sandbox, waiting="the controller has not reported on it yet")
    reason, message = str(ready.get("reason") or ""), str(ready.get("message") or "")
    if ready.get("status") == "True" and sandbox:
        return ClaimState(ready=True, sandbox=sandbox)
    if reason == "ClaimExpired":
        return ClaimState(ready=False, sandbox=sandbox, failure=f"the claim expired ({message})")
    if reason in TERMINAL_REASONS or "fail" in reason.lower() or "error" in reason.lower():
        return ClaimState(ready=False, sandbox=sandbox, failure=f"{reason}: {message}")
    return ClaimState(ready=False, sandbox=sandbox, waiting=f"{reason}: {message}".strip(": "))


def sandbox_pod_name(sandbox: Mapping[str, Any]) -> str:
    """The Pod of a Sandbox: the adopted warm-pool Pod's name (annotation), else the Sandbox's own name."""
    metadata = sandbox.get("metadata") or {}
    adopted = (metadata.get("annotations") or {}).get(POD_NAME_ANNOTATION)
    return str(adopted) if adopted else str(metadata.get("name", ""))
