"""Leak protection for session Pods: the Docker reaper's rule applied to the Pods of a namespace.

:func:`find_leaked_pods` applies :func:`adk_sandbox.executor._owner.leak_reason` to the project's Pods
(never one another object owns); :func:`reap_leaked_pods` deletes them, at a backend's start and for
``adk-sandbox cleanup --kubernetes``. Depth: docs/KUBERNETES.md, "The Pod" ("Leaked Pods").
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from adk_sandbox.executor._owner import EXPIRES, PROJECT_LABEL, leak_reason
from adk_sandbox.executor.backends.kubernetes._api import KubernetesApi
from adk_sandbox.executor.backends.kubernetes._spec import owner_labels_of_pod

__all__ = ["LeakedPod", "find_leaked_pods", "reap_leaked_pods"]

#: The label selector of every Pod this project makes.
PROJECT_SELECTOR = f"{PROJECT_LABEL}=adk-sandbox"


@dataclass(frozen=True)
class LeakedPod:
    """A session Pod nobody owns any more."""

    name: str
    reason: str


def find_leaked_pods(pods: list[dict[str, Any]], now: float | None = None) -> list[LeakedPod]:
    """The Pods of ``pods`` (as listed by the API server) whose owner is gone or whose expiry passed."""
    moment = time.time() if now is None else now
    leaked = []
    for pod in pods:
        metadata = pod.get("metadata") or {}
        labels = metadata.get("labels") or {}
        if labels.get(PROJECT_LABEL) != "adk-sandbox" or metadata.get("ownerReferences"):
            continue
        owned = owner_labels_of_pod(labels)
        # Without its owner's host and pid namespace, a Pod's pid means nothing here: expiry only.
        reason = leak_reason(owned if owned is not None else {EXPIRES: labels.get(EXPIRES, "")}, moment)
        if reason is not None:
            leaked.append(LeakedPod(name=str(metadata.get("name")), reason=reason))
    return leaked


def reap_leaked_pods(api: KubernetesApi, namespace: str) -> list[LeakedPod]:
    """Delete the leaked session Pods of ``namespace``; return what was deleted."""
    leaked = find_leaked_pods(api.list_pods(namespace, PROJECT_SELECTOR))
    for pod in leaked:
        api.delete_pod(namespace, pod.name)
    return leaked
