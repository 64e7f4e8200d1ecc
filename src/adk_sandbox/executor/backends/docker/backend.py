"""DockerBackend: hardened per-session containers on a Docker engine (local or remote)."""

from __future__ import annotations

import inspect
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import docker

from adk_sandbox.executor.backend import SessionBackend, SessionFactory, check_one_source
from adk_sandbox.executor.backends.docker._checkpoint import require_checkpoints
from adk_sandbox.executor.backends.docker._container import ContainerProvider, WorkspaceNotSharedError
from adk_sandbox.executor.backends.docker._daemon import connect
from adk_sandbox.executor.backends.docker._layers import reap_layers
from adk_sandbox.executor.backends.docker._reaper import cleanup_session, reap_leaked
from adk_sandbox.executor.backends.docker._rootcap import root_cap_for, size_refusal
from adk_sandbox.executor.backends.docker._spares import ForkSpares
from adk_sandbox.executor.backends.docker._spec import (
    MIB,
    ContainerSpec,
    GitProtection,
    git_protection,
    tmpfs_overlap,
)
from adk_sandbox.executor.backends.docker.config import (
    DEFAULT_LIFETIME_SECONDS,
    DockerConfig,
    config_from_options,
)
from adk_sandbox.executor.backends.docker.engine import Engine, resolve_engine
from adk_sandbox.executor.backends.docker.images import BASE_IMAGE, ExpectedImage, local_image_id
from adk_sandbox.executor.backends.docker.pool import PoolConfig, SessionPool
from adk_sandbox.executor.backends.docker.session import DockerSession, SessionConfig
from adk_sandbox.executor.channel.static_agent import bound_agent_directory
from adk_sandbox.executor.errors import InvalidRequestError, PolicyNotEnforceableError
from adk_sandbox.executor.network.policy import NetworkPolicy
from adk_sandbox.executor.policy import SandboxPolicy
from adk_sandbox.executor.types import Capabilities, ResourceLimits
from adk_sandbox.executor.workspace.auto import AUTO_CHOICES
from adk_sandbox.executor.workspace.copies import copies_dir, copy_prefix, copy_tree, reap_copies
from adk_sandbox.executor.workspace.mirror import DEFAULT_MIRROR_MB

if TYPE_CHECKING:
    from adk_sandbox.executor.snapshots.model import Snapshot
    from adk_sandbox.executor.snapshots.store import SnapshotStore

__all__ = ["DockerBackend"]


def _expected_on_remote(engine: Engine, image: str) -> ExpectedImage | None:
    """On a remote engine, the id ``image`` has on this machine's engine (a mismatch warns); else None."""
    if engine.local:
        return None
    local_id = local_image_id(image)
    return ExpectedImage(local_id, pinned=False) if local_id is not None else None


class DockerBackend(SessionBackend[DockerSession]):
    """Creates :class:`DockerSession` s: one hardened container per session (docs/DOCKER.md).

    >>> backend = DockerBackend()                                  # doctest: +SKIP
    >>> with backend.session(workspace="/path/to/repo") as session:  # doctest: +SKIP
    ...     session.execute(ExecRequest(language="command", code="pwd", timeout=10)).stdout

    ``container="name"`` attaches to an existing container instead (verified the same way, never removed
    here). Creating a backend connects to the daemon (:class:`BackendUnavailableError` when none answers) and
    reaps this project's leaked containers. What each container enforces: docs/docker/hardening.md,
    "Honest isolation", and docs/docker/profiles.md.
    """

    name = "docker"

    def __init__(  # noqa: PLR0917 - positional order kept for callers
        self,
        image: str = BASE_IMAGE,
        limits: ResourceLimits | None = None,
        runtime: str | None = None,
        network: bool | NetworkPolicy = False,
        user: str | None = None,
        container: str | None = None,
        *,
        policy: SandboxPolicy | None = None,
        lifetime_seconds: int = DEFAULT_LIFETIME_SECONDS,
        transport: str = "agent",
        tmpfs: Mapping[str, int] | None = None,
        labels: Mapping[str, str] | None = None,
        engine: Engine | str | None = None,
        extra_hosts: Mapping[str, str] | None = None,
        workspace_transport: str = "auto",
        mirror_size_mb: int = DEFAULT_MIRROR_MB,
        image_id: str | None = None,
        pool: int | PoolConfig | None = None,
        profile: str = "hardened",
        root_size_mb: int | None = None,
        fork_spares: int = 1,
        checkpoints: bool = False,
        idle_pause_seconds: float | None = None,
        config: DockerConfig | None = None,
    ) -> None:
        """Connect to the daemon and reap leaked containers.

        The settings are a :class:`~adk_sandbox.executor.backends.docker.config.DockerConfig`: either
        ``config=``, or the keyword options, which build one (each option is the field of the same name, where
        it is documented; None means the default) -- not both. Invalid settings raise
        :class:`InvalidRequestError` (:class:`PolicyNotEnforceableError` for a policy that does not allow
        spawning processes) before anything connects.

        In short: ``profile`` is ``"hardened"`` (the default) or ``"task"`` (an evaluation's image as it is:
        its user, a writable root capped at ``root_size_mb``; docs/docker/profiles.md); ``user`` ("uid:gid" or
        names) overrides running commands as the owner of the workspace root; ``policy`` adds bind mounts,
        environment and network permission; ``transport`` can only be ``"agent"`` (the default; ``"exec"`` was
        removed and is refused); ``tmpfs`` adds writable tmpfs mounts and ``labels`` container labels (neither
        with ``container=``, which attaches to an existing container); ``engine`` picks the Docker engine
        (default: the one the Docker CLI would use); ``workspace_transport`` (``"auto"``, ``"bind"``,
        ``"mirror"``) and ``mirror_size_mb`` say how a workspace reaches the container (a policy's host paths
        are bound, so a remote engine refuses them); ``image_id`` pins the image; ``pool`` keeps that many
        containers (or as a :class:`~adk_sandbox.executor.backends.docker.pool.PoolConfig` says) started for
        workspace-less sessions, or with ``PoolConfig(workspace="mirror")`` for ``session(copy_of=...)``
        (docs/DOCKER.md, "Warm pool"); ``fork_spares`` keeps that many started containers per forked workspace
        path, so forks of any session come warm, by layer (docs/snapshots.md, "Forks of any session"; 0:
        none); ``checkpoints`` lets ``session.pause()`` move a session to a checkpoint on disk with every
        process (gVisor or runc; docs/pause.md), and ``idle_pause_seconds`` does so by itself once a
        session sat idle that long.
        """
        options: dict[str, object] = {
            "image": image,
            "limits": limits,
            "runtime": runtime,
            "network": network,
            "user": user,
            "container": container,
            "policy": policy,
            "lifetime_seconds": lifetime_seconds,
            "transport": transport,
            "tmpfs": tmpfs,
            "labels": labels,
            "extra_hosts": extra_hosts,
            "engine": engine,
            "workspace_transport": workspace_transport,
            "mirror_size_mb": mirror_size_mb,
            "image_id": image_id,
            "pool": pool,
            "profile": profile,
            "root_size_mb": root_size_mb,
            "fork_spares": fork_spares,
            "checkpoints": checkpoints,
            "idle_pause_seconds": idle_pause_seconds,
        }
        if config is None:
            config = config_from_options(options)
        else:
            given = [name for name, value in options.items() if value != _DEFAULTS[name]]
            if given:
                raise InvalidRequestError(
                    f"give DockerBackend either config= or keyword options, not both (also given: "
                    f"{', '.join(given)}); put them in the config (config.model_copy(update={{...}}))"
                )
        super().__init__()
        self.config = config
        """This backend's settings, as checked (built from the keyword options when no config was given).

        The one copy of them: the attributes of the same names below read it, and every session's
        :class:`SessionConfig` is made from it (:meth:`_session_config`)."""
        self.engine = resolve_engine(config.engine)
        """The Docker engine this backend's sessions run on."""
        self._client = connect(engine=self.engine)
        if config.checkpoints:
            require_checkpoints(self._client, config.runtime)
        self.expect_image = config.pinned_image or _expected_on_remote(self.engine, config.image)
        """The image id sessions' containers must run (pinned) or are expected to (read from this machine)."""
        self.root_cap: tuple[str, int] | None = None
        """How a task container's root writes are capped here (``"memory"``, ``"quota"`` or ``"watched"``)
        and the cap in MiB; None in the hardened profile (docs/docker/profiles.md)."""
        if config.root_cap_mb is not None:
            client = self._client
            self.root_cap = root_cap_for(
                client.info(), config.runtime, config.limits, config.root_cap_mb,
                explicit=config.root_size_mb is not None,
                size_refused=lambda size_mb: size_refusal(client, config.image, size_mb),
            )  # fmt: skip
        self.proxy_offered: bool | None = None
        """Whether a session's agent here serves the proxy endpoint a NetworkPolicy needs (its HELLO says
        ``"proxy"``); None until :meth:`capabilities` probed a session."""
        self.reaped = reap_leaked(self._client)
        """Leaked containers this backend removed when it started."""
        self.reaped_copies = reap_copies()
        """Workspace copies (``session(copy_of=...)``) of gone owners this backend removed as it started."""
        self.reaped_layers = reap_layers()
        """Layered pool members' mount points and directories of gone owners, unmounted and removed (before
        the snapshots: a snapshot that is a live fork's lower is not removed)."""
        from adk_sandbox.executor.backends.docker._snapshot import reap_snapshots  # noqa: PLC0415 - imports this module
        from adk_sandbox.executor.snapshots.store import SnapshotStore  # noqa: PLC0415

        self.snapshots: SnapshotStore = SnapshotStore()
        """Where this backend's sessions put their snapshots (docs/snapshots.md); replace it to use
        another."""
        self.reaped_snapshots = reap_snapshots(self._client, self.snapshots)
        """Snapshots (expired, or their owner gone) and snapshot images this backend removed as it started."""
        self.pool: SessionPool | None = None
        """The warm pool (``pool=``): of workspace-less sessions, or of copies (``workspace="mirror"``)."""
        if config.pool is not None:
            self.pool = SessionPool(
                self._client,
                self._session_config(None),
                config.pool,
                self._pool_member,
                engine=self.engine.describe(),
            )
        self._spares = ForkSpares(
            self._client,
            lambda: self._session_config(None),
            self._pool_member,
            size=config.fork_spares if config.container is None and config.profile == "hardened" else 0,
            engine=self.engine.describe(),
            local=self.engine.local,
        )

    # -- the settings, read from self.config (never copied) --------------------------------------------
    @property
    def image(self) -> str:
        """The image of this backend's containers (``config.image``)."""
        return self.config.image

    @property
    def limits(self) -> ResourceLimits:
        """The resource limits of this backend's containers (``config.limits``)."""
        return self.config.limits

    @property
    def profile(self) -> str:
        """The containers' shape: ``"hardened"`` or ``"task"`` (docs/docker/profiles.md)."""
        return self.config.profile

    @property
    def runtime(self) -> str | None:
        """The OCI runtime (``"runsc"`` for gVisor; None: the engine's default)."""
        return self.config.runtime

    @property
    def network(self) -> bool:
        """Whether containers get Docker's bridge: ``config.network is True``, or a policy that allows it."""
        return self.config.network is True or self.config.policy.allow_network

    @property
    def egress(self) -> NetworkPolicy | None:
        """The network policy of this backend's sessions (``config.network`` when it is one; else None).

        Their containers keep network none; each session's agent serves the proxy (docs/network.md).
        """
        return self.config.egress

    @property
    def user(self) -> str | None:
        """``uid:gid`` commands run as (None: the owner of the workspace root)."""
        return self.config.user

    @property
    def container(self) -> str | None:
        """The existing container sessions attach to (None: each session creates its own)."""
        return self.config.container

    @property
    def policy(self) -> SandboxPolicy:
        """The sandbox policy: extra mounts, environment, network permission."""
        return self.config.policy

    @property
    def lifetime_seconds(self) -> int:
        """How long a container may live before any reaper removes it."""
        return self.config.lifetime_seconds

    @property
    def transport(self) -> str:
        """The command channel of this backend's sessions: ``"agent"``, the only one."""
        return self.config.transport

    @property
    def labels(self) -> Mapping[str, str]:
        """The user labels of this backend's containers, validated."""
        return self.config.labels

    @property
    def extra_hosts(self) -> Mapping[str, str]:
        """The names this backend's containers get in ``/etc/hosts`` (name -> loopback address)."""
        return self.config.extra_hosts

    @property
    def tmpfs(self) -> Mapping[str, int]:
        """The extra tmpfs mounts of this backend's containers (path -> MiB), validated."""
        return self.config.tmpfs

    @property
    def workspace_transport(self) -> str:
        """How sessions' workspaces reach their containers, as asked: ``"auto"``, ``"bind"``, ``"mirror"``."""
        return self.config.workspace_transport

    @property
    def mirror_size_mb(self) -> int:
        """Size cap of a mirrored workspace's volume, in MiB."""
        return self.config.mirror_size_mb

    def _pool_member(self, config: SessionConfig, provider: ContainerProvider) -> DockerSession:
        return DockerSession(self._client, config, provider=provider)

    def _track(self, session: DockerSession) -> DockerSession:
        """Hold ``session`` (see :class:`SessionBackend`), and give it what its snapshots and forks need."""
        session.snapshot_store = self.snapshots
        session._forker = self._fork_from
        session._adopt = self._track
        session._image_remover = self._remove_image
        session._before_snapshot = self._prepare_spare
        return super()._track(session)

    @property
    def spares(self) -> list[SessionPool]:
        """The pools of fork spares this backend keeps now, one per forked workspace path.

        ``fork_spares`` members each (docs/snapshots.md, "Forks of any session").
        """
        return self._spares.pools()

    def _prepare_spare(self, session: DockerSession) -> None:
        """Start a spare for forks of ``session`` unless the warm pool serves its path (``_spares``)."""
        if self.pool is None or self.pool.settings.path != session.workspace_inside:
            self._spares.prepare(session)

    def _fork_from(self, snapshot: Snapshot) -> DockerSession:
        return self.session(snapshot=snapshot)

    def _remove_image(self, image: str) -> None:
        from adk_sandbox.executor.backends.docker._snapshot import remove_snapshot_image  # noqa: PLC0415

        remove_snapshot_image(self._client, image)

    @property
    def client(self) -> docker.DockerClient:
        """The engine connection this backend's sessions use."""
        return self._client

    def list_snapshots(self) -> list[Snapshot]:
        """The snapshots in :attr:`snapshots`, oldest first."""
        return self.snapshots.list()

    def remove_snapshot(self, snapshot: str | Snapshot) -> Snapshot:
        """Remove a snapshot (by id, name or record): its root image, then its directory; what was removed.

        A snapshot whose root image a running session uses is refused (:class:`InvalidRequestError`) and
        kept as it was.
        """
        return self.snapshots.remove(snapshot, self._remove_image)

    def reap_snapshots(self) -> list[str]:
        """Remove the leaked snapshots now (expired, or their owner gone); what was removed and why."""
        from adk_sandbox.executor.backends.docker._snapshot import reap_snapshots  # noqa: PLC0415

        return reap_snapshots(self._client, self.snapshots)

    def session(
        self,
        workspace: str | os.PathLike[str] | None = None,
        *,
        copy_of: str | os.PathLike[str] | None = None,
        snapshot: Snapshot | str | None = None,
    ) -> DockerSession:
        """A new session, its container bound to ``workspace`` (mounted at the same absolute path).

        Without a workspace, and with ``pool=``, an already started container from the warm pool.

        ``copy_of`` instead gives the session a fresh copy of that directory (``session.workspace``, mirrored
        into the container at its own path, removed at close: read results before); the directory given is
        only read. From the pool with ``PoolConfig(workspace="mirror")``, else cold (docs/docker/pool.md).

        ``snapshot`` (a :class:`~adk_sandbox.executor.snapshots.Snapshot`, or its id or name in
        :attr:`snapshots`) starts a session holding the snapshot's files, from the warm pool when its members'
        workspace is at the snapshot's path (``PoolConfig(path=...)``), else cold (docs/snapshots.md).
        """
        check_one_source(workspace, copy_of, snapshot)
        if snapshot is not None:
            return self._snapshot_session(snapshot)
        if copy_of is not None:
            return self._copy_session(copy_of)
        if workspace is None and self.pool is not None and self.pool.key.workspace == "none":
            # A workspace cannot come from the pool: its mount point is fixed at create (copy_of can).
            return self._track(self.pool.acquire())
        return self._open_session(self._session_config(workspace))

    def _copy_session(self, source: str | os.PathLike[str]) -> DockerSession:
        """A session on a copy of ``source``: from the pool of copies when there is one, else cold."""
        if self.container is not None:
            raise InvalidRequestError(
                "copy_of= makes a container holding a copy of the directory; an attached container "
                "(container=) mounts its workspace itself: use workspace="
            )
        root = str(Path(source).resolve(strict=False))
        if not os.path.isdir(root):
            raise InvalidRequestError(f"copy_of {str(source)!r} is not a directory")
        pool = self.pool if self.pool is not None and self.pool.key.workspace == "mirror" else None
        copies = copies_dir()  # where the copies are made (a pool's root is below it too)
        if _contains(root, copies):
            raise InvalidRequestError(
                f"copy_of {root!r} holds the directory the copies are made in ({copies}): a copy would "
                "take in other sessions' copies. Give the directory of the project itself"
            )
        if pool is not None:
            return self._track(pool.acquire(copy_of=root))
        scratch = tempfile.mkdtemp(prefix=copy_prefix("copy"), dir=copies)  # 0700, this process's
        try:
            copy_tree(root, scratch, self.mirror_size_mb * MIB)
            config = replace(self._session_config(scratch, mode="mirror"), workspace_is_copy=True)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        return self._open_session(config)

    def _snapshot_session(self, given: Snapshot | str) -> DockerSession:
        """A session holding a snapshot's files: from the pool when its members fit, else cold."""
        from adk_sandbox.executor.backends.docker._root_archive import restore_root  # noqa: PLC0415
        from adk_sandbox.executor.backends.docker._snapshot import fork_workspace, restore_tmpfs  # noqa: PLC0415
        from adk_sandbox.executor.snapshots.model import Snapshot  # noqa: PLC0415

        snapshot = given if isinstance(given, Snapshot) else self.snapshots.get(given)
        self._check_snapshot(snapshot)
        if snapshot.processes is not None:
            return self._session_with_processes(snapshot)
        pool = self.pool
        if pool is not None and pool.serves_snapshot(snapshot):
            return self._track(pool.acquire(snapshot=snapshot))
        spare = self._spares.acquire(snapshot)
        if spare is not None:
            spare.origin = snapshot
            return self._track(spare)
        host = fork_workspace(snapshot, self.mirror_size_mb * MIB)
        try:
            config = self._session_config(host, mode="mirror" if host is not None else None)
            spec = replace(config.spec, workspace=snapshot.workspace, image=snapshot.root_image or self.image)
            if snapshot.workspace is not None:
                spec = replace(spec, read_only_mounts=(), git_placeholder=None)
            config = replace(
                config,
                spec=spec,
                host_workspace=host,
                workspace_is_copy=host is not None,
                # A root image is the snapshot's own, made from the image this backend expects.
                expect_image=None if snapshot.root_image else config.expect_image,
            )
        except BaseException:
            if host is not None:
                shutil.rmtree(host, ignore_errors=True)
            raise
        session = self._open_session(config)
        try:
            session.start()
            notes = restore_root(session, snapshot) if snapshot.root_archive else []
            session.restore_notes = notes + restore_tmpfs(session, snapshot)
            session.fork_method = "copy"
        except BaseException:
            session.close()  # removes the container and the host copy
            raise
        session.origin = snapshot
        return session

    def _session_with_processes(self, snapshot: Snapshot) -> DockerSession:
        """A session restored from a snapshot's checkpoint: every process where it was (docs/pause.md)."""
        from adk_sandbox.executor.backends.docker._process_snapshot import start_from_kept  # noqa: PLC0415
        from adk_sandbox.executor.backends.docker._snapshot import host_copy  # noqa: PLC0415

        if not self.config.checkpoints or snapshot.runtime != self.config.runtime:
            raise PolicyNotEnforceableError(
                f"snapshot {snapshot.id} keeps processes: a session starts from it only on a backend made "
                f"with checkpoints=True and runtime={snapshot.runtime!r}, like the one it was taken on"
            )
        config = self._session_config(None)
        if snapshot.workspace is not None:  # a copy of its own, bound where the snapshot's was inside
            copy = host_copy(snapshot.workspace_dir, self.mirror_size_mb * MIB, owned_as_source=True)
            git = os.path.join(snapshot.workspace, ".git")  # read-only as it was: a restore needs the mount
            spec = replace(
                config.spec, workspace=snapshot.workspace, workspace_source=copy, read_only_mounts=(git,)
            )
            config = replace(
                config, spec=spec, host_workspace=copy, workspace_is_copy=True, workspace_transport="bind"
            )
        session = self._open_session(config)
        start_from_kept(session, snapshot)
        try:
            session.start()
        except BaseException:
            session.close()
            raise
        session.origin = snapshot
        return session

    def _check_snapshot(self, snapshot: Snapshot) -> None:
        """Refuse a snapshot this backend's sessions cannot start from (nothing is made then)."""
        if snapshot.backend != "docker":
            raise InvalidRequestError(
                f"snapshot {snapshot.id} is a {snapshot.backend} session's: start it on that backend"
            )
        if self.container is not None:
            raise InvalidRequestError(
                "snapshot= makes a container holding the snapshot's files; an attached container "
                "(container=) "
                "cannot be given them"
            )
        if snapshot.profile != self.profile or snapshot.image != self.image:
            raise InvalidRequestError(
                f"snapshot {snapshot.id} was taken of a {snapshot.profile!r} session of image "
                f"{snapshot.image!r}; "
                f"this backend makes {self.profile!r} sessions of {self.image!r}: start it on a backend like "
                "the one it was taken on"
            )
        if not os.path.isdir(snapshot.path):
            raise InvalidRequestError(f"snapshot {snapshot.id} was removed ({snapshot.path} is gone)")

    def _session_config(
        self, workspace: str | os.PathLike[str] | None, mode: str | None = None
    ) -> SessionConfig:
        """The checked settings of a session of this backend bound to ``workspace`` (or none).

        ``mode`` overrides the backend's workspace transport (a copy is always mirrored).
        """
        mode = mode or self.workspace_transport
        if self.container is not None:
            mode = "bind"  # an attached container mounts the workspace itself
        elif mode == "auto" and (not self.engine.local or self.profile == "task"):
            # A remote engine never sees this machine's files; a task container may leave set-uid files.
            mode = "mirror"
        if self.config.checkpoints and workspace is not None:
            if mode == "mirror":
                raise PolicyNotEnforceableError(
                    "checkpoints=True keeps a workspace only as a bind mount: a copy's volume is emptied "
                    "when a checkpoint stops the container (docs/pause.md); the task profile and a remote "
                    "engine copy it"
                )
            mode = "bind"  # never "auto"'s fallback to a copy
        if not self.engine.local:
            self._refuse_host_paths(workspace if mode == "bind" else None)
        root: str | None = None
        if workspace is not None:
            root = str(Path(workspace).resolve(strict=False))
            if not os.path.isdir(root):
                raise InvalidRequestError(f"workspace {str(workspace)!r} is not a directory")
        for allowed in self.policy.allowed_paths:
            if not os.path.exists(allowed.path):
                raise InvalidRequestError(f"policy path {allowed.path!r} does not exist")
        if root is not None:
            overlap = tmpfs_overlap(self.tmpfs, [root])
            if overlap:
                raise InvalidRequestError(overlap)
        protection = (
            git_protection(root) if root and self.container is None and mode != "mirror" else GitProtection()
        )
        spec = ContainerSpec(
            image=self.image,
            limits=self.limits,
            runtime=self.runtime,
            network=self.network,
            workspace=root,
            extra_mounts=self.policy.allowed_paths,
            read_only_mounts=protection.read_only_mounts,
            git_placeholder=protection.placeholder,
            extra_tmpfs=self.tmpfs,
            labels=self.labels,
            extra_hosts=self.extra_hosts,
            lifetime_seconds=self.lifetime_seconds,
            profile=self.profile,
            root_cap=self.root_cap[0] if self.root_cap else None,
            root_size_mb=self.root_cap[1] if self.root_cap else 0,
            checkpoints=self.config.checkpoints,
            # CRIU restores no executable from a memfd: a runc keeper runs a bound binary (docs/pause.md)
            bound_agent=bound_agent_directory()
            if self.config.checkpoints and self.runtime != "runsc"
            else None,
        )
        return SessionConfig(
            spec=spec,
            user=self.user,
            policy_env=self.policy.env,
            attach_to=self.container,
            workspace_transport=mode,
            mirror_mb=self.mirror_size_mb,
            expect_image=self.expect_image,
            egress=self.egress,
            idle_pause_seconds=self.config.idle_pause_seconds,
        )

    def _open_session(self, config: SessionConfig) -> DockerSession:
        return self._track(DockerSession(self._client, config))

    def _refuse_host_paths(self, workspace: str | os.PathLike[str] | None) -> None:
        """A remote engine cannot bind this machine's paths: refuse rather than run against other files.

        A bind mount names a path on the engine's machine: there it is another directory or none, and a
        command would read and write files that are not the user's (or the engine would make an empty
        directory at that path). ``workspace`` is given only when it would be bound (a mirror travels).
        """
        paths = ([str(workspace)] if workspace is not None else []) + [
            allowed.path for allowed in self.policy.allowed_paths
        ]
        if paths:
            raise PolicyNotEnforceableError(
                f"the Docker engine {self.engine.describe()} is not on this machine (only a unix:// socket "
                f"is), so it cannot mount {', '.join(repr(p) for p in paths)}: a bind mount there would "
                "show the engine machine's files at that path, not these. Nothing ran. A workspace can "
                "travel as a copy (DockerBackend(workspace_transport='mirror' or 'auto')); policy paths "
                "cannot: open the session without them (backend.session()), or use a local engine"
            )

    def cleanup(self, session_id: str) -> list[str]:
        """Remove the containers of the session ``session_id`` (from any process); return their ids.

        See :func:`adk_sandbox.executor.backends.docker.cleanup_session`. A session of this backend that is
        still open gets a fresh container on its next command.
        """
        return cleanup_session(session_id, self._client)

    def _probe_capabilities(self) -> Capabilities:
        """What a session container of this backend enforces, read from a workspace-less one."""
        with self.session() as probe:
            capabilities = probe.capabilities()
            self.proxy_offered = probe.proxy_offered()
            return capabilities

    def capabilities(self, workspace: str | os.PathLike[str] | None = None) -> Capabilities:
        """What a session container of this backend enforces, read from a real one (probed once).

        ``workspace`` says how a workspace would reach it: ``"bind"`` or ``"mirror"`` where the backend's
        settings decide (``workspace_transport`` forced, a remote engine, an attached container), and
        ``"auto"`` where ``"auto"`` decides per workspace at each session's start (a local engine). Given
        ``workspace=``, the answer is for that directory: what ``"auto"`` found for it before on this
        engine (:class:`~adk_sandbox.executor.workspace.auto.AutoChoices`), else what a session of it finds
        (one is started).
        """
        mode = self._workspace_mode_for(workspace)
        return super().capabilities().model_copy(update={"workspace": mode})

    def _workspace_mode_for(self, workspace: str | os.PathLike[str] | None) -> str:
        """How ``workspace`` (None: any) would reach a session's container (see :meth:`capabilities`)."""
        config = self._session_config(workspace)
        mode = config.workspace_transport
        if mode != "auto" or workspace is None:
            return mode
        root = config.spec.workspace or ""
        key = AUTO_CHOICES.key(self.engine.socket_path, root)
        known = AUTO_CHOICES.get(key)
        if known is not None:
            return known
        # The identity check alone (a bound session's start), not a mirror's push of the whole workspace.
        found: Literal["bind", "mirror"] = "bind"
        try:
            with self._open_session(replace(config, workspace_transport="bind")):
                pass
        except WorkspaceNotSharedError:
            found = "mirror"
        AUTO_CHOICES.put(key, found)
        return found

    def close(self) -> None:
        """Close every session of this backend still open (their containers are removed), drain the pool."""
        super().close()  # a pooled session's removal is queued in the pool, which the next line waits for
        self._spares.close()
        if self.pool is not None:
            self.pool.close()
        self._client.close()


#: The keyword options' defaults: an option equal to its default counts as not given (with ``config=``).
_DEFAULTS: dict[str, object] = {
    name: parameter.default
    for name, parameter in inspect.signature(DockerBackend.__init__).parameters.items()
    if name not in ("self", "config")
}


def _contains(outer: str, inner: str) -> bool:
    """Whether the directory ``inner`` is ``outer`` or below it (both absolute)."""
    inner = os.path.realpath(inner)
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


if TYPE_CHECKING:  # checked by mypy, never run: the Docker backend is a SessionFactory as it is written

    def _docker_backend_opens_sessions(backend: DockerBackend) -> SessionFactory:
        return backend
