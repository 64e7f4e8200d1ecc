"""The Kubernetes pool: started session Pods kept ready by this process, so a session starts in a claim.

``KubernetesBackend(config, pool=N)`` (or a :class:`KubernetesPoolConfig`) keeps ``N`` sessions *started*:
Pod created, scheduled and running, its hardening read back, its network probed, the agent up. The
lifecycle is every pool's (:mod:`adk_sandbox.executor.pool`): an acquire pings the member's agent over
``pods/exec`` and hands it out; a member is never reused (closing its session deletes the Pod); close
deletes the ready members and waits for those starting. Members are ordinary session Pods, with the
owner labels: a killed owner's are deleted by the next backend's reaper, and their
``activeDeadlineSeconds`` bounds them anyway.

This is not agent-sandbox's server-side ``SandboxWarmPool`` (``KubernetesConfig(warm_pool=...)``), which
needs that project's controller in the cluster; this one needs nothing but the API, and its Pods belong
to this process. A session with a host workspace does not come from it (the workspace's path is fixed in
the Pod spec).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from adk_sandbox.executor.pool import PoolSettings, WarmPool

if TYPE_CHECKING:
    from adk_sandbox.executor.backends.kubernetes.backend import KubernetesSession

__all__ = ["KubernetesPool", "KubernetesPoolConfig"]

#: How often the tending thread pings the ready members' agents.
TEND_SECONDS = 5.0


class KubernetesPoolConfig(PoolSettings):
    """How ``KubernetesBackend(pool=...)`` keeps started session Pods ready (docs/KUBERNETES.md)."""

    size: Annotated[int, Field(ge=1, le=256)]
    """How many started session Pods to keep ready."""
    start_concurrency: Annotated[int, Field(ge=1, le=64)] = 4
    """At most this many members starting at once (each a Pod create and a wait for it)."""


class KubernetesPool(WarmPool["KubernetesSession", KubernetesPoolConfig]):
    """Started sessions kept ready for one backend's config (see the module docstring)."""

    noun = "Kubernetes pool member"
    threads = "adk-sandbox-k8s-pool"
    closed_message = "this KubernetesBackend is closed: its pool hands out no more sessions"
    timeout_message = (
        "no started session Pod was ready within {timeout:g} s ({creating} starting, at most {limit} at "
        "once): the cluster is slow or cannot schedule more; nothing ran. Retry, or raise "
        "KubernetesPoolConfig(acquire_timeout_seconds=...)"
    )

    def __init__(self, settings: KubernetesPoolConfig, make_session: Callable[[], KubernetesSession]) -> None:
        self._make_session = make_session
        super().__init__(settings, concurrency=settings.start_concurrency, tend_seconds=TEND_SECONDS)

    def acquire(self) -> KubernetesSession:
        """A started session no one used before; closing it deletes its Pod.

        :class:`SandboxFailedError` when the pool is closed or no member was ready within
        ``acquire_timeout_seconds``; a failed start's own error when one failed while this waited.
        """
        return self._acquire()

    def _new_member(self) -> KubernetesSession:
        return self._make_session()
