"""The Kubernetes backend: one hardened Pod per session, or a claim from an agent-sandbox warm pool.

Extra ``k8s`` (the ``kubernetes`` client), imported only when a backend connects: importing this package
needs nothing beyond the core. Not run against a cluster where it was written: see docs/KUBERNETES.md.
"""

from adk_sandbox.executor.backends.kubernetes._api import ClientApi
from adk_sandbox.executor.backends.kubernetes._channel import ChannelProtocol, ExecStatus
from adk_sandbox.executor.backends.kubernetes._claim import (
    ClaimState,
    claim_object,
    claim_state,
    sandbox_pod_name,
)
from adk_sandbox.executor.backends.kubernetes._failures import api_error, pod_failure
from adk_sandbox.executor.backends.kubernetes._reaper import reap_leaked_pods
from adk_sandbox.executor.backends.kubernetes._spec import (
    PER_SESSION_FIELDS,
    capabilities_from_pod,
    isolation_of_pod,
    network_policy,
    pod_spec,
    pod_violations,
)
from adk_sandbox.executor.backends.kubernetes.backend import (
    KubernetesBackend,
    KubernetesSession,
    workspace_config,
)
from adk_sandbox.executor.backends.kubernetes.config import KubernetesConfig, PodRequests
from adk_sandbox.executor.backends.kubernetes.pool import KubernetesPool, KubernetesPoolConfig

__all__ = [
    "PER_SESSION_FIELDS",
    "ChannelProtocol",
    "ClaimState",
    "ClientApi",
    "ExecStatus",
    "KubernetesBackend",
    "KubernetesConfig",
    "KubernetesPool",
    "KubernetesPoolConfig",
    "KubernetesSession",
    "PodRequests",
    "api_error",
    "capabilities_from_pod",
    "claim_object",
    "claim_state",
    "isolation_of_pod",
    "network_policy",
    "pod_failure",
    "pod_spec",
    "pod_violations",
    "reap_leaked_pods",
    "sandbox_pod_name",
    "workspace_config",
]
