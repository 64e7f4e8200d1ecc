"""The configuration of a Kubernetes backend: everything that decides what a session's Pod looks like."""

from __future__ import annotations

import posixpath
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from adk_sandbox.executor._layout import HOME_DIR, KERNEL_PATHS
from adk_sandbox.executor._owner import LABEL_PREFIX  # the owner labels' namespace, valid as Kubernetes keys
from adk_sandbox.executor.backends.docker.config import BASE_IMAGE
from adk_sandbox.executor.network.policy import NetworkPolicy, network_setting
from adk_sandbox.executor.types import ResourceLimits, parse_user

__all__ = ["LABEL_PREFIX", "KubernetesConfig", "PodRequests", "validate_label_key", "validate_label_value"]


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


def validate_label_key(key: str) -> str:
    """A Kubernetes label key: ``[prefix/]name``, name 1-63 of ``[-A-Za-z0-9_.]``, prefix a DNS subdomain."""
    prefix, slash, name = key.rpartition("/")
    if (slash and not _DNS_SUBDOMAIN.fullmatch(prefix)) or not _LABEL_NAME.fullmatch(name):
        raise ValueError(
            f"label key {key!r} is not a Kubernetes label key ([dns-prefix/]name, the name at most 63 "
            "letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"
        )
    return key


def validate_label_value(value: str) -> str:
    """A Kubernetes label value: empty, or at most 63 of ``[-A-Za-z0-9_.]``, alphanumeric at both ends."""
    if not _LABEL_VALUE.fullmatch(value):
        raise ValueError(
            f"label value {value!r} is not a Kubernetes label value (at most 63 letters, digits, '-', '_' "
            "or '.', starting and ending with a letter or digit)"
        )
    return value


class PodRequests(BaseModel):
    """What a session Pod asks the scheduler for: what it is placed by, not what it may use.

    The defaults pack idle sandboxes (an idle session is its keeper and the agent: a few MiB, no CPU), so
    a 2-core node holds 100 of them; each may still use up to its :class:`ResourceLimits`. Such a Pod is
    ``Burstable``: under node memory pressure it is evicted before ``Guaranteed`` ones (a clear
    :class:`~adk_sandbox.executor.errors.SandboxFailedError` on its next command).
    ``KubernetesConfig(requests=None)`` asks for the full limits instead (``Guaranteed``, one 2-CPU session
    per 2-core node).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    cpus: Annotated[float, Field(gt=0)] = 0.01
    """CPU request in cores (10 m by default: 100 idle sessions ask for half of a 2-core node)."""
    memory_mb: Annotated[int, Field(gt=0)] = 64
    """Memory request in MiB."""


class KubernetesConfig(BaseModel):
    """How a :class:`KubernetesBackend` makes a session's Pod (see docs/KUBERNETES.md).

    Every field here is shared by all sessions of a backend, so two backends with equal configs ask for
    identical Pods up to the per-session metadata (:data:`PER_SESSION_FIELDS`): a warm pool built from
    :func:`pod_spec` of a config matches every session of that config.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["kubernetes"] = "kubernetes"
    """Discriminator, for configs that choose a backend by type."""
    namespace: Annotated[str, Field(min_length=1, max_length=63)] = "default"
    """The namespace the session Pods (and the NetworkPolicy) live in."""
    image: Annotated[str, Field(min_length=1)] = BASE_IMAGE
    """The session image: a reference the cluster's nodes can pull (the local ``adk-sandbox/base`` must
    be pushed to a registry they reach first). It needs ``python3`` (the agent) or a ``/bin/sh``."""
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """The container's ``imagePullPolicy``."""
    runtime_class_name: str | None = None
    """The Pod's ``runtimeClassName`` (e.g. ``"gvisor"``, whose handler is ``runsc``); None: the node's
    default runtime. Isolation is read from the RuntimeClass's handler, not from this name."""
    limits: ResourceLimits = Field(default_factory=ResourceLimits)
    """Memory and CPU limits (what a session may use; see :attr:`requests` for what it is placed by) and
    the ``/tmp`` and HOME sizes
    (``tmpfs_mb``). ``pids``, ``nofile`` and ``file_size_mb`` cannot be set from a Pod spec (a node's
    ``podPidsLimit`` is kubelet configuration) and are not reported as enforced."""
    requests: PodRequests | None = Field(default_factory=PodRequests)
    """What the scheduler places the Pod by (:class:`PodRequests`; set, each must be at most its limit;
    the default is lowered to a smaller limit); None: the limits themselves (``Guaranteed`` QoS)."""
    workspace_mb: Annotated[int, Field(gt=0, le=64 * 1024)] = 1024
    """Size limit of the workspace ``emptyDir`` (memory-backed: counts against the memory limit)."""
    workspace_path: str = "/workspace"
    """Where the workspace ``emptyDir`` is mounted, and the commands' working directory. A session with a
    host workspace (``backend.session(workspace=dir)``) puts it at that directory's own path instead."""
    user: str = "1000:1000"
    """``"uid:gid"`` the Pod runs as (``runAsUser``/``runAsGroup``; never 0: ``runAsNonRoot``). Commands
    run as this user: a ``pods/exec`` cannot choose another one."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra labels on every session Pod (not in the ``io.adk-sandbox.`` namespace, which the reaper and
    the NetworkPolicy rely on)."""
    active_deadline_seconds: Annotated[int, Field(gt=0)] = 12 * 3600
    """The Pod's ``activeDeadlineSeconds``: the kubelet kills it this long after it started, whatever
    happened to its owner (the self-expiry). A warm-pool Pod's clock starts when the pool made it."""
    network: bool | NetworkPolicy = False
    """``False``: a default-deny Kubernetes NetworkPolicy selects the session Pods (weaker than Docker's
    ``network=none``: see docs/KUBERNETES.md, "Network"). ``True``: the cluster network, unrestricted. A
    :class:`~adk_sandbox.executor.network.NetworkPolicy` (or a mapping of its fields): the Pod is denied
    as with ``False``, and its agent serves an HTTP proxy on ``127.0.0.1`` whose connections are carried
    over ``pods/exec`` and decided, resolved and connected by this process, on this host (docs/network.md).
    ``session.set_network`` switches between ``False`` and a policy at run time."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """The Pod's ``nodeSelector`` (e.g. nodes with the gVisor runtime)."""
    warm_pool: str | None = None
    """Name of an agent-sandbox ``SandboxWarmPool`` to claim sessions from (``SandboxClaim``) instead of
    creating Pods; its template must be :func:`pod_spec` of this config (checked on each claimed Pod)."""
    startup_timeout_seconds: Annotated[float, Field(gt=0, le=3600)] = 120.0
    """How long a session's Pod may take to be scheduled, pulled and running."""
    context: str | None = None
    """The kubeconfig context the backend connects with (None: the current one); not part of a Pod."""

    @model_validator(mode="after")
    def _requests_within_limits(self) -> KubernetesConfig:
        requests, limits = self.requests, self.limits
        # The default requests are lowered to smaller limits (pod_resources); requests asked for are not.
        if (
            "requests" in self.model_fields_set
            and requests is not None
            and (requests.cpus > limits.cpus or requests.memory_mb > limits.memory_mb)
        ):
            raise ValueError(
                f"requests (cpus={requests.cpus:g}, memory_mb={requests.memory_mb}) must not exceed the "
                f"limits (cpus={limits.cpus:g}, memory_mb={limits.memory_mb}); Kubernetes refuses such a Pod"
            )
        return self

    @field_validator("network", mode="before")
    @classmethod
    def _network_kind(cls, network: object) -> object:
        return network_setting(network)

    @field_validator("namespace")
    @classmethod
    def _namespace_is_dns_label(cls, namespace: str) -> str:
        if not _DNS_LABEL.fullmatch(namespace):
            raise ValueError(f"namespace {namespace!r} is not a DNS label (lowercase letters, digits, '-')")
        return namespace

    @field_validator("runtime_class_name", "warm_pool")
    @classmethod
    def _is_dns_subdomain(cls, name: str | None) -> str | None:
        if name is not None and not _DNS_SUBDOMAIN.fullmatch(name):
            raise ValueError(
                f"{name!r} is not a Kubernetes object name (lowercase letters, digits, '-', '.')"
            )
        return name

    @field_validator("workspace_path")
    @classmethod
    def _workspace_path_is_absolute(cls, path: str) -> str:
        if (
            not path.startswith("/")
            or path == "/"
            or posixpath.normpath(path) != path
            or path.startswith("//")
            or "\0" in path
        ):
            raise ValueError(
                f"workspace_path must be an absolute, normalised directory other than '/' (no '..', '.', "
                f"'//' or trailing '/'), not {path!r}"
            )
        if path in ("/tmp", HOME_DIR):
            raise ValueError(f"workspace_path {path!r} is a path the Pod mounts itself")
        for kernel in KERNEL_PATHS:
            if path == kernel or path.startswith(kernel + "/"):
                # An emptyDir there would hide what the runtime mounts and masks (/proc/kcore, /sys/firmware).
                raise ValueError(
                    f"workspace_path {path!r} lies in {kernel}, which the container runtime mounts"
                )
        return path

    @field_validator("user")
    @classmethod
    def _user_is_not_root(cls, user: str) -> str:
        uid, gid = parse_user(user)
        if uid == 0:
            raise ValueError("user must not be uid 0: the Pod runs with runAsNonRoot")
        return f"{uid}:{gid if gid is not None else uid}"

    @field_validator("labels", "node_selector")
    @classmethod
    def _labels_are_kubernetes_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for key, value in labels.items():
            validate_label_key(key)
            validate_label_value(value)
        return labels

    @field_validator("labels")
    @classmethod
    def _labels_not_in_project_namespace(cls, labels: dict[str, str]) -> dict[str, str]:
        for key in labels:
            if key.lower().startswith(LABEL_PREFIX):
                raise ValueError(
                    f"label {key!r} is in this project's namespace ({LABEL_PREFIX}*), which marks who owns a "
                    "Pod and which Pods the NetworkPolicy selects; use a key of your own"
                )
        return labels

    @property
    def egress(self) -> NetworkPolicy | None:
        """The network policy of :attr:`network` (None when it is a bool)."""
        return self.network if isinstance(self.network, NetworkPolicy) else None

    @property
    def uid(self) -> int:
        """The Pod's ``runAsUser``."""
        return int(self.user.partition(":")[0])

    @property
    def gid(self) -> int:
        """The Pod's ``runAsGroup``."""
        return int(self.user.partition(":")[2])
