"""DockerBackend: hardened per-session containers on a Docker engine (local; remote without a workspace)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import docker

from executor.backend import OutputCallback, SandboxBackend
from executor.backends.docker._daemon import connect
from executor.backends.docker._reaper import reap_leaked
from executor.backends.docker._spec import ContainerSpec, GitProtection, git_protection
from executor.backends.docker.engine import Engine, resolve_engine
from executor.backends.docker.images import BASE_IMAGE
from executor.backends.docker.session import TRANSPORTS, DockerSession, SessionConfig
from executor.errors import InvalidRequestError, PolicyNotEnforceableError
from executor.policy import SandboxPolicy
from executor.types import Capabilities, ExecRequest, ExecResult, ResourceLimits

__all__ = ["DockerBackend"]

DEFAULT_LIFETIME_SECONDS = 12 * 3600


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

    def __init__(  # noqa: PLR0917 - SPEC §4 gives these in this order
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
        engine: Engine | str | None = None,
    ) -> None:
        """Connect to the daemon and reap leaked containers.

        ``user`` ("uid:gid") overrides the default of running commands as the owner of the workspace
        root. ``policy`` adds bind mounts (its ``allowed_paths``, at the same path), environment and
        network permission; like bubblewrap, a container cannot forbid spawning processes, so a policy
        must say ``allow_process_spawn``. ``transport`` chooses how commands reach a session's container:
        ``"agent"`` (default: one long-lived in-sandbox agent per session, docs/DOCKER.md "The agent
        channel") or ``"exec"`` (one Docker exec per command). ``engine`` picks the Docker engine: an
        :class:`~executor.backends.docker.engine.Engine`, a URL (``unix://``, ``tcp://`` with TLS from
        ``DOCKER_TLS_VERIFY``/``DOCKER_CERT_PATH``, ``ssh://``) or a Docker context's name; by default the
        one the Docker CLI would use (``DOCKER_HOST``, ``DOCKER_CONTEXT``, the current context). A session
        with a workspace (or a policy's host paths) needs a local engine: a remote one is refused.
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
        self.engine = resolve_engine(engine)
        """The Docker engine this backend's sessions run on."""
        self._client = connect(engine=self.engine)
        self.reaped = reap_leaked(self._client)
        """Leaked containers this backend removed when it started."""
        self._lock = threading.Lock()
        self._sessions: set[DockerSession] = set()
        """Sessions opened and not yet closed (a closed session removes itself, see :meth:`_forget`)."""
        self._capabilities: Capabilities | None = None

    def session(self, workspace: str | os.PathLike[str] | None = None) -> DockerSession:
        """A new session, its container bound to ``workspace`` (mounted at the same absolute path)."""
        if not self.engine.local:
            self._refuse_host_paths(workspace)
        root: str | None = None
        if workspace is not None:
            root = str(Path(workspace).resolve(strict=False))
            if not os.path.isdir(root):
                raise InvalidRequestError(f"workspace {str(workspace)!r} is not a directory")
        for allowed in self.policy.allowed_paths:
            if not os.path.exists(allowed.path):
                raise InvalidRequestError(f"policy path {allowed.path!r} does not exist")
        protection = git_protection(root) if root and self.container is None else GitProtection()
        spec = ContainerSpec(
            image=self.image,
            limits=self.limits,
            runtime=self.runtime,
            network=self.network,
            workspace=root,
            extra_mounts=self.policy.allowed_paths,
            read_only_mounts=protection.read_only_mounts,
            git_placeholder=protection.placeholder,
            lifetime_seconds=self.lifetime_seconds,
        )
        config = SessionConfig(
            spec=spec,
            user=self.user,
            policy_env=self.policy.env,
            attach_to=self.container,
            transport=self.transport,
        )
        session = _TrackedSession(self._client, config, self._forget)
        with self._lock:
            self._sessions.add(session)
        return session

    def _refuse_host_paths(self, workspace: str | os.PathLike[str] | None) -> None:
        """A remote engine cannot bind this machine's paths: refuse rather than run against other files.

        A bind mount names a path on the engine's machine: there it is another directory or none, and a
        command would read and write files that are not the user's (or the engine would make an empty
        directory at that path). Until the workspace can travel to the engine, only sessions without host
        paths run there.
        """
        paths = ([str(workspace)] if workspace is not None else []) + [
            allowed.path for allowed in self.policy.allowed_paths
        ]
        if paths:
            raise PolicyNotEnforceableError(
                f"the Docker engine {self.engine.describe()} is not on this machine (only a unix:// socket "
                f"is), so it cannot mount {', '.join(repr(p) for p in paths)}: a bind mount there would "
                "show the engine machine's files at that path, not these. Nothing ran. Open the session "
                "without a workspace or policy paths (backend.session()), or use a local engine; copying "
                "a workspace to a remote engine is not available yet"
            )

    def _forget(self, session: DockerSession) -> None:
        """Called by a session when it closes: a long-lived backend holds only the open ones."""
        with self._lock:
            self._sessions.discard(session)

    def capabilities(self) -> Capabilities:
        """What a session container of this backend enforces, read from a real one (probed once)."""
        if self._capabilities is None:
            with self.session() as probe:
                self._capabilities = probe.capabilities()
        return self._capabilities

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
        """Close every session of this backend still open (their containers are removed)."""
        with self._lock:
            sessions, self._sessions = list(self._sessions), set()
        for session in sessions:
            session.close()
        self._client.close()


class _TrackedSession(DockerSession):
    """A session that tells its backend when it closes, so the backend stops holding it."""

    def __init__(
        self,
        client: docker.DockerClient,
        config: SessionConfig,
        on_close: Callable[[DockerSession], None],
    ) -> None:
        super().__init__(client, config)
        self._on_close = on_close

    def close(self) -> None:
        """Remove the container (unless attached) and leave the backend's list of open sessions."""
        try:
            super().close()
        finally:
            self._on_close(self)
