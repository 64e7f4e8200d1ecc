"""DockerBackend: hardened per-session containers on a Docker engine (local or remote)."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Literal

import docker

from executor.backend import OutputCallback, SandboxBackend
from executor.backends.docker._container import ContainerProvider, WorkspaceNotSharedError
from executor.backends.docker._daemon import connect
from executor.backends.docker._reaper import cleanup_session, reap_leaked
from executor.backends.docker._spec import (
    MAX_TMPFS_MB,
    ContainerSpec,
    GitProtection,
    git_protection,
    tmpfs_overlap,
    validate_labels,
    validate_tmpfs,
)
from executor.backends.docker._workspace import AUTO_CHOICES, DEFAULT_MIRROR_MB, WORKSPACE_TRANSPORTS
from executor.backends.docker.engine import Engine, resolve_engine
from executor.backends.docker.images import BASE_IMAGE, ExpectedImage, local_image_id
from executor.backends.docker.pool import PoolConfig, SessionPool
from executor.backends.docker.session import TRANSPORTS, DockerSession, SessionConfig
from executor.errors import InvalidRequestError, PolicyNotEnforceableError
from executor.policy import SandboxPolicy
from executor.types import Capabilities, ExecRequest, ExecResult, ResourceLimits

__all__ = ["DockerBackend"]

DEFAULT_LIFETIME_SECONDS = 12 * 3600
_IMAGE_ID = re.compile(r"(sha256:)?[0-9a-f]{64}")


def _pinned_image(image_id: str | None) -> ExpectedImage | None:
    """``DockerBackend(image_id=...)`` checked: a mismatch with it is refused."""
    if image_id is None:
        return None
    if not _IMAGE_ID.fullmatch(image_id):
        raise InvalidRequestError(
            "image_id must be an image id, 64 hex digits after an optional sha256: (`docker image inspect "
            f"-f '{{{{.Id}}}}' IMAGE` prints it), not {image_id!r}"
        )
    return ExpectedImage(image_id if image_id.startswith("sha256:") else f"sha256:{image_id}", pinned=True)


def _expected_on_remote(engine: Engine, image: str) -> ExpectedImage | None:
    """On a remote engine, the id ``image`` has on this machine's engine (a mismatch warns); else None."""
    if engine.local:
        return None
    local_id = local_image_id(image)
    return ExpectedImage(local_id, pinned=False) if local_id is not None else None


class DockerBackend(SandboxBackend):
    """Creates :class:`DockerSession` s: one hardened container per session (SPEC §4).

    >>> backend = DockerBackend()                                  # doctest: +SKIP
    >>> with backend.session(workspace="/path/to/repo") as session:  # doctest: +SKIP
    ...     session.execute(ExecRequest(language="command", code="pwd", timeout=10)).stdout

    Containers run with network ``none``, all capabilities dropped, no-new-privileges, Docker's default
    seccomp profile, a read-only root filesystem, size-limited tmpfs ``/tmp`` and HOME, an init process,
    memory (= memory+swap), cpu, pids and ulimit limits, no logs, and labels naming the owning process and
    an expiry. ``container="name"`` attaches to an existing container (e.g. a compose service) instead;
    its hardening is verified the same way and it is never removed by this library.

    Creating a backend connects to the daemon (:class:`BackendUnavailableError` with how to start one
    when none answers) and removes this project's containers whose owner process died or whose expiry
    passed.
    """

    name = "docker"

    def __init__(  # noqa: PLR0917, PLR0915 - SPEC §4 gives these in this order; a check for each
        self,
        image: str = BASE_IMAGE,
        limits: ResourceLimits | None = None,
        runtime: str | None = None,
        network: bool = False,
        user: str | None = None,
        container: str | None = None,
        *,
        policy: SandboxPolicy | None = None,
        lifetime_seconds: int = DEFAULT_LIFETIME_SECONDS,
        transport: str = "agent",
        tmpfs: Mapping[str, int] | None = None,
        labels: Mapping[str, str] | None = None,
        engine: Engine | str | None = None,
        workspace_transport: str = "auto",
        mirror_size_mb: int = DEFAULT_MIRROR_MB,
        image_id: str | None = None,
        pool: int | PoolConfig | None = None,
    ) -> None:
        """Connect to the daemon and reap leaked containers.

        ``user`` ("uid:gid") overrides the default of running commands as the owner of the workspace
        root. ``policy`` adds bind mounts (its ``allowed_paths``, at the same path), environment and
        network permission; like bubblewrap, a container cannot forbid spawning processes, so a policy
        must say ``allow_process_spawn``. ``transport`` chooses how commands reach a session's container:
        ``"agent"`` (default: one long-lived in-sandbox agent per session, docs/DOCKER.md "The agent
        channel") or ``"exec"`` (one Docker exec per command). ``tmpfs`` adds writable tmpfs mounts
        (absolute path -> size in MiB, e.g. ``{"/var/tmp": 64}``), mounted ``exec,nosuid,nodev`` like
        ``/tmp`` (docs/DOCKER.md, "Extra tmpfs mounts"); not with ``container=``. ``labels`` are added to
        every container this backend creates (keys in this project's ``io.adk-sandbox.`` namespace are
        refused: the reaper relies on them). ``engine`` picks the Docker engine: an
        :class:`~executor.backends.docker.engine.Engine`, a URL (``unix://``, ``tcp://`` with TLS from
        ``DOCKER_TLS_VERIFY``/``DOCKER_CERT_PATH``, ``ssh://``) or a Docker context's name; by default the
        one the Docker CLI would use (``DOCKER_HOST``, ``DOCKER_CONTEXT``, the current context).
        ``workspace_transport`` says how a session's workspace reaches the container (docs/DOCKER.md,
        "Workspace transport"): ``"bind"`` mounts the host directory (a local engine that sees this
        machine's files; checked at start), ``"mirror"`` copies it into a tmpfs volume of
        ``mirror_size_mb`` MiB at the same path and syncs it before and after each command, ``"auto"``
        (default) binds when the engine sees the directory, else mirrors. A policy's host paths are bound,
        so they need a local engine: a remote one refuses them. ``image_id`` (``sha256:<64 hex>``) pins
        the image: a container running another one is refused before anything runs in it. Without it, on
        a remote engine, the id ``image`` has on this machine's engine (when it has one) is expected, and
        a container running another id only warns (:class:`~.images.ImageMismatchWarning`); see
        docs/DOCKER.md, "Images on a remote engine".
        ``pool`` keeps that many containers (or as a :class:`~executor.backends.docker.pool.PoolConfig`
        says) started for workspace-less sessions, each used once (docs/DOCKER.md, "Warm pool").
        """
        if transport not in TRANSPORTS:
            raise InvalidRequestError(f"transport must be one of {', '.join(TRANSPORTS)}, not {transport!r}")
        if policy is not None and not policy.allow_process_spawn:
            raise PolicyNotEnforceableError(
                "a container cannot forbid spawning processes; use a policy built with "
                ".allow_process_spawn() (the pids limit bounds how many may run)"
            )
        if lifetime_seconds <= 0:
            raise InvalidRequestError("lifetime_seconds must be positive")
        if workspace_transport not in WORKSPACE_TRANSPORTS:
            raise InvalidRequestError(
                f"workspace_transport must be one of {', '.join(WORKSPACE_TRANSPORTS)}, "
                f"not {workspace_transport!r}"
            )
        if (
            isinstance(mirror_size_mb, bool)
            or not isinstance(mirror_size_mb, int)
            or not 1 <= mirror_size_mb <= MAX_TMPFS_MB
        ):
            raise InvalidRequestError(f"mirror_size_mb must be an integer from 1 to {MAX_TMPFS_MB} (MiB)")
        if workspace_transport == "mirror" and container is not None:
            raise InvalidRequestError(
                "workspace_transport='mirror' makes a container with a copy of the workspace; an attached "
                "container mounts the workspace itself (use 'bind' or 'auto')"
            )
        pinned = _pinned_image(image_id)
        extra_tmpfs = validate_tmpfs(tmpfs or {})
        if extra_tmpfs and container is not None:
            raise InvalidRequestError(
                "tmpfs= applies to containers this backend creates; an attached container has the "
                "mounts its compose file gives it (add them there)"
            )
        user_labels = validate_labels(labels or {})
        if user_labels and container is not None:
            raise InvalidRequestError(
                "labels= applies to containers this backend creates; an attached container keeps its own"
            )
        overlap = tmpfs_overlap(
            extra_tmpfs, [allowed.path for allowed in (policy or SandboxPolicy()).allowed_paths]
        )
        if overlap:
            raise InvalidRequestError(overlap)
        self.image = image
        self.limits = limits or ResourceLimits()
        self.runtime = runtime
        self.network = network or bool(policy and policy.allow_network)
        self.user = user
        self.container = container
        self.policy = policy or SandboxPolicy()
        self.lifetime_seconds = lifetime_seconds
        self.transport = transport
        """The command channel of this backend's sessions (``"agent"`` or ``"exec"``)."""
        self.labels = user_labels
        """The user labels of this backend's containers, validated."""
        self.tmpfs = extra_tmpfs
        """The extra tmpfs mounts of this backend's containers (path -> MiB), validated."""
        self.engine = resolve_engine(engine)
        """The Docker engine this backend's sessions run on."""
        self.workspace_transport = workspace_transport
        """How sessions' workspaces reach their containers, as asked: ``"auto"``, ``"bind"``, ``"mirror"``."""
        self.mirror_size_mb = mirror_size_mb
        """Size cap of a mirrored workspace's volume, in MiB."""
        pool_settings = self._check_pool(pool)
        self._client = connect(engine=self.engine)
        self.expect_image = pinned or _expected_on_remote(self.engine, image)
        """The image id sessions' containers must run (pinned) or are expected to (read from this machine)."""
        self.reaped = reap_leaked(self._client)
        """Leaked containers this backend removed when it started."""
        self._lock = threading.Lock()
        self._sessions: set[DockerSession] = set()
        """Sessions opened and not yet closed (a closed session removes itself, see :meth:`_forget`)."""
        self._capabilities: Capabilities | None = None
        self.pool: SessionPool | None = None
        """The warm pool of workspace-less sessions (``pool=``), or None."""
        if pool_settings is not None:
            self.pool = SessionPool(
                self._client,
                self._session_config(None),
                pool_settings,
                self._pool_member,
                engine=self.engine.describe(),
            )

    def _pool_member(self, config: SessionConfig, provider: ContainerProvider) -> DockerSession:
        return _TrackedSession(self._client, config, self._forget, provider=provider)

    def _check_pool(self, pool: int | PoolConfig | None) -> PoolConfig | None:
        """The pool's settings, refused when they cannot work with this backend's."""
        if pool is None:
            return None
        settings = PoolConfig(size=pool) if isinstance(pool, int) else pool
        if self.container is not None:
            raise InvalidRequestError(
                "pool= keeps containers this backend creates; an attached container (container=) is one "
                "shared container, not a pool"
            )
        if settings.max_age_seconds >= self.lifetime_seconds:
            raise InvalidRequestError(
                f"PoolConfig.max_age_seconds ({settings.max_age_seconds:g}) must be below lifetime_seconds "
                f"({self.lifetime_seconds}): a member's expiry runs from its create"
            )
        return settings

    def session(self, workspace: str | os.PathLike[str] | None = None) -> DockerSession:
        """A new session, its container bound to ``workspace`` (mounted at the same absolute path).

        Without a workspace, and with ``pool=``, an already started container from the warm pool.
        """
        if workspace is None and self.pool is not None:
            # A bind-mounted workspace cannot come from the pool: the mount is fixed at create.
            # TODO(mirror): a mirrored workspace can: acquire here, then push the workspace into the
            # member (and give PoolKey.workspace "mirror").
            session = self.pool.acquire()
            with self._lock:
                self._sessions.add(session)
            return session
        return self._open_session(self._session_config(workspace))

    def _session_config(self, workspace: str | os.PathLike[str] | None) -> SessionConfig:
        """The checked settings of a session of this backend bound to ``workspace`` (or none)."""
        mode = self.workspace_transport
        if self.container is not None:
            mode = "bind"  # an attached container mounts the workspace itself
        elif mode == "auto" and not self.engine.local:
            mode = "mirror"  # a remote engine never sees this machine's files
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
            lifetime_seconds=self.lifetime_seconds,
        )
        return SessionConfig(
            spec=spec,
            user=self.user,
            policy_env=self.policy.env,
            attach_to=self.container,
            transport=self.transport,
            workspace_transport=mode,
            mirror_mb=self.mirror_size_mb,
            expect_image=self.expect_image,
        )

    def _open_session(self, config: SessionConfig) -> DockerSession:
        session = _TrackedSession(self._client, config, self._forget)
        with self._lock:
            self._sessions.add(session)
        return session

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

    def _forget(self, session: DockerSession) -> None:
        """Called by a session when it closes: a long-lived backend holds only the open ones."""
        with self._lock:
            self._sessions.discard(session)

    def cleanup(self, session_id: str) -> list[str]:
        """Remove the containers of the session ``session_id`` (from any process); return their ids.

        See :func:`executor.backends.docker.cleanup_session`. A session of this backend that is still open
        gets a fresh container on its next command.
        """
        return cleanup_session(session_id, self._client)

    def capabilities(self, workspace: str | os.PathLike[str] | None = None) -> Capabilities:
        """What a session container of this backend enforces, read from a real one (probed once).

        ``workspace`` says how a workspace would reach it: ``"bind"`` or ``"mirror"`` where the backend's
        settings decide (``workspace_transport`` forced, a remote engine, an attached container), and
        ``"auto"`` where ``"auto"`` decides per workspace at each session's start (a local engine). Given
        ``workspace=``, the answer is for that directory: what ``"auto"`` found for it before on this
        engine (:class:`~._workspace.AutoChoices`), else what a session of it finds (one is started).
        """
        if self._capabilities is None:
            with self.session() as probe:
                self._capabilities = probe.capabilities()
        mode = self._workspace_mode_for(workspace)
        return self._capabilities.model_copy(update={"workspace": mode})

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

    def execute(
        self,
        request: ExecRequest,
        on_output: OutputCallback | None = None,
        *,
        cancel: threading.Event | None = None,
    ) -> ExecResult:
        """Run ``request`` in a throw-away session (a fresh container, removed afterwards)."""
        with self.session() as session:
            return session.execute(request, on_output, cancel=cancel)

    def close(self) -> None:
        """Close every session of this backend still open (their containers are removed), drain the pool."""
        with self._lock:
            sessions, self._sessions = list(self._sessions), set()
        for session in sessions:
            session.close()  # a pooled session's removal is queued in the pool, which the next line waits for
        if self.pool is not None:
            self.pool.close()
        self._client.close()


class _TrackedSession(DockerSession):
    """A session that tells its backend when it closes, so the backend stops holding it."""

    def __init__(
        self,
        client: docker.DockerClient,
        config: SessionConfig,
        on_close: Callable[[DockerSession], None],
        provider: ContainerProvider | None = None,
    ) -> None:
        super().__init__(client, config, provider=provider)
        self._on_close = on_close

    def close(self) -> None:
        """Remove the container (unless attached) and leave the backend's list of open sessions."""
        try:
            super().close()
        finally:
            self._on_close(self)
