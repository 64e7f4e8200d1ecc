"""Fork spares: forks of any session come warm, by layer, without a pool configured for them.

The backend keeps a small layered pool per (workspace path inside, command user), made at the first
snapshot of that path (``DockerConfig(fork_spares=N)``, at most :data:`MAX_PATHS` paths); where none can
be made the fork starts cold (``fork_method == "copy"``). Depth: docs/snapshots.md, "Forks of any session".
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from adk_sandbox.executor.backends.docker.config import COPIES_CONTEXT, PoolConfig
from adk_sandbox.executor.backends.docker.pool import SessionPool
from adk_sandbox.executor.errors import ExecutorError
from adk_sandbox.executor.workspace.copies import copies_dir

if TYPE_CHECKING:
    import docker

    from adk_sandbox.executor.backends.docker.pool import SessionMaker
    from adk_sandbox.executor.backends.docker.session import DockerSession, SessionConfig
    from adk_sandbox.executor.snapshots.model import Snapshot

__all__ = ["MAX_PATHS", "ForkSpares"]

log = logging.getLogger(__name__)

#: At most this many workspace paths keep spares at once (each its own small pool).
MAX_PATHS = 4
#: How long a fork waits for its spare to start before it starts cold instead.
ACQUIRE_SECONDS = 30.0

_Key = tuple[str, tuple[int, int]]


class ForkSpares:
    """The backend's spares for forks, per (workspace path inside, command user); see the module."""

    def __init__(
        self,
        client: docker.DockerClient,
        base: Callable[[], SessionConfig],
        make_session: SessionMaker,
        *,
        size: int,
        engine: str,
        local: bool,
    ) -> None:
        self._client = client
        self._base = base
        self._make_session = make_session
        self._size = size
        self._engine = engine
        self._local = local
        self._lock = threading.Lock()
        self._pools: OrderedDict[_Key, SessionPool] = OrderedDict()
        self._refused: set[_Key] = set()
        self._closed = False

    def prepare(self, session: DockerSession) -> None:
        """Start a spare for forks of ``session`` when it may have one and has none (never raises)."""
        key = self._key_of(session)
        if key is None:
            return
        with self._lock:
            if self._closed or key in self._refused:
                return
            if key in self._pools:
                self._pools.move_to_end(key)
                return
        try:
            pool = self._make_pool(key)
        except (ExecutorError, ValueError) as exc:  # the engine or host cannot: forks start cold
            log.info("forks of sessions at %s start cold: %s", key[0], exc)
            with self._lock:
                self._refused.add(key)
            return
        evicted: list[SessionPool] = []
        with self._lock:
            if self._closed or key in self._pools:
                evicted.append(pool)
            else:
                self._pools[key] = pool
                while len(self._pools) > MAX_PATHS:
                    evicted.append(self._pools.popitem(last=False)[1])
        for old in evicted:
            old.close()

    def acquire(self, snapshot: Snapshot) -> DockerSession | None:
        """A spare holding ``snapshot``'s files (by layer), or None: none serves it, or it failed (logged)."""
        with self._lock:
            found = [(key, pool) for key, pool in self._pools.items() if pool.serves_snapshot(snapshot)]
        for key, pool in found:
            try:
                return pool.acquire(snapshot=snapshot)
            except ExecutorError as exc:
                log.warning("the fork spare for %s failed (%s): dropped, this fork starts cold", key[0], exc)
                self._drop(key, pool)
        return None

    def pools(self) -> list[SessionPool]:
        """The spares' pools now, least recently forked first (for measurements and checks)."""
        with self._lock:
            return list(self._pools.values())

    def close(self) -> None:
        """Close every spare (their containers are removed); later calls make none."""
        with self._lock:
            self._closed = True
            pools = list(self._pools.values())
            self._pools.clear()
        for pool in pools:
            pool.close()

    def _drop(self, key: _Key, pool: SessionPool) -> None:
        with self._lock:
            if self._pools.get(key) is pool:
                del self._pools[key]
            self._refused.add(key)
        pool.close()

    def _key_of(self, session: DockerSession) -> _Key | None:
        """(path inside, command user) when this session's forks may have a spare, else None."""
        if self._size == 0 or not self._local or os.geteuid() != 0:
            return None
        spec = session._config.spec
        path = session.workspace_inside
        user = session.command_user_ids()
        if path is None or user is None or spec.task or session.attached or session.layers is not None:
            return None  # a layered member's forks come from its own pool
        return path, user

    def _make_pool(self, key: _Key) -> SessionPool:
        """A layered pool of this backend's containers at the key's path, run as its user (may raise)."""
        path, (uid, gid) = key
        fields = {
            "size": self._size,
            "workspace": "mirror",
            "path": path,
            "forkable": True,
            "fork_by": "layer",
            "acquire_timeout_seconds": ACQUIRE_SECONDS,
        }
        # A copy's workspace (copy_of without a pool path) is in the copies directory: allowed here only.
        settings = PoolConfig.model_validate(fields, context={COPIES_CONTEXT: copies_dir()})
        config = replace(self._base(), user=f"{uid}:{gid}")
        return SessionPool(self._client, config, settings, self._make_session, engine=self._engine)
