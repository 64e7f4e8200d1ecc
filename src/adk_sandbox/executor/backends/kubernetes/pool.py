"""The Kubernetes pool: started session Pods kept ready by this process, so a session starts in a claim.

:class:`KubernetesPool` (over :class:`~adk_sandbox.executor.pool.WarmPool`) and
:class:`KubernetesPoolConfig` serve ``KubernetesBackend(config, pool=N)``; not agent-sandbox's server-side
``SandboxWarmPool`` (``KubernetesConfig(warm_pool=...)``). Depth: docs/KUBERNETES.md, "The pool".
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
