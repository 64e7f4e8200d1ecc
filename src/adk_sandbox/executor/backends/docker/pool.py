"""The Docker warm pool: started, never-reused containers kept ready, so a session starts in milliseconds.

:class:`SessionPool` (over :class:`~adk_sandbox.executor.pool.WarmPool`) and :class:`PoolKey` serve
``DockerBackend(pool=N)``: workspace-less sessions, and copies of a workspace (``session(copy_of=X)``)
with ``PoolConfig(workspace="mirror")``. Depth: docs/docker/pool.md ("Warm pool", "Copies from the pool").
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import docker

from adk_sandbox.executor.backends.docker._container import ContainerProvider, OpenedContainer
from adk_sandbox.executor.backends.docker._spec import LABEL_PREFIX, MIB, ContainerSpec
from adk_sandbox.executor.backends.docker.config import PoolConfig
from adk_sandbox.executor.backends.docker.session import DockerSession, SessionConfig
from adk_sandbox.executor.channel.session import uid_gid
from adk_sandbox.executor.errors import SandboxFailedError
from adk_sandbox.executor.network.policy import NetworkPolicy
from adk_sandbox.executor.pool import PoolStats, Remover, WarmPool
from adk_sandbox.executor.types import ResourceLimits
from adk_sandbox.executor.workspace.copies import copies_dir, copy_prefix, copy_tree

if TYPE_CHECKING:
    from adk_sandbox.executor.snapshots.model import Snapshot

__all__ = ["POOL_LABEL", "PoolConfig", "PoolKey", "PoolStats", "SessionPool"]

#: The label naming the pool a container was made for (set at create; kept after it is handed out).
POOL_LABEL = LABEL_PREFIX + "pool"
#: At most this long after a fork is handed out its member's refill waits for the fork's first command.
REFILL_DEFER_SECONDS = 1.0

#: Makes an unstarted session from a pool's config, with the provider the pool gives it.
SessionMaker = Callable[[SessionConfig, ContainerProvider], DockerSession]


@dataclass(frozen=True)
class PoolKey:
    """What makes two pool members interchangeable: everything a member's container is made from.

    Nothing per-session is in it (no workspace, no session id): ``workspace`` says how a workspace
    reaches a member, ``"none"`` or ``"mirror"`` (a copy pushed at acquire into a volume of ``mirror_mb``
    MiB at a path the pool chose, see the module docstring).
    """

    engine: str
    image: str
    image_id: str | None
    """The digest of the image the newest member runs (None before the first): a tag rebuilt meanwhile
    makes the older members stale."""
    runtime: str | None
    limits: ResourceLimits
    network: bool
    egress: NetworkPolicy | None
    """The network policy each member's proxy carries (None: none served); see docs/network.md."""
    tmpfs: tuple[tuple[str, int], ...]
    labels: tuple[tuple[str, str], ...]
    user: str | None
    workspace: str = "none"
    hosts: tuple[tuple[str, str], ...] = ()
    """The members' ``/etc/hosts`` entries (``extra_hosts``)."""
    mirror_mb: int | None = None
    """The cap of a ``"mirror"`` member's volume, in MiB (None: no volume)."""
    path: str | None = None
    """Where a ``"mirror"`` member's workspace is inside (None: at its host directory's path)."""
    forkable: bool = False
    """Its tmpfs directories are volumes this process copies on the host (``PoolConfig.forkable``)."""
    fork_by: str = "copy"
    """How a fork gets a snapshot's files in a member (``PoolConfig.fork_by``: copied, or layered)."""

    @classmethod
    def of(
        cls,
        config: SessionConfig,
        engine: str,
        image_id: str | None = None,
        workspace: str = "none",
        path: str | None = None,
        *,
        forkable: bool = False,
        fork_by: str = "copy",
    ) -> PoolKey:
        """The key of members made from ``config`` on ``engine`` (with ``workspace`` as in PoolConfig)."""
        spec = config.spec
        return cls(
            engine=engine,
            image=spec.image,
            image_id=image_id,
            runtime=spec.runtime,
            limits=spec.limits,
            network=spec.network,
            egress=config.egress,
            tmpfs=tuple(sorted(spec.extra_tmpfs.items())),
            labels=tuple(sorted(spec.labels.items())),
            user=config.user,
            hosts=tuple(sorted(spec.extra_hosts.items())),
            workspace=workspace,
            mirror_mb=config.mirror_mb if workspace == "mirror" else None,
            path=path,
            forkable=forkable,
            fork_by=fork_by,
        )


class _PooledProvider(ContainerProvider):
    """A member's container provider: removals go to the pool's remover; it remembers the image digest."""

    def __init__(self, client: docker.DockerClient, spec: ContainerSpec, remover: Remover) -> None:
        super().__init__(client, spec, None)
        self._remover = remover
        self.image_id: str | None = None

    def open(self) -> OpenedContainer:
        """See :meth:`ContainerProvider.open`; keeps the digest of the image the container runs."""
        opened = super().open()
        self.image_id = str(opened.inspect.get("Image") or "") or None
        return opened

    def remove(self, container_id: str | None) -> None:
        """Queue the removal (a session's close does not wait for the engine); run it now once drained."""
        if container_id is None:
            return
        if not self._remover.submit(functools.partial(ContainerProvider.remove, self, container_id)):
            super().remove(container_id)


class SessionPool(WarmPool[DockerSession, PoolConfig]):
    """Started sessions kept ready for one backend's settings (see the module docstring).

    ``DockerBackend(pool=...)`` makes and owns one; ``make_session`` builds an unstarted session from the
    pool's config and provider (the backend's tracked session class). The lifecycle is
    :class:`~adk_sandbox.executor.pool.WarmPool`'s; this class makes the members and fills them.
    """

    closed_message = "this DockerBackend is closed: its warm pool hands out no more sessions"
    timeout_message = (
        "no warm container was ready within {timeout:g} s ({creating} being started, at most {limit} at "
        "once): the Docker engine is slow or overloaded; nothing ran. Retry, or raise "
        "PoolConfig.acquire_timeout_seconds"
    )

    def __init__(
        self,
        client: docker.DockerClient,
        config: SessionConfig,
        settings: PoolConfig,
        make_session: SessionMaker,
        *,
        engine: str,
    ) -> None:
        if config.spec.workspace is not None or config.attach_to is not None:
            raise ValueError("a pool member has no workspace and is created, not attached")
        self.id = uuid.uuid4().hex[:12]
        """The ``io.adk-sandbox.pool`` label of this pool's containers."""
        spec = replace(config.spec, labels={**config.spec.labels, POOL_LABEL: self.id})
        self._config = replace(config, spec=spec)
        self._client = client
        self._make_session = make_session
        self._layer_owner: tuple[int, int] | None = None
        """A layered pool's command user (uid, gid): owns its members' directories (None: not layered)."""
        if settings.fork_by == "layer":
            self._layer_owner = _layered_owner(config, client)
        self._key = PoolKey.of(
            config,
            engine,
            workspace=settings.workspace,
            path=settings.path,
            forkable=settings.forkable,
            fork_by=settings.fork_by,
        )
        self.root: str | None = None
        """The host directory holding the members' workspace copies (``workspace="mirror"``), else None."""
        if settings.workspace == "mirror":
            self.root = tempfile.mkdtemp(prefix=copy_prefix("pool"), dir=copies_dir())  # 0700, ours
        super().__init__(
            settings,
            concurrency=settings.create_concurrency,
            tend_seconds=min(settings.max_age_seconds / 4, 15.0),
            max_age=settings.max_age_seconds,
            removers=settings.remove_concurrency,
        )

    @property
    def key(self) -> PoolKey:
        """What this pool's members are made from (the image digest is the newest member's)."""
        with self._cond:
            return replace(self._key, image_id=self._newest)

    @property
    def labels(self) -> Mapping[str, str]:
        """The labels of this pool's containers: the backend's, the pool's (the owner labels aside)."""
        return self._config.spec.labels

    # -- acquire -------------------------------------------------------------------------------------
    def serves_snapshot(self, snapshot: Snapshot) -> bool:
        """Whether a member can take ``snapshot``'s state: its workspace at this pool's ``path``, no root."""
        spec = self._config.spec
        if self._layer_owner is not None and not _layers_fit(snapshot, self._config, self._layer_owner):
            return False
        return (
            self.settings.path is not None
            and snapshot.workspace == self.settings.path
            and snapshot.root_image is None
            and not snapshot.root_archive
            and snapshot.image == spec.image
            and snapshot.profile == spec.profile
        )

    def acquire(self, copy_of: str | None = None, *, snapshot: Snapshot | None = None) -> DockerSession:
        """A started session no one used before; closing it removes its container (never reused).

        With ``workspace="mirror"``, ``copy_of`` (an absolute host directory) is copied into the member's
        workspace and pushed into it before it is handed out; the member is destroyed when that fails
        (the error is raised). :class:`SandboxFailedError` when the pool is closed or no member was ready
        in ``acquire_timeout_seconds``; a failed create's own error when one failed while this waited.
        With ``snapshot`` (a pool with ``path``, see :meth:`serves_snapshot`) the member takes the
        snapshot's state instead: its workspace copied in and pushed, its tmpfs archives unpacked; its
        refill waits for its first command (at most :data:`REFILL_DEFER_SECONDS`).
        """
        if snapshot is not None:
            if copy_of is not None or not self.serves_snapshot(snapshot):
                raise ValueError("this pool's members cannot take that snapshot (see serves_snapshot)")
        elif (copy_of is not None) != (self.settings.workspace == "mirror"):
            raise ValueError(
                "a pool of workspace copies (PoolConfig(workspace='mirror')) serves acquire(copy_of=...) only"
                if copy_of is None
                else "this pool's members have no workspace: acquire() only"
            )

        def prepare(session: DockerSession) -> float | None:
            if snapshot is not None:
                self._fill_snapshot(session, snapshot)
                return REFILL_DEFER_SECONDS
            if copy_of is not None:
                self._fill_copy(session, copy_of)
            return None

        return self._acquire(prepare)

    def _fill_copy(self, session: DockerSession, source: str) -> None:
        """Copy ``source`` into the member's empty workspace on the host and push it in."""
        workspace = session.workspace
        if workspace is None:  # pragma: no cover - every member of a mirror pool has one
            raise SandboxFailedError("a warm pool member has no workspace copy")
        copy_tree(source, workspace, self._config.mirror_mb * MIB)
        session.push_workspace()

    def _fill_snapshot(self, session: DockerSession, snapshot: Snapshot) -> None:
        """Give the member the snapshot's files (workspace copied, pushed; tmpfs unpacked).

        A forkable member's are all copied on the host: the workspace into its host directory and into its
        mirror's volume, /tmp and HOME into their volumes (docs/snapshots.md).
        """
        from adk_sandbox.executor.backends.docker._snapshot import restore_tmpfs  # noqa: PLC0415
        from adk_sandbox.executor.snapshots.copy import copy_workspace  # noqa: PLC0415

        if session.layers is not None:
            # The snapshot's copies become the member's lower layers: nothing copied.
            session.layers.fork(snapshot, session._opened().inspect)
            session.fork_method = "overlay"
            session.restore_notes = []
            session.origin = snapshot
            return
        session.fork_method = "copy"
        workspace = session.workspace
        hosted = snapshot.tmpfs_format == "tree" and set(snapshot.tmpfs) <= set(session.state_dirs)
        # /tmp and HOME copied on the host meanwhile (measured: 50 MB, most of it time in the kernel's
        # copy, without the interpreter's lock); through the channel otherwise, after the workspace. On
        # failure the member is destroyed after the copy aside ended (the executor waits for it).
        with ThreadPoolExecutor(1, thread_name_prefix="adk-sandbox-fork") as aside:
            tmpfs = aside.submit(restore_tmpfs, session, snapshot) if hosted else None
            if workspace is None:  # pragma: no cover - every member of a mirror pool has one
                raise SandboxFailedError("a warm pool member has no workspace copy")
            # A forkable member's copy in the sandbox is a volume this process reaches: filled on the
            # host by the walk that fills the host copy (each file read once), nothing through the
            # channel. Else the host copy, then a push.
            if session.fill_mirror_on_host(snapshot.workspace_dir, with_host=True) is None:
                copy_workspace(
                    snapshot.workspace_dir,
                    workspace,
                    self._config.mirror_mb * MIB,
                    "DockerBackend(mirror_size_mb=...)",
                )
                session.push_workspace()
            notes = tmpfs.result() if tmpfs is not None else restore_tmpfs(session, snapshot)
        session.restore_notes = notes
        session.origin = snapshot

    # -- members -------------------------------------------------------------------------------------
    def _new_member(self) -> DockerSession:
        config, workspace = self._member_config()
        try:
            return self._make_session(config, _PooledProvider(self._client, config.spec, self._remover))
        except BaseException:
            if workspace is not None:
                shutil.rmtree(workspace, ignore_errors=True)
            raise

    def _version(self, member: DockerSession) -> str | None:
        provider = member._provider
        return provider.image_id if isinstance(provider, _PooledProvider) else None

    def _after_first_command(self, member: DockerSession, hook: Callable[[], None]) -> None:
        member._call_after_first_command(hook)

    def _member_config(self) -> tuple[SessionConfig, str | None]:
        """A new member's config, and the workspace directory made for it (``"mirror"``; else None)."""
        if self.root is None:
            return self._config, None
        if self._layer_owner is not None:
            return self._layered_config(self._layer_owner), None
        # The member's volume is mounted at this same path inside.
        workspace = tempfile.mkdtemp(prefix="copy-", dir=self.root)
        inside = self.settings.path or workspace
        spec = replace(self._config.spec, workspace=inside, host_tmpfs=self.settings.forkable)
        config = replace(
            self._config,
            spec=spec,
            workspace_transport="mirror",
            workspace_is_copy=True,
            host_workspace=workspace if inside != workspace else None,
        )
        return config, workspace

    def _layered_config(self, owner: tuple[int, int]) -> SessionConfig:
        """A layered member's config: its state directories bound from mount points made for it."""
        from adk_sandbox.executor.backends.docker._layers import MemberLayers  # noqa: PLC0415
        from adk_sandbox.executor.backends.docker._spec import tmpfs_sizes  # noqa: PLC0415

        path = self.settings.path
        assert path is not None  # noqa: S101 - fork_by needs forkable, which needs a path
        sizes = {path: self._config.mirror_mb, **tmpfs_sizes(self._config.spec)}
        layers = MemberLayers.create(path, sizes, owner)
        spec = replace(self._config.spec, workspace=path, layer_binds=layers.binds, state_owner=owner)
        return replace(
            self._config,
            spec=spec,
            user=f"{owner[0]}:{owner[1]}",
            workspace_transport="bind",
            host_workspace=layers.points[path],
            layers=layers,
        )


def _layered_owner(config: SessionConfig, client: docker.DockerClient) -> tuple[int, int]:
    """The command user of a layered pool (this process's unless a numeric ``user`` says), checked first."""
    from adk_sandbox.executor.backends.docker._daemon import engine_of  # noqa: PLC0415
    from adk_sandbox.executor.backends.docker._layers import check_supported  # noqa: PLC0415

    check_supported(local=engine_of(client).local, runtime=config.spec.runtime)
    if config.user is None:
        return os.getuid(), os.getgid()
    if not config.user.replace(":", "").isdigit():
        raise ValueError("fork_by='layer' needs a numeric user (uid or uid:gid): its directories are its")
    uid, gid = uid_gid(config.user).split(":")
    return int(uid), int(gid)


def _layers_fit(snapshot: Snapshot, config: SessionConfig, owner: tuple[int, int]) -> bool:
    """Whether a layered member can take ``snapshot`` as its lower layers: trees of the command user's."""
    from adk_sandbox.executor.backends.docker._spec import tmpfs_sizes  # noqa: PLC0415

    if snapshot.tmpfs_format != "tree" or set(snapshot.tmpfs) != set(tmpfs_sizes(config.spec)):
        return False
    roots = [snapshot.workspace_dir, *(snapshot.tree(i) for i in range(len(snapshot.tmpfs)))]
    try:
        return all(os.stat(root).st_uid == owner[0] for root in roots)
    except OSError:
        return False
