"""A session: one hardened container, reused by every command, removed at close.

Three parts with one job each: the container provider (:mod:`._container`: create, verify, remove), the
command transport (the engine-neutral agent channel of :mod:`adk_sandbox.executor.channel`, its agent
started over the stream of one exec of :mod:`._exec`: how a command reaches the container), and this
session, which owns the lifecycle: it opens a container, checks it from inside
(:mod:`adk_sandbox.executor.channel.probe`), runs commands through the transport, and replaces the
container (or its agent) when it died, counting that in :attr:`DockerSession.restarts`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

import docker
import docker.errors

from adk_sandbox.executor._env import build_child_env
from adk_sandbox.executor._languages import LANGUAGES, request_argv
from adk_sandbox.executor._mountinfo import read_mountinfo
from adk_sandbox.executor._output import OutputCapture
from adk_sandbox.executor._users import is_numeric
from adk_sandbox.executor.backend import OutputCallback
from adk_sandbox.executor.backends.docker._checkpoint import (
    ContainerCheckpoints,
    adopt_agent,
    checkpoint_agent,
    keeper_opener,
    restore_agent,
    start_from_copy,
)
from adk_sandbox.executor.backends.docker._container import (
    ContainerProvider,
    OomCounter,
    OpenedContainer,
    WorkspaceNotSharedError,
)
from adk_sandbox.executor.backends.docker._daemon import engine_of
from adk_sandbox.executor.backends.docker._dialect import Dialect
from adk_sandbox.executor.backends.docker._exec import DockerExecs
from adk_sandbox.executor.backends.docker._held import (
    HeldFile,
    held_host_files,
    held_sizes,
    missing_held_files,
)
from adk_sandbox.executor.backends.docker._rootcap import RootWatcher
from adk_sandbox.executor.backends.docker._spec import (
    GVISOR_RUNTIME,
    MIB,
    ContainerSpec,
    MirrorVolume,
    capabilities_from_inspect,
    host_tmpfs_dirs,
    isolation_of,
    mirror_mount_violations,
    tmpfs_sizes,
)
from adk_sandbox.executor.backends.docker.images import ExpectedImage, ImageMismatchWarning, image_mismatch
from adk_sandbox.executor.channel.agent_transport import AgentTransport, DetachedAgent
from adk_sandbox.executor.channel.egress import (
    NETWORK_OFF_RULE,
    EgressMode,
    SessionEgress,
    SessionNetwork,
    check_network_argument,
)
from adk_sandbox.executor.channel.idle import IdlePauser, cgroup_cpu_reader
from adk_sandbox.executor.channel.probe import verify_from_inside
from adk_sandbox.executor.channel.session import ChannelSession, uid_gid
from adk_sandbox.executor.channel.transport import (
    CommandOutcome,
    CommandTransport,
    ContainerGoneError,
    PreparedCommand,
)
from adk_sandbox.executor.errors import (
    ExecutorError,
    InvalidRequestError,
    PolicyNotEnforceableError,
    SandboxFailedError,
)
from adk_sandbox.executor.network.intercept import Interceptor
from adk_sandbox.executor.network.policy import NetworkPolicy
from adk_sandbox.executor.types import (
    Capabilities,
    ExecRequest,
    ExecResult,
    IsolationClass,
    Language,
)
from adk_sandbox.executor.workspace.auto import AUTO_CHOICES
from adk_sandbox.executor.workspace.bind import BindWorkspace
from adk_sandbox.executor.workspace.mirror import DEFAULT_MIRROR_MB, MirrorWorkspace
from adk_sandbox.executor.workspace.synced import SyncChannel, SyncedWorkspace

if TYPE_CHECKING:  # the snapshots package imports this module's names: imported where used at run time
    from adk_sandbox.executor.backends.docker._layers import MemberLayers
    from adk_sandbox.executor.snapshots.model import KeptEndpoint, Snapshot, SnapshotOptions
    from adk_sandbox.executor.snapshots.store import SnapshotStore

__all__ = ["NETWORK_OFF_RULE", "DockerSession", "SessionConfig", "TransportFactory", "agent_transport"]

log = logging.getLogger(__name__)

NOBODY = "65534:65534"
#: How long a pause to disk waits for a published port's connections to end (their client just closed).
CONNECTION_GRACE_SECONDS = 2.0

_PROGRAM_LANGUAGES = {
    LANGUAGES[lang].program: lang for lang in (Language.PYTHON, Language.JAVASCRIPT, Language.RUST)
}
_PROBE_LANGUAGES = (
    f"for p in {' '.join(_PROGRAM_LANGUAGES)}; do command -v $p >/dev/null 2>&1 && echo $p; done"
)


class TransportFactory(Protocol):
    """Makes the transport of one container.

    Called with the client, the container id, a callback told why when an agent restarts, and
    ``setid_allowed``: True for a task-profile sandbox, whose commands may set set-id modes (dpkg installs
    set-uid programs; its workspace only travels as a copy whose pull-back strips them), False for the
    per-command set-id filter. A factory must honour it: the start-up probe checks the choice from inside.
    """

    def __call__(
        self,
        client: docker.DockerClient,
        container_id: str,
        on_restart: Callable[[str], None],
        *,
        setid_allowed: bool,
    ) -> CommandTransport:
        """The transport of ``container_id``, with or without the per-command set-id filter."""
        ...


def agent_transport(
    client: docker.DockerClient, container_id: str, on_restart: Callable[[str], None], *, setid_allowed: bool
) -> CommandTransport:
    """The agent channel of ``container_id``, each agent started by one exec (a :class:`TransportFactory`).

    The one way commands reach a Docker container (docs/docker/agent-channel.md, "One agent, one way in").
    """
    opener = DockerExecs(client, container_id, engine_of(client)).open_agent_stream
    return AgentTransport(opener, on_restart=on_restart, setid_allowed=setid_allowed)


@dataclass(frozen=True)
class SessionConfig:
    """What a :class:`DockerBackend` hands each of its sessions."""

    spec: ContainerSpec
    """How to create the container (ignored when attaching)."""
    user: str | None
    """uid:gid for commands; None: the owner of the workspace root (nobody without a workspace)."""
    policy_env: Mapping[str, str]
    attach_to: str | None = None
    """Name or id of an existing container to use instead of creating one."""
    workspace_transport: str = "bind"
    """How the workspace reaches it: ``"bind"``, ``"mirror"`` or ``"auto"`` (bind unless the engine does not
    see this machine's directory, then mirror); see :mod:`adk_sandbox.executor.workspace`."""
    mirror_mb: int = DEFAULT_MIRROR_MB
    """Size cap of a mirrored workspace's volume, in MiB."""
    expect_image: ExpectedImage | None = None
    """The image id the container must run (refused when pinned, warned about otherwise); None: any."""
    egress: NetworkPolicy | None = None
    """A network policy (issue 23): the agent serves an HTTP proxy on 127.0.0.1, each connection decided on
    this host by :func:`~adk_sandbox.executor.network.relay.relay`; the container keeps network none."""
    direct_egress: bool = True
    """Under a policy on a local engine, offer the agent the direct path (a Unix socket bound read-only,
    docs/network.md "Speed"); False: every proxied connection travels over the channel (the bench's
    comparison)."""
    workspace_is_copy: bool = False
    """The workspace is a copy this library made for the session (``backend.session(copy_of=...)``, see
    docs/DOCKER.md "Warm pool"): removed from the host once the session closed."""
    host_workspace: str | None = None
    """The workspace's host directory when it is not at ``spec.workspace`` (the path inside): a session
    from a snapshot mirrors a directory of its own at the snapshot's workspace path (docs/snapshots.md).
    None: the same path on both sides."""
    layers: MemberLayers | None = None
    """A layered pool member's mount points (``PoolConfig(fork_by="layer")``), released when it closes."""
    idle_pause_seconds: float | None = None
    """Pause the session to disk once it sat idle this long (``DockerConfig.idle_pause_seconds``)."""


def argv_for(request: ExecRequest) -> tuple[str, ...]:
    """The program and arguments that run ``request`` inside the container."""
    return request_argv(request, "docker")


class DockerSession(SessionNetwork, ChannelSession):
    """One container for the whole session: created at entry (or first use), reused, removed at close.

    Commands run with a cleared environment, as the workspace root's owner, in the workspace root, unless a
    request's ``user`` or ``cwd`` says otherwise; a container that died is replaced at the next command
    (:attr:`restarts`). Depth: docs/docker/sessions.md.

    ``transport`` overrides how commands reach the container (default: :func:`agent_transport`, the
    agent channel; a test wraps it); ``provider`` the container provider (default: one for ``config``; the
    warm pool, :mod:`.pool`, passes one whose removals run in its background remover).
    """

    name = "docker"
    _GONE = "the sandbox container is gone; run a command to get a fresh one"
    _WHERE = "the Docker session's container"

    def __init__(
        self,
        client: docker.DockerClient,
        config: SessionConfig,
        *,
        transport: TransportFactory | None = None,
        provider: ContainerProvider | None = None,
    ) -> None:
        self._client = client
        self._config = config
        self._provider = provider or ContainerProvider(client, config.spec, config.attach_to)
        self._make_transport = transport or agent_transport
        self._lock = threading.Lock()
        self._container: OpenedContainer | None = None
        self._transport: CommandTransport | None = None
        #: The network in force (False: none, True: Docker's bridge, or the policy the proxy decides by),
        #: the proxy endpoint, the live connections and the log: the engine-neutral part (channel/egress.py).
        machine = engine_of(client).machine
        self._egress = SessionEgress(
            config.egress if config.egress is not None else config.spec.network,
            engine_hosts=(machine,) if machine else (),
        )
        self._user = config.user or NOBODY
        #: The engine refused to bind the direct path's directory (it does not see it): frames from then on.
        self._direct_unshared = False
        self._languages: tuple[Language, ...] | None = None
        self._oom_counter: OomCounter | None = None
        #: The agent reports OOM kills from inside (EXIT oom_kills): the host counter is not read then.
        self._ooms_from_inside = False
        self._closed = False
        # (container, user) pairs known to enter the default working directory (see _check_cwd).
        self._enterable: set[tuple[str, str]] = set()
        #: How many times the container (or its in-sandbox agent) was replaced by a fresh one.
        self.restarts = 0
        self._workspace_mode = config.workspace_transport if config.spec.workspace else None
        self._workspace: SyncedWorkspace | None = None
        #: The task profile's watch on the root layer's size (root_cap "watched"), while a container runs.
        self._root_watcher: RootWatcher | None = None
        #: Why the session refuses every further call (its root writes passed their cap), once they did.
        self._stopped: str | None = None
        #: Guards the hooks below (not the session's lock: a hook takes the pool's).
        self._hooks_lock = threading.Lock()
        #: The checkpoint the session is paused to, its agent (let go), the host files its processes held
        #: then (a restore needs each of them) and, on runc, their sizes (``pause()``).
        self._checkpoint_of: tuple[str, DetachedAgent, dict[str, HeldFile], dict[str, int]] | None = None
        #: The host pid of the container's first process (gVisor: its sandbox), while it runs.
        self._sandbox_pid: int | None = None
        #: Pauses the session to disk once idle (``idle_pause_seconds``), from its first start.
        self._idle: IdlePauser | None = None
        #: A fork with processes: the parent's agent, let go, of which this session's is the copy.
        self._adopting: DetachedAgent | None = None
        #: The proxy endpoint the adopted agent holds (a fork's or a snapshot's): served under this network.
        self._adopting_endpoint: KeptEndpoint | None = None
        #: Tracks a session this one forked (set by the backend that opened this one).
        self._adopt: Callable[[DockerSession], DockerSession] | None = None
        #: Called once when the first command ends or the session closes (the warm pool's deferred refill).
        self._after_first: list[Callable[[], None]] = []
        #: Where snapshots go, and who makes a session from one (set by the backend that opened this one).
        self.snapshot_store: SnapshotStore | None = None
        self._forker: Callable[[Snapshot], DockerSession] | None = None
        self._image_remover: Callable[[str], None] | None = None
        #: Told before each snapshot is taken (the backend starts a spare for this session's forks).
        self._before_snapshot: Callable[[DockerSession], None] | None = None
        #: The snapshot fork() took for this session: removed when it closes.
        self._own_snapshot: Snapshot | None = None
        self.origin: Snapshot | None = None
        """The snapshot this session started from (``backend.session(snapshot=...)``, ``fork()``), or None."""
        self.state_dirs: dict[str, str] = {}
        """The host directories of ``/tmp``, HOME and the extra tmpfs (path inside -> host path) when they
        are tmpfs volumes this process reads (``PoolConfig(forkable=True)``); empty otherwise."""
        self.mirror_dir: str | None = None
        """The host side of the mirrored workspace's volume when this process reads it (a forkable pool's
        members, like :attr:`state_dirs`): a fork copies the snapshot's workspace into it on the host
        (:meth:`fill_mirror_on_host`) instead of pushing it through the channel. None otherwise."""
        self.layers: MemberLayers | None = config.layers
        """A layered pool member's mount points (``PoolConfig(fork_by="layer")``), or None."""
        self.fork_method: Literal["copy", "overlay"] | None = None
        """How this session got its snapshot's files: copied, or layered over the snapshot (None: no fork)."""
        self.restore_notes: list[str] = []
        """What unpacking the snapshot's tmpfs archives complained of (files the sandbox refused), if any."""

    # -- lifecycle -----------------------------------------------------------------------------------
    @property
    def container_id(self) -> str:
        """The id of the session's container (started on demand)."""
        return self._opened().id

    @property
    def session_id(self) -> str:
        """The session's id: the ``io.adk-sandbox.session`` label of its containers (replacements too).

        Known before the container starts; :func:`adk_sandbox.executor.backends.docker.cleanup_session` (or
        ``adk-sandbox cleanup --session ID``) removes the session's containers from any process.
        """
        return self._provider.session_id

    @property
    def attached(self) -> bool:
        """True when this session uses an existing container it did not create (and will not remove)."""
        return self._provider.attached

    @property
    def channel(self) -> str:
        """How commands reach the container: ``"agent"``, the one command channel (its in-sandbox agent)."""
        transport = self._transport
        return transport.channel if transport is not None else "agent"

    @property
    def workspace_transport(self) -> str | None:
        """How the workspace reaches the container: ``"bind"`` or ``"mirror"`` (None: no workspace).

        With ``"auto"`` this is known once the container started (:meth:`start`).
        """
        return self._workspace.mode if self._workspace is not None else self._workspace_mode

    @property
    def workspace(self) -> str | None:
        """The host directory of the session's workspace (absolute, resolved), or None without one.

        For ``backend.session(copy_of=...)`` this is the copy the library made (see docs/DOCKER.md,
        "Warm pool"): read results from here before the session closes. For a session from a snapshot it is
        the session's own copy, while the sandbox sees it at :attr:`workspace_inside` (docs/snapshots.md).
        """
        return self._config.host_workspace or self._config.spec.workspace

    @property
    def workspace_inside(self) -> str | None:
        """Where the workspace is inside the sandbox (the same as :attr:`workspace` unless it is a fork)."""
        return self._config.spec.workspace

    def push_workspace(self) -> None:
        """Bring the host copy's changes into a mirrored workspace now (what the next command does first).

        Starts the session. Nothing to do for a bound workspace or none; the warm pool calls this after
        filling a member's empty workspace copy, so file operations see it too.
        """
        self._awake()
        workspace = self._workspace
        if workspace is not None:
            workspace.before_command()

    def fill_mirror_on_host(self, source: str, *, with_host: bool = False) -> list[str] | None:
        """Copy ``source`` into the sandbox's workspace copy on the host and tell the mirror it holds it.

        Instead of :meth:`push_workspace`, ``source`` is copied on the host into the mirror's volume
        (:attr:`mirror_dir`) by the snapshot's safe walk, then :meth:`MirrorWorkspace.adopt` marks both sides
        in sync; ``with_host`` fills the still-empty host workspace by the same walk. Returns the paths the
        next sync still brings, or None when this session cannot (no volume this process reaches, or one not
        empty; nothing was copied): copy and push then. Starts the session. Depth: docs/snapshots.md, "The
        workspace of a fork, on the host side too".
        """
        from adk_sandbox.executor.snapshots.copy import copy_workspace  # noqa: PLC0415 - see TYPE_CHECKING

        self._awake()
        volume, workspace, host = self.mirror_dir, self._workspace, self.workspace
        if volume is None or workspace is None or workspace.mirror is None or host is None:
            return None
        cap = workspace.mirror.cap_bytes
        for directory in (volume, host) if with_host else (volume,):
            with os.scandir(directory) as entries:
                if any(True for _ in entries):  # not a fresh copy: only a push knows what to remove
                    return None

        def fill(target: str) -> None:
            if with_host:  # the host copy first, the volume its twin: one read of each file for both
                copy_workspace(source, host, cap, "DockerBackend(mirror_size_mb=...)", twin=target)
            else:
                copy_workspace(source, target, cap, "DockerBackend(mirror_size_mb=...)")

        return workspace.adopt(fill, volume)

    @property
    def mirror(self) -> MirrorWorkspace | None:
        """The mirrored workspace (its :attr:`~MirrorWorkspace.refused` says what the last pull-back left)."""
        return self._workspace.mirror if self._workspace is not None else None

    def start(self) -> None:
        """Create (or attach to) the container and verify its hardening; idempotent."""
        with self._lock:
            if self._closed:
                raise SandboxFailedError("this Docker session is closed")
            if self._container is None:
                self._open_container()

    def _freeze(self, wait_seconds: float) -> None:
        """The engine's freezer (``docker pause``: the cgroup freezer on runc, the sentry's on gVisor)."""
        with self._quiesced(wait_seconds, "the session is paused"):
            container = self._opened().id
            try:
                self._client.api.pause(container)
            except (docker.errors.DockerException, OSError) as exc:
                raise SandboxFailedError(f"the session's container could not be paused: {exc}") from exc
            self._paused = True  # before the held calls go on: each resumes the session first

    def _thaw(self) -> None:
        container = self._container
        if container is None:
            return  # closed meanwhile: nothing is paused
        if self._on_disk:
            self._restore(container)
            return
        try:
            self._client.api.unpause(container.id)
        except (docker.errors.DockerException, OSError) as exc:
            raise SandboxFailedError(f"the session's container could not be resumed: {exc}") from exc

    # -- checkpoints (docs/pause.md; the engine's and the agent's part: _checkpoint.py) ----------------
    def _serve_keeper(self, transport: AgentTransport, container_id: str) -> None:
        """Start the session's agent as the keeper's child, or adopt the one restored with a fork."""
        adopted, self._adopting = self._adopting, None
        endpoint, self._adopting_endpoint = self._adopting_endpoint, None
        if adopted is None:
            bound = self._config.spec.bound_agent is not None
            transport.use_keeper(keeper_opener(self._client, container_id, lambda: self._user), bound=bound)
            return
        # Restored from another session's checkpoint: a copy of its agent serves this one, and the proxy
        # endpoint it still listens on goes through this session's network (docs/pause.md).
        carried = endpoint if endpoint is not None and endpoint.user == adopted.user else None
        listeners = self._egress.adopt(carried) if carried is not None else None
        adopt_agent(self._client, container_id, transport, adopted, listeners=listeners)
        if carried is not None:
            self._egress.served_again(transport, carried)

    def _keeper_transport(self) -> AgentTransport:
        transport = self._transport
        assert isinstance(transport, AgentTransport)  # noqa: S101 - checkpoints need the agent channel
        return transport

    def _checkpoint(self, wait_seconds: float) -> None:
        """The engine's checkpoint of a keeper container: the agent let go, the container stopped."""
        if not self._config.spec.checkpoints:
            super()._checkpoint(wait_seconds)
        with self._quiesced(wait_seconds, "the session is paused"):
            container = self._opened()
            transport = self._keeper_transport()
            held = held_host_files(self, container)  # asked of its agent before it is let go
            grace = min(wait_seconds, CONNECTION_GRACE_SECONDS)
            name, detached = checkpoint_agent(self._client, container.id, transport, stop=True, grace=grace)
            sizes = held_sizes(held) if self._config.spec.runtime != GVISOR_RUNTIME else {}
            self._checkpoint_of = name, detached, held, sizes
            self._on_disk = True
            self._paused = True

    def _restore(self, container: OpenedContainer) -> None:
        """Start the container from its checkpoint and serve the same agent over a new stream."""
        checkpoint = self._checkpoint_of
        assert checkpoint is not None  # noqa: S101 - set with _on_disk
        name, detached, held, sizes = checkpoint
        missing_held_files(held, sizes)
        transport = self._keeper_transport()
        try:
            self._sandbox_pid = restore_agent(self._client, container.id, transport, (name, detached))
        except SandboxFailedError as exc:  # the engine could not: nothing of the checkpoint can run again
            self._checkpoint_of = None
            self._discard_container(container.id)
            self._paused = self._on_disk = False  # nothing is paused any more: there is nothing
            raise SandboxFailedError(
                f"{exc}. Its processes are lost: the container and its checkpoint were removed, and the "
                "next call starts a fresh sandbox (the workspace is kept)"
            ) from exc
        self._checkpoint_of = None

    def _fork_with_processes(self, wait_seconds: float | None) -> DockerSession:
        """A new session restored from a checkpoint of this one, which runs on (docs/pause.md)."""
        adopt = self._adopt
        self._refuse_processes("fork(processes=True)", "fork()")
        if adopt is None:
            raise PolicyNotEnforceableError(
                "fork(processes=True) needs a session opened by a DockerBackend; fork() carries the files "
                "only"
            )
        self._wake()
        config = self._config
        with self._quiesced(30.0 if wait_seconds is None else wait_seconds, "a fork is taken"):
            container = self._opened()
            transport = self._keeper_transport()
            carried = self._egress.carried(transport)
            name, detached = checkpoint_agent(self._client, container.id, transport, stop=False)
            try:  # commands still held back: the copy is the workspace the checkpoint's processes saw
                config = self._fork_workspace()
            except BaseException:
                with contextlib.suppress(ExecutorError):
                    ContainerCheckpoints(self._client, container.id).delete(name)
                raise
        try:
            child = adopt(DockerSession(self._client, config))
            child._adopting, child._adopting_endpoint = detached, carried
            if child._egress.network != self._egress.network:  # the network in force now, not the config's
                child._egress.switch(self._egress.network, None, child._user)
            child._provider.starts_from = start_from_copy(self._client, container.id, name)
            try:
                child.start()
            except BaseException:
                child.close()
                raise
        finally:
            try:
                ContainerCheckpoints(self._client, container.id).delete(name)
            except ExecutorError as exc:  # it goes with the container
                log.warning("a fork's checkpoint was not deleted: %s", exc)
        return child

    def _fork_workspace(self) -> SessionConfig:
        """A fork's settings: a copy of the workspace of its own, bound where this session's is inside.

        Its owner and mode are the workspace's (the restored processes go on as that user); its ``.git``
        is mounted read-only as the parent's is (a restore needs the same mounts).
        """
        from adk_sandbox.executor.backends.docker._snapshot import host_copy  # noqa: PLC0415 - imports session

        spec, source = self._config.spec, self.workspace
        if spec.workspace is None or source is None:
            return self._config
        copy = host_copy(source, self._config.mirror_mb * MIB, owned_as_source=True)
        bound = replace(spec, workspace_source=copy, git_placeholder=None)  # the copy holds the placeholder
        return replace(self._config, spec=bound, host_workspace=copy, workspace_is_copy=True)

    def _refuse_processes(self, asked: str, instead: str) -> None:
        """Refuse what would carry this session's processes when its backend cannot (nothing is done)."""
        if not self._config.spec.checkpoints:
            raise PolicyNotEnforceableError(
                f"{asked} needs a session of a DockerBackend made with checkpoints=True (gVisor or runc); "
                f"{instead} carries the files only"
            )
        if not self._copies_processes():
            raise PolicyNotEnforceableError(
                f"{asked} would lose this session's root filesystem writes (the task profile's): runc's "
                "checkpoint (CRIU) keeps the processes and their tmpfs, not the container's layer, which a "
                f"copy does not have. pause() keeps them (the same container); runtime='runsc' copies them; "
                f"{instead} carries the files"
            )

    def _copies_processes(self) -> bool:
        """Whether a copy of this session can carry its processes (what ``capabilities()`` says too).

        runc's checkpoint does not carry the container's layer, which only the task profile writes.
        """
        spec = self._config.spec
        return spec.checkpoints and not (spec.task and spec.runtime != GVISOR_RUNTIME)

    def running_sandbox(self) -> tuple[str, int] | None:
        """The running container's id and its sandbox's pid on this host; None when there is none."""
        container, pid = self._container, self._sandbox_pid
        if container is None or pid is None or self._closed or self._on_disk:
            return None
        return container.id, pid

    def _opened(self) -> OpenedContainer:
        self.start()
        container = self._container
        if container is None:  # closed concurrently
            raise SandboxFailedError("this Docker session is closed")
        return container

    def _close_sandbox(self) -> None:
        """Bring a mirrored workspace's last changes back, then remove the container (unless attached).

        Idempotent.
        """
        with self._lock:
            already = self._closed
            try:
                if not already and self._transport is not None and self._workspace is not None:
                    self._workspace.closing()
            finally:  # whatever the last pull-back raised, the container (and a copy_of copy) goes
                self._closed = True
                layers = self.layers
                try:
                    if layers is not None:
                        layers.unfork()  # the fork's overlays first: nothing more lands in its uppers
                    self._discard_container()
                finally:
                    self._egress.close()  # the direct path's socket and directory too
                    if layers is not None:
                        layers.release()
                if self._workspace is not None:
                    self._workspace.close()
                copy = self.workspace
                if self._config.workspace_is_copy and copy is not None and not already:
                    # After the last pull-back; descriptor-based: a link pulled back is removed, not followed.
                    shutil.rmtree(copy, ignore_errors=True)
                    if os.path.lexists(copy):
                        log.warning("the workspace copy %s of a closed session could not be removed", copy)
                if not already:
                    self._drop_own_snapshot()
        with self._hooks_lock:  # outside the session's lock: a hook takes the pool's
            hooks, self._after_first = self._after_first, []
        for hook in hooks:
            hook()

    def _open_container(self) -> None:
        """Open a verified container with its workspace (``auto``: bind, else a mirror; lock held)."""
        if self._workspace_mode == "auto":
            workspace = self._config.spec.workspace
            assert workspace is not None  # noqa: S101 - "auto" is kept only with a workspace
            key = AUTO_CHOICES.key(engine_of(self._client).socket_path, workspace)
            if AUTO_CHOICES.get(key) == "mirror":
                self._workspace_mode = "mirror"  # this engine failed the identity check for it before
            else:
                try:
                    self._open_once("bind")
                except WorkspaceNotSharedError as exc:
                    log.info("the engine does not see %s (%s): mirroring it", workspace, exc)
                    AUTO_CHOICES.put(key, "mirror")
                    self._workspace_mode = "mirror"
                else:
                    AUTO_CHOICES.put(key, "bind")
                    self._workspace_mode = "bind"
                    return
        self._open_once(self._workspace_mode)

    def _direct_egress(self) -> str | None:
        """The direct path's socket directory for this session's containers, or None (lock held).

        Only for a session that starts under a policy, on a local engine (a remote engine's machine
        cannot see this one's directory: no mount at all), over the agent channel, in a container this
        session creates. Whether the sandbox can reach the socket is the agent's probe's to find out
        (runc: yes; gVisor without ``--host-uds``: no, and the connections travel as frames).
        """
        if self._config.direct_egress is False or self.attached or self._config.spec.checkpoints:
            return None  # a checkpoint's copies need the frames (gVisor cannot reach the socket anyway)
        if not isinstance(self._config.egress, NetworkPolicy) or not engine_of(self._client).local:
            return None
        if self._direct_unshared:
            return None
        return self._egress.enable_direct()

    def _mirror_spec(self) -> tuple[ContainerSpec, tuple[int, int]]:
        """The spec of a container holding a copy of the workspace, and the host workspace's owner."""
        spec = self._config.spec
        host = self.workspace
        assert host is not None  # noqa: S101 - only called with a workspace
        info = os.stat(host)
        named = self._config.user is not None and not is_numeric(self._config.user)
        if self._config.user and not named:
            user = uid_gid(self._config.user)
        else:  # the task profile's image user is known once the container runs: the copy is the owner's
            user = f"{info.st_uid}:{info.st_gid}"
        self._user = user
        uid, gid = (int(part) for part in user.split(":"))
        volume = MirrorVolume(self._config.mirror_mb, uid, gid, info.st_mode & 0o777)
        # No .git mounts: the copy's .git is the container's own, and pull-back never writes a .git.
        spec = replace(spec, mirror=volume, read_only_mounts=(), git_placeholder=None, state_owner=(uid, gid))
        return spec, (
            info.st_uid,
            info.st_gid,
        )

    def _open_once(self, mode: str | None) -> None:
        """Open a verified container, then its transport, then check it from inside (lock held)."""
        owner = None
        if mode == "mirror":
            spec, owner = self._mirror_spec()
            self._provider.use_spec(spec)
        direct = self._direct_egress()
        if direct is not None and self._provider.spec.direct_egress is None:
            self._provider.use_spec(replace(self._provider.spec, direct_egress=direct))
        container = self._provider.open()
        if direct is not None and self._provider.spec.direct_egress is None:
            self._direct_unshared = True  # the engine did not see the directory: never asked again
        try:
            self._check_image(container.inspect)
            if self._config.user is None and container.owner is not None and mode != "mirror":
                self._user = container.owner
            task = self._config.spec.task
            transport = self._make_transport(
                self._client, container.id, self._agent_restarted, setid_allowed=task
            )
            self._container, self._transport = container, transport
            if self._config.spec.checkpoints and isinstance(transport, AgentTransport):
                self._serve_keeper(transport, container.id)
            if task or (self._config.user and not is_numeric(self._config.user)):
                self._user = self._default_user(container)
            spec = self._config.spec
            verify_from_inside(
                transport,
                container.base_env,
                self._user,
                # A layered member's host side is not at its path: its mountinfo is checked instead (below).
                spec.workspace_source or spec.workspace if mode == "bind" and self.layers is None else None,
                no_capabilities=container.dialect is Dialect.PODMAN,  # its inspect cannot show it
                setid_allowed=task,
                inside=spec.workspace,
            )
            if self._egress.proxied:
                self._egress.serve(transport, self._user)
            if self._config.spec.host_tmpfs:
                mirrored = spec.workspace if mode == "mirror" else None
                self.state_dirs, self.mirror_dir = self._host_tmpfs_dirs(container, mirrored)
            if self.layers is not None:
                self.layers.check(container.inspect)
                self.state_dirs = self.layers.state_dirs
            self._start_workspace(mode, container, owner)
            # The host's cgroup counter exists only for a local engine: a remote container's pid is another
            # machine's (the agent's own count from inside is used there, and preferred everywhere).
            local = engine_of(self._client).local
            self._oom_counter = OomCounter.for_container(container.inspect) if local else None
            self._sandbox_pid = int(container.inspect.get("State", {}).get("Pid") or 0) or None
            idle = self._config.idle_pause_seconds
            if idle is not None and self._idle is None and local:
                self._idle = IdlePauser(self, idle, cgroup_cpu_reader)
            spec = self._config.spec
            if spec.task and spec.root_cap == "watched":
                watcher = RootWatcher(self._client, container.id, spec.root_size_mb, self._root_over)
                self._root_watcher = watcher
        except BaseException:
            with contextlib.suppress(ExecutorError):  # noted for the reaper; report why the start failed
                self._discard_container(container.id)
            raise

    def _start_workspace(
        self, mode: str | None, container: OpenedContainer, owner: tuple[int, int] | None
    ) -> None:
        """Give a fresh container its workspace: a mirror gets the host copy (again), a bind its sync."""
        workspace = self._config.spec.workspace
        if mode == "mirror" and workspace is not None and owner is not None:
            problems = mirror_mount_violations(container.inspect, workspace)
            if problems:
                raise PolicyNotEnforceableError("the workspace copy is not as asked: " + "; ".join(problems))
            if self.mirror is None:
                host = self.workspace or workspace
                mirror = MirrorWorkspace(host, self._config.mirror_mb, owner, inside=workspace)
                self._workspace = SyncedWorkspace(mirror, self._sync_channel)
            assert self._workspace is not None  # noqa: S101 - made just above
            self._workspace.started()  # a fresh container gets the host copy again
        elif mode == "bind":
            self._workspace = SyncedWorkspace(BindWorkspace(), self._sync_channel)

    def _host_tmpfs_dirs(
        self, container: OpenedContainer, mirrored: str | None
    ) -> tuple[dict[str, str], str | None]:
        """The checked host sides of the tmpfs volumes and of the mirror's at ``mirrored`` (None: none).

        Refused when this process lacks one.
        """
        try:
            mounts = read_mountinfo()
        except OSError:
            mounts = []
        sizes = tmpfs_sizes(self._config.spec)
        if mirrored is not None:
            sizes[mirrored] = self._config.mirror_mb  # the same kind of volume, checked the same way
        found, problems = host_tmpfs_dirs(container.inspect, sizes, mounts)
        for source in found.values():
            if not problems and not os.access(source, os.R_OK | os.W_OK | os.X_OK):
                problems.append(f"this process cannot read and write {source}")
        if problems:
            raise PolicyNotEnforceableError(
                "forkable sessions keep /tmp, HOME and the workspace copy in tmpfs volumes this process "
                "copies on the host, which needs a local engine whose volumes this process can reach (root "
                f"on the engine's machine): {'; '.join(problems)}. Nothing ran; use a pool without "
                "forkable=True"
            )
        volume = found.pop(mirrored) if mirrored is not None else None
        return found, volume

    @property
    def egress_mode(self) -> EgressMode | None:
        """How the proxy endpoint's connections reach this process (docs/network.md, "Speed").

        ``"unix"``: the direct path, a Unix socket bound read-only into the container, bytes copied in the
        kernel; ``"frames"``: over the agent channel (gVisor, a remote engine, an engine that does not
        share this machine's files); None while no proxy is served.
        """
        return self._egress.mode

    def set_network(self, network: bool | NetworkPolicy) -> None:
        """Change the sandbox's network while it runs (docs/network.md, "Changing it at run time").

        ``False``: every live proxied connection is closed and new ones get a 403 (rule ``network off``);
        a :class:`NetworkPolicy`: it replaces the policy, and the open connections it does not allow (or
        whose name it pins elsewhere) are closed; ``True`` (Docker's bridge) only keeps a bridge session
        as it is. A container's network mode is fixed when it is created, so a sandbox started with network
        none (False or a policy) cannot be given the bridge, nor a bridge session a policy or none: those
        are refused with :class:`PolicyNotEnforceableError`. The change holds for the rest of the session,
        a replacement container included. Starts the session (a policy needs its agent).
        """
        check_network_argument(network)
        bridge = self._config.spec.network
        if bridge or network is True:
            if network is True and bridge:
                return
            if bridge:
                raise PolicyNotEnforceableError(
                    "this session's container has Docker's bridge network (network=True), which cannot be "
                    "taken from a running container here; create the backend with network=False or a "
                    "NetworkPolicy to switch between them at run time"
                )
            raise PolicyNotEnforceableError(
                "a container started with network none cannot be given Docker's bridge network "
                "(network=True) while it runs; switch between False and a NetworkPolicy, or create the "
                "backend with network=True"
            )
        self._wake()
        with self._lock:
            if self._closed:
                raise SandboxFailedError("this Docker session is closed")
            if self._container is None:
                self._open_container()
            self._egress.switch(network, self._transport, self._user)

    def proxy_offered(self) -> bool:
        """Whether this session's agent serves the proxy endpoint a NetworkPolicy needs (HELLO ``"proxy"``).

        Asks it to listen (the listener then serves this session: while no policy is set, every request
        gets the 403 of a network that is off). False when its agent offers none. Starts the session.
        """
        self._awake()
        with self._lock:
            transport = self._transport
            if not isinstance(transport, AgentTransport):
                return False
            try:
                self._egress.serve(transport, self._user)
            except PolicyNotEnforceableError:
                return False
            return True

    @property
    def _interceptor(self) -> Interceptor | None:
        """The session's interceptor (header injection), once a policy with headers was in force."""
        return self._egress.interceptor

    def _sync_channel(self) -> SyncChannel | None:
        """Where a workspace sync step runs: the current container's transport, as the command user."""
        transport, container = self._transport, self._container
        if transport is None or container is None:
            return None
        return SyncChannel(transport, container.base_env, self._user)

    def ping(self, timeout: float = 1.0) -> bool:
        """True when the started container answers within ``timeout`` seconds; starts nothing.

        Its agent answers a PING (a transport without agents, a test's stand-in: the engine reports the
        container running).
        The warm pool (:mod:`.pool`) asks this before handing a member out.
        """
        transport, container = self._transport, self._container
        if self._closed or transport is None or container is None:
            return False
        if isinstance(transport, AgentTransport):
            return transport.ping(self._user, timeout)
        try:
            inspect = self._client.api.inspect_container(container.id)
        except (docker.errors.DockerException, OSError):  # requests' errors are OSErrors
            return False
        return bool(inspect.get("State", {}).get("Running"))

    def _agent_restarted(self, why: str) -> None:
        self.restarts += 1

    def _default_user(self, container: OpenedContainer) -> str:
        """Who commands run as when a request does not say, in numbers (lock held, the transport up).

        ``user=`` looked up, else the task profile's image ``USER`` (root when it has none).
        """
        user = self._config.user
        if user is None and self._config.spec.task:
            image = self._client.api.inspect_image(self._config.spec.image)  # type: ignore[no-untyped-call]
            user = str((image.get("Config") or {}).get("User") or "") or "0:0"
        if user is None:
            return self._user
        if is_numeric(user):
            return uid_gid(user)

        def run(request: ExecRequest, capture: OutputCapture) -> CommandOutcome:
            started = time.monotonic()
            return self._run(request, request.argv or (), container, capture, started=started, cancel=None)[0]

        return self._lookup_numeric(user, run)

    def command_user_ids(self) -> tuple[int, int] | None:
        """(uid, gid) commands run as by default, when known by number (None: a name, or not started)."""
        uid, _, gid = self._user.partition(":")
        if not (uid.isdigit() and gid.isdigit()):
            return None
        return int(uid), int(gid)

    def _lookup_user(self) -> str:
        # The task profile's image user may itself be a name: its tables are read as root.
        return "0:0" if self._config.spec.task else self._user

    def _root_over(self, reason: str) -> None:
        self._stopped = reason

    def _explained(self, exc: SandboxFailedError) -> ExecutorError:
        # A command cut short because the root writes passed their cap says so, not "the agent ended".
        return SandboxFailedError(self._stopped) if self._stopped is not None else exc

    def _discard_container(self, container_id: str | None = None) -> None:
        watcher, self._root_watcher = self._root_watcher, None
        if watcher is not None:
            watcher.stop()
        if self._closed and self._idle is not None:
            self._idle.stop()
        container, self._container = self._container, None
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()
        self._provider.remove(container_id or (container.id if container else None))

    def _replace_container(self, why: str) -> None:
        """Swap in a fresh container (the old one died or could not be cleaned); said in the log.

        Called with the lock held. A closed session refuses: a container opened now would be removed by
        nothing (a close from another thread may land while a command is running).
        """
        if self._closed:
            raise SandboxFailedError("this Docker session is closed")
        if self._stopped is not None:
            raise SandboxFailedError(self._stopped)
        old = self._container.id if self._container else None
        log.warning("sandbox container %s replaced by a fresh one: %s", old, why)
        if self.attached:
            raise SandboxFailedError(f"the attached container {self._config.attach_to!r} {why}")
        self._discard_container()
        self._open_container()
        self.restarts += 1

    # -- snapshots (docs/snapshots.md) -----------------------------------------------------------------
    def execute(
        self,
        request: ExecRequest,
        on_output: OutputCallback | None = None,
        *,
        cancel: threading.Event | None = None,
    ) -> ExecResult:
        """Run ``request`` (see the class docstring); held back while a snapshot of the session is taken."""
        try:
            return super().execute(request, on_output, cancel=cancel)
        finally:
            with self._hooks_lock:
                hooks, self._after_first = self._after_first, []
            for hook in hooks:
                hook()

    def _call_after_first_command(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` once: when the first command of this session ends, or when it closes.

        The warm pool starts a fork's refill with it, so the refill's create does not compete with the
        fork's first command (docs/snapshots.md). ``hook`` must not raise.
        """
        with self._hooks_lock:
            if not self._closed:
                self._after_first.append(hook)
                return
        hook()

    def _take_snapshot(
        self, options: SnapshotOptions, store: SnapshotStore | None, processes: bool
    ) -> Snapshot:
        """See :meth:`ChannelSession.snapshot`: the files (docs/snapshots.md).

        With ``processes=True`` the sandbox's checkpoint (a backend made with ``checkpoints=True``).
        """
        from adk_sandbox.executor.backends.docker._snapshot import take_snapshot  # noqa: PLC0415 - see TYPE_CHECKING
        from adk_sandbox.executor.snapshots.store import SnapshotStore  # noqa: PLC0415

        if self._closed:
            raise SandboxFailedError("this Docker session is closed")
        self._wake()
        store = store or self.snapshot_store or SnapshotStore()
        if processes:
            from adk_sandbox.executor.backends.docker._process_snapshot import take_with_processes  # noqa: PLC0415

            self._refuse_processes("snapshot(processes=True)", "snapshot()")
            return take_with_processes(self, options, store)
        if self._before_snapshot is not None:
            self._before_snapshot(self)  # a spare's start overlaps the copy
        return take_snapshot(self, options, store)

    def fork(
        self,
        *,
        processes: bool = False,
        ttl_seconds: int | None = None,
        max_mb: int | None = None,
        wait_seconds: float | None = None,
    ) -> DockerSession:
        """A new session holding this one's files (:meth:`snapshot`, then ``backend.session(snapshot=...)``).

        Its workspace is at this session's path inside, in a host directory of its own
        (:attr:`workspace`); nothing it does reaches this session. The snapshot taken for it is removed when
        the fork closes. For many forks of one state, take one snapshot and start each session from it.

        ``processes=True`` carries every process too: the new session is restored from a checkpoint of
        this one (which runs on), each program where it was with its memory (docs/pause.md), in a copy
        of the workspace of its own. A session of a backend made with ``checkpoints=True``;
        ``ttl_seconds`` and ``max_mb`` concern snapshots and are not taken then.
        """
        if processes:
            if ttl_seconds is not None or max_mb is not None:
                raise InvalidRequestError(
                    "fork(processes=True) takes no snapshot: ttl_seconds and max_mb do not apply"
                )
            return self._fork_with_processes(wait_seconds)
        forker = self._forker
        if forker is None:
            raise InvalidRequestError(
                "this session was not opened by a DockerBackend, which a fork needs; take a snapshot "
                "and give "
                "it to backend.session(snapshot=...)"
            )
        taken = self.snapshot(ttl_seconds=ttl_seconds, max_mb=max_mb, wait_seconds=wait_seconds)
        try:
            child = forker(taken)
        except BaseException:
            self._remove_snapshot(taken)
            raise
        child._own_snapshot = taken
        return child

    def _remove_snapshot(self, snapshot: Snapshot) -> None:
        from adk_sandbox.executor.snapshots.store import SnapshotStore  # noqa: PLC0415

        store = SnapshotStore(os.path.dirname(snapshot.path))
        try:
            store.remove(snapshot.id, self._image_remover)
        except ExecutorError as exc:  # left to a reaper: owned by this process, and it expires
            log.warning("the snapshot %s of a fork could not be removed: %s", snapshot.id, exc)

    def _drop_own_snapshot(self) -> None:
        """Remove the snapshot :meth:`fork` took for this session (its container is gone by now)."""
        own, self._own_snapshot = self._own_snapshot, None
        if own is not None:
            self._remove_snapshot(own)

    # -- what is enforced ----------------------------------------------------------------------------
    @property
    def deviations(self) -> tuple[str, ...]:
        """What the engine reported or did differently from Docker (Podman: docs/DOCKER.md); starts it."""
        return self._opened().deviations

    def isolation(self) -> IsolationClass:
        """The class of the running container (from ``docker inspect``; starts the session)."""
        return isolation_of(self._opened().inspect)

    @property
    def image_id(self) -> str:
        """The id of the image the session's container runs (``sha256:...``; starts the session)."""
        return str(self._opened().inspect.get("Image") or "")

    def _check_image(self, inspect: Mapping[str, Any]) -> None:
        """Before anything runs: the container's image is the expected one (docs/DOCKER.md, "Images ...")."""
        expected = self._config.expect_image
        if expected is None:
            return
        problem = image_mismatch(inspect, self._config.spec.image, expected)
        if problem is None:
            return
        if expected.pinned:
            raise PolicyNotEnforceableError(f"{problem}. Nothing ran.")
        warnings.warn(problem, ImageMismatchWarning, stacklevel=4)
        log.warning("%s", problem)

    def capabilities(self) -> Capabilities:
        """What the running container enforces, read from ``docker inspect`` (starts the session)."""
        container = self._opened()
        if self._languages is None:
            probe = self.execute(ExecRequest(language=Language.COMMAND, code=_PROBE_LANGUAGES, timeout=30))
            found = [_PROGRAM_LANGUAGES[word] for word in probe.stdout.split() if word in _PROGRAM_LANGUAGES]
            self._languages = (Language.COMMAND, *found)
        capabilities = capabilities_from_inspect(
            container.inspect,
            self._languages,
            container.confined_mounts,
            channel=self.channel,
            root_cap=self._config.spec.root_cap,
        )
        # What take_snapshot refuses: an attached container; what carries processes: _refuse_processes.
        snapshots: tuple[Literal["files", "processes", "memory"], ...] = () if self.attached else ("files",)
        if self._copies_processes():
            snapshots = ("files", "processes", "memory")
        return capabilities.model_copy(
            update={
                "workspace": self.workspace_transport,
                "network_policy": self._policy_in_force(),
                "snapshots": snapshots,
            }
        )

    def _policy_in_force(self) -> NetworkPolicy | None:
        network = self.network
        return network if isinstance(network, NetworkPolicy) else None

    # -- commands (the body is ChannelSession.execute) -------------------------------------------------
    def _refuse(self, request: ExecRequest) -> None:
        if self._stopped is not None:
            raise SandboxFailedError(self._stopped)
        container = self._opened()
        # The container's limit is the only one enforced (read from inspect: an attached container's
        # limit is whatever its compose file chose).
        limit = container.memory_limit_mb
        if request.memory_limit_mb is not None and (limit == 0 or request.memory_limit_mb < limit):
            raise PolicyNotEnforceableError(
                f"memory_limit_mb={request.memory_limit_mb} is below the session container's limit "
                f"({limit} MiB), which is the only one enforced; create the backend with "
                f"ResourceLimits(memory_mb={request.memory_limit_mb})"
                + (" or give the attached container that limit" if self.attached else "")
            )

    def _working_directory(self) -> tuple[str, str]:
        container = self._opened()
        return container.id, container.workdir

    def _run_command(
        self,
        request: ExecRequest,
        argv: tuple[str, ...],
        capture: OutputCapture,
        *,
        started: float,
        cancel: threading.Event | None,
    ) -> tuple[CommandOutcome, bool]:
        return self._run(request, argv, self._opened(), capture, started=started, cancel=cancel)

    def _prepare_command(self, request: ExecRequest, argv: tuple[str, ...]) -> PreparedCommand:
        return self._prepare(request, argv, self._opened())

    def _prepare(
        self, request: ExecRequest, argv: tuple[str, ...], container: OpenedContainer
    ) -> PreparedCommand:
        self._egress.ensure(self._transport, self._user)
        return PreparedCommand(
            argv=argv,
            env={
                **self._egress.env(),
                **build_child_env(container.base_env, self._config.policy_env, request.env),
            },
            user=self._command_user(request.user),
            workdir=request.cwd if request.cwd is not None else container.workdir,
            stdin=request.stdin_bytes,
            marker=uuid.uuid4().hex,
            background=request.background,
        )

    def _run(
        self,
        request: ExecRequest,
        argv: tuple[str, ...],
        container: OpenedContainer,
        capture: OutputCapture,
        *,
        started: float,
        cancel: threading.Event | None,
    ) -> tuple[CommandOutcome, bool]:
        command = self._prepare(request, argv, container)
        for attempt in (1, 2):
            transport = self._transport
            oom_counter = None if self._ooms_from_inside else self._oom_counter
            if transport is None:
                with self._lock:
                    self._replace_container("it was gone")
                continue
            ooms_before = oom_counter.read() if oom_counter else None
            try:
                outcome = transport.run(command, capture, deadline=started + request.timeout, cancel=cancel)
            except ContainerGoneError as exc:
                # Nothing of the command ran, so starting it in a fresh container is not a re-run.
                if attempt == 2:
                    raise
                with self._lock:
                    self._replace_container(f"could not run commands any more ({exc})")
                continue
            ooms_after = oom_counter.read() if oom_counter else None
            oom_killed = ooms_before is not None and ooms_after is not None and ooms_after > ooms_before
            if outcome.oom_kills is not None:  # counted inside the container: true on a remote engine too
                oom_killed = outcome.oom_kills > 0
                self._ooms_from_inside = True
            if outcome.kill_failed:
                with self._lock:
                    if not self._closed:  # closed meanwhile: the container is gone with the processes
                        self._replace_container("the command's processes could not be killed inside it")
            return outcome, oom_killed
        raise SandboxFailedError("the sandbox container could not be started")  # pragma: no cover
