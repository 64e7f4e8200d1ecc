"""An inspect_ai sandbox provider: ``sandbox="adk-sandbox"`` runs a sample's tools in a session of its own.

Importing this module registers :class:`AdkSandboxEnvironment` with inspect (``@sandboxenv``; the
``inspect_ai`` plugin entry point imports it), configured by :class:`AdkSandboxConfig` (or a compose
file, :mod:`.inspect_compose`). Errors are those inspect's ``SandboxEnvironment`` contract names.
See docs/INTEGRATIONS.md, section "inspect_ai".
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import posixpath
import shlex
import stat
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol, TypeVar, Union, cast, overload, runtime_checkable

import docker
import docker.errors
import yaml  # type: ignore[import-untyped]  # a dependency of inspect_ai; no stubs installed
from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    sandboxenv,
)

# inspect_ai (0.3.285, and a later main) exports no public name for its tool launcher's path: the
# private constant is the one place it is defined, and matching it exactly is the point (see below).
from inspect_ai.util._sandbox._cli import SANDBOX_CLI
from inspect_ai.util._sandbox.environment import SandboxUnavailableError
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from adk_sandbox.devtools.adapters.inspect_compose import (
    compose_services,
    dockerfile_fields,
    is_compose,
    is_dockerfile,
)
from adk_sandbox.executor._bridge import run_blocking
from adk_sandbox.executor._users import resolve_user
from adk_sandbox.executor.attach import AttachServer
from adk_sandbox.executor.backend import SandboxSession, SessionBackend
from adk_sandbox.executor.backends.docker import DockerBackend, cleanup_labelled, cleanup_session
from adk_sandbox.executor.backends.docker.images import BASE_IMAGE
from adk_sandbox.executor.backends.factory import BackendConfig, make_backend, parse_config
from adk_sandbox.executor.channel.agent_transport import AgentTransport
from adk_sandbox.executor.channel.services import LinkedService, ServiceLinks, service_addresses
from adk_sandbox.executor.channel.session import ChannelSession
from adk_sandbox.executor.errors import BackendUnavailableError, InvalidRequestError, SandboxFailedError
from adk_sandbox.executor.network.policy import NetworkPolicy
from adk_sandbox.executor.snapshots import Snapshot, SnapshotStore
from adk_sandbox.executor.types import ExecRequest, ResourceLimits, check_user, is_numeric_user, parse_user
from adk_sandbox.executor.types import ExecResult as CoreExecResult

__all__ = [
    "PROVIDER_LABEL",
    "TASK_LABEL",
    "WORKING_DIR",
    "AdkSandboxConfig",
    "AdkSandboxEnvironment",
    "AdkSandboxService",
    "AdkSandboxServices",
    "ImageBuild",
    "build_image",
    "resolve_config",
    "resolve_sample",
]

T = TypeVar("T")
log = logging.getLogger(__name__)

#: Every container of this provider carries ``PROVIDER_LABEL=adk-sandbox``: ``cli_cleanup`` selects by it.
PROVIDER_LABEL = "ai.inspect.sandbox"
#: The name of the inspect task a container belongs to.
TASK_LABEL = "ai.inspect.task"
#: The hardened sample's working directory: relative paths of ``exec(cwd=...)`` and the file operations
#: start here (a task sample starts at its image's ``WORKDIR``, or ``working_dir``).
WORKING_DIR = "/tmp"
#: Who a hardened sample's commands run as by default.
NOBODY = "65534:65534"
#: The longest command inspect may ask for; ``timeout=None`` means this (ExecRequest needs a bound).
MAX_TIMEOUT_SECONDS = 24 * 3600
#: What ``exec`` returns as the exit status of a command killed by a signal the core does not name.
_KILLED_STATUS = 128 + 9


def _starts_tool_server(cmd: list[str]) -> bool:
    """``cmd`` is inspect's start of its in-sandbox tool server, exactly as inspect issues it."""
    return cmd == [SANDBOX_CLI, "start-server"]


def _valid_user(value: str) -> str:
    return check_user(value)


class ImageBuild(BaseModel):
    """A local image build (a compose file's ``build``), done on the engine when the task starts."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    context: str
    """The build context: an absolute directory on this machine."""
    dockerfile: str | None = None
    """The Dockerfile, relative to the context (default ``Dockerfile``)."""
    args: dict[str, str] = Field(default_factory=dict)
    """Build arguments."""
    network: str | None = None
    """The network ``RUN`` steps get (``host`` to reach a package mirror; default: the engine's)."""


class AdkSandboxConfig(BaseModel):
    """The ``adk-sandbox`` provider's configuration (every field optional).

    Given as the model, a YAML or JSON file of its fields, or a single-service compose file written for
    inspect's docker provider (:mod:`.inspect_compose`).

    Example ``adk-sandbox.yaml``::

        image: my-task-image
        runtime: runsc
        limits: {memory_mb: 1024, pids: 256}

    ``backend`` chooses the engine: ``docker`` (the default, gVisor with ``runtime: runsc``), ``microvm``
    or ``kubernetes``, or a mapping of that backend's own config (``{type: kubernetes, namespace: evals,
    context: my-cluster}``, docs/INTEGRATIONS.md). ``image``, ``limits``, ``network`` and ``user`` apply to
    every backend; the other sandbox fields are Docker's and are refused elsewhere unless left at their
    defaults.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: Literal["docker", "kubernetes", "microvm"] | dict[str, Any] = "docker"
    """The backend each sample's sandbox runs on: its name, or a mapping of its config with ``type``."""

    image: str = BASE_IMAGE
    """The container image (built locally: ``adk-sandbox images build``, or ``build``; never pulled)."""
    build: ImageBuild | None = None
    """Build ``image`` from a local Dockerfile when the task starts (the engine's cache makes a repeat
    cheap)."""
    profile: Literal["task", "hardened"] = "task"
    """``task`` (the default): the task image as it is -- its ``USER`` (root when it has none), its
    ``WORKDIR``, a writable root filesystem capped at ``root_size_mb``, the capabilities package managers
    and ``adduser`` need, inside the boundary of docs/docker/profiles.md. ``hardened``: a read-only root,
    no capabilities, nobody by default."""
    root_size_mb: Annotated[int, Field(gt=0)] | None = None
    """The cap on a task sandbox's root writes, in MiB (default 4096; under gVisor: the memory limit)."""
    runtime: Literal["runc", "runsc"] = "runc"
    """The OCI runtime: ``runc`` (a plain container) or ``runsc`` (gVisor's user-space kernel)."""
    limits: ResourceLimits = Field(default_factory=ResourceLimits)
    """Memory, cpu, pids, tmpfs size, file size and open files of each sample's container."""
    network: bool | NetworkPolicy = False
    """Off by default: the container has network ``none``. True gives it Docker's default bridge (the
    host's network reach); gVisor here is registered with ``--network=none`` and refuses it. A
    :class:`~adk_sandbox.executor.network.NetworkPolicy`, in YAML a mapping of its fields
    (``network: {allow: [pypi.org, "*.pythonhosted.org"], hosts: {...}}``), keeps network ``none`` and
    lets commands reach the names it allows through an HTTP proxy inside the sandbox, decided on the host
    (docs/network.md); on runc and gVisor alike."""
    user: Annotated[str, AfterValidator(_valid_user)] | None = None
    """Who commands and file operations run as unless ``exec(user=...)`` says otherwise: ``uid[:gid]`` or
    names from the container's ``/etc/passwd`` and ``/etc/group``. Default: the image's ``USER`` (root
    when it has none) in the task profile, nobody (``65534:65534``) in the hardened one."""
    working_dir: str | None = None
    """Where commands start and relative file paths lead (absolute). Default: the image's ``WORKDIR`` in
    the task profile, ``/tmp`` (a tmpfs) in the hardened one."""
    tmpfs: dict[str, int] = Field(default_factory=lambda: {"/var/tmp": 64})
    """Extra writable tmpfs mounts, path -> MiB, besides ``/tmp`` and HOME. inspect copies its tool
    helpers (``text_editor()``, ``bash_session()``, ``exec_remote()``) into ``/var/tmp`` and runs them."""
    env: dict[str, str] = Field(default_factory=dict)
    """Variables every command gets (after the image's own; ``exec(env=...)`` overrides them)."""
    extra_hosts: dict[str, str] = Field(default_factory=dict)
    """Names in the container's ``/etc/hosts``, name -> an address in ``127.0.0.0/8`` (set for the
    services of a compose file: how siblings resolve each other, docs/network.md "Several services")."""

    @field_validator("network", mode="before")
    @classmethod
    def _network_kind(cls, value: object) -> object:
        # A bool or a policy (a mapping of its fields): not pydantic's lax bool ("yes", 1, "off").
        if isinstance(value, bool | NetworkPolicy | dict):
            return value
        raise ValueError(
            f"network must be false, true or a NetworkPolicy mapping ({{allow: [...], hosts: {{...}}}}), "
            f"not {value!r}"
        )

    @field_validator("working_dir")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not posixpath.isabs(value):
            raise ValueError(f"working_dir must be an absolute path, not {value!r}")
        return value

    @model_validator(mode="after")
    def _backend_settings(self) -> AdkSandboxConfig:
        self.backend_config()  # a setting the backend cannot honour is refused now, not at the first sample
        return self

    @property
    def backend_type(self) -> str:
        """``docker``, ``kubernetes`` or ``microvm``."""
        return self.backend if isinstance(self.backend, str) else str(self.backend.get("type"))

    def backend_config(self) -> BackendConfig | None:
        """The config of a backend other than Docker (None: Docker, made from these fields as ever)."""
        kind = self.backend_type
        if kind == "docker":
            if isinstance(self.backend, dict) and len(self.backend) > 1:
                raise ValueError(
                    "Docker's settings are this config's own fields, not backend: {type: docker, ...}"
                )
            return None
        if kind not in ("kubernetes", "microvm"):
            raise ValueError(f"backend type {kind!r} is not one of docker, kubernetes, microvm")
        fields = type(self).model_fields
        docker_only = ("profile", "root_size_mb", "runtime", "tmpfs", "extra_hosts", "build")
        refused = [
            name
            for name in docker_only
            if getattr(self, name) != fields[name].get_default(call_default_factory=True)
        ]
        if kind == "microvm" and refused == ["build"]:
            refused = []  # a microVM's root disk is made from the built image
        if refused:
            raise ValueError(f"{', '.join(refused)}: Docker settings, which the {kind} backend has not")
        settings: dict[str, Any] = dict(self.backend) if isinstance(self.backend, dict) else {"type": kind}
        shared = {"image": self.image, "limits": self.limits, "network": self.network, "user": self.user}
        for name, value in shared.items():
            if value != fields[name].get_default(call_default_factory=True):
                if name in settings:
                    raise ValueError(f"{name} is given twice: here and in backend")
                settings[name] = value
        try:
            return parse_config(settings)
        except InvalidRequestError as exc:
            raise ValueError(str(exc)) from None

    def command_user(self) -> str | None:
        """Who commands run as by default: the configured user; None: the profile's default."""
        if self.user is None and self.profile == "hardened":
            return NOBODY
        return self.user

    def __hash__(self) -> int:
        # inspect keys its sandbox caches by the config; the dict fields break pydantic's own hash.
        return hash(self.model_dump_json())


#: How long the start of a sample waits for a service to accept on each port it exposes.
SERVICE_READY_SECONDS = 30.0
#: Starts a service's program in the background (its own session; output discarded), then returns.
_SERVICE_START = 'nohup "$@" </dev/null >/dev/null 2>&1 &'


class AdkSandboxService(BaseModel):
    """One service of a sample of several (a compose file's service): its sandbox and its links."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    config: AdkSandboxConfig
    command: tuple[str, ...] | None = None
    """Its program, started in the background when the sample starts (None: see ``image_program``)."""
    image_program: bool = False
    """Without ``command``: whether its image's ENTRYPOINT and CMD are run instead (:func:`image_program`; a
    service other than the default, as compose would; the default service's first process is the keeper)."""
    ports: tuple[int, ...] = ()
    """The ports its siblings reach it on, by its name."""
    depends_on: tuple[str, ...] = ()


class AdkSandboxServices(BaseModel):
    """A sample of several services: the default one first, then in start-up order (``depends_on``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    services: dict[str, AdkSandboxService]

    def __hash__(self) -> int:
        return hash(self.model_dump_json())


@runtime_checkable
class _Forkable(Protocol):
    """A session that snapshots and forks (Docker's, a microVM's)."""

    def capabilities(self) -> Any: ...
    def snapshot(
        self, name: str | None = None, *, labels: Mapping[str, str] | None = None, processes: bool = False
    ) -> Snapshot: ...
    def fork(self, *, processes: bool = False) -> Any: ...


@sandboxenv(name="adk-sandbox")
class AdkSandboxEnvironment(SandboxEnvironment):
    """One sample's sandbox: a hardened container of a :class:`DockerBackend`.

    Made by :meth:`sample_init` (one per sample), removed by :meth:`sample_cleanup`. The backends (one per
    task and configuration, labelled with the task's name) are closed by :meth:`task_cleanup`.
    """

    # Typed as any session-opening backend: only _backend() knows it makes a DockerBackend; the rest of the
    # provider speaks the session interface (execute, files, close).
    _backends: dict[tuple[str, str], SessionBackend[Any]] = {}  # noqa: RUF012 - shared by the class on purpose
    _backends_lock = threading.Lock()

    def __init__(
        self,
        session: SandboxSession,
        config: AdkSandboxConfig,
        start: _SampleStart,
        links: tuple[ServiceLinks, str] | None = None,
        backend: SessionBackend[Any] | None = None,
    ) -> None:
        super().__init__()
        self._session = session
        self._config = config
        self._start = start
        #: The sample's service links and this service's name (a sample of several services).
        self._links = links
        #: The backend that opened the session (a sample of one service): :meth:`restore` opens another.
        self._opener = backend
        #: The snapshots :meth:`snapshot` took: removed with the sample.
        self._snapshots: list[Snapshot] = []
        #: Serves ``adk-sandbox attach`` for the sample's session once ``connection()`` was asked.
        self._attach_server: AttachServer | None = None

    # -- configuration and lifecycle -----------------------------------------------------------------
    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        """The configuration model of a serialized configuration (an eval log's spec)."""
        if "services" in config:
            return AdkSandboxServices.model_validate(config)
        return AdkSandboxConfig.model_validate(config)

    @classmethod
    def default_concurrency(cls) -> int | None:
        """Samples running at once by default: two per core (each holds one container)."""
        return 2 * (os.cpu_count() or 1)

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        """Validate the configuration and connect to the Docker engine once for the task."""
        resolved = resolve_sample(config)
        configs = (
            [service.config for service in resolved.services.values()]
            if isinstance(resolved, AdkSandboxServices)
            else [resolved]
        )
        for each in configs:
            await run_blocking(
                functools.partial(_backend_of, cls, task_name, each), name="adk-sandbox-task-init"
            )

    @classmethod
    async def sample_init(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str]
    ) -> dict[str, SandboxEnvironment]:
        """Start the sample's container (verified hardened before it is used): ``{"default": env}``.

        A compose file of several services: one container each, in start-up order, linked by name
        (docs/network.md, "Several services"); the default service first in the dict.
        """
        resolved = resolve_sample(config)
        if isinstance(resolved, AdkSandboxServices):
            return await _unavailable_on_failure(
                run_blocking(
                    lambda _: cls._start_services(task_name, resolved), name="adk-sandbox-sample-init"
                )
            )

        backend = await run_blocking(
            lambda _: cls._backend(task_name, resolved), name="adk-sandbox-sample-init"
        )

        def start(_: threading.Event) -> tuple[SandboxSession, _SampleStart]:
            session: SandboxSession = backend.session()
            try:
                session.start()
                return session, _SampleStart.of(session, resolved)
            except BaseException:
                session.close()
                raise

        session, where = await _unavailable_on_failure(run_blocking(start, name="adk-sandbox-sample-init"))
        return {"default": cls(session, resolved, where, backend=backend)}

    @classmethod
    def _start_services(cls, task_name: str, resolved: AdkSandboxServices) -> dict[str, SandboxEnvironment]:
        sessions: dict[str, SandboxSession] = {}

        def agent_of(name: str) -> tuple[AgentTransport, str]:
            session = sessions.get(name)
            if not isinstance(session, ChannelSession):
                raise SandboxFailedError(f"service {name!r} is not running")
            return session.agent_channel()

        links = ServiceLinks(
            [
                LinkedService(name, service.ports, functools.partial(agent_of, name))
                for name, service in resolved.services.items()
            ]
        )
        order = _start_order(resolved)
        environments: dict[str, SandboxEnvironment] = {}
        try:
            for name in order:
                service = resolved.services[name]
                session = cls._backend(task_name, service.config).session()
                sessions[name] = session
                session.start()
                start = _SampleStart.of(session, service.config)
                links.serve(name)
                program = service.command
                if program is None and service.image_program:
                    program = image_program(service.config.image)
                if program:
                    _checked(session, ("sh", "-c", _SERVICE_START, "sh", *program), None, background=True)
                late = links.ready(name, SERVICE_READY_SECONDS) if service.ports else []
                if late:
                    log.warning(
                        "service %s does not accept on port(s) %s yet; the sample starts anyway", name, late
                    )
                environments[name] = cls(session, service.config, start, (links, name))
        except BaseException:
            links.close()
            for session in sessions.values():
                session.close()
            raise
        return {name: environments[name] for name in resolved.services}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        """Remove the sample's container (interrupted or not: nothing of it is needed afterwards)."""
        for environment in environments.values():
            await run_blocking(
                environment.as_type(AdkSandboxEnvironment)._close, name="adk-sandbox-sample-cleanup"
            )

    @classmethod
    async def task_cleanup(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool
    ) -> None:
        """Close the task's backends; with ``cleanup`` False (``--no-sandbox-cleanup``) keep the containers.

        Kept containers are listed with the command that removes them. They are also removed by the next
        ``DockerBackend`` to start once this process has ended (their owner is gone: the reaper).
        """
        with cls._backends_lock:
            keys = [key for key in cls._backends if key[0] == task_name]
            backends = [cls._backends.pop(key) for key in keys]
        for backend in backends:
            if cleanup:
                await run_blocking(_closer(backend), name="adk-sandbox-task-cleanup")
            else:
                for session in backend.sessions():
                    sandbox = getattr(session, "container_id", session.session_id)
                    print(
                        f"adk-sandbox container left running: {sandbox[:12]}; remove it with "
                        f"`inspect sandbox cleanup adk-sandbox {session.session_id}`"
                    )

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """``inspect sandbox cleanup adk-sandbox [ID]``: remove this provider's containers (or one by id)."""

        def clean(_: threading.Event) -> list[str]:
            removed: list[str] = []
            if id is not None:
                # A session id (what task_cleanup prints): its containers, replacements included.
                with contextlib.suppress(InvalidRequestError):  # not a session id: a container's then
                    removed += cleanup_session(id)
            # Else (or also) a container's id prefix or name, among this provider's containers.
            removed += cleanup_labelled({PROVIDER_LABEL: "adk-sandbox"}, match=id)
            return [container[:12] for container in dict.fromkeys(removed)]

        removed = await run_blocking(clean, name="adk-sandbox-cli-cleanup")
        if id is not None and not removed:
            print(f"no adk-sandbox container matches {id!r}")
        for container in removed:
            print(f"removed adk-sandbox container {container}")

    @classmethod
    def _backend(cls, task_name: str, config: AdkSandboxConfig) -> SessionBackend[Any]:
        """The task's backend for ``config`` (created on first use: it connects and reaps leaks)."""
        key = (task_name, config.model_dump_json())
        with cls._backends_lock:
            backend = cls._backends.get(key)
            if backend is None:
                if config.build is not None:
                    build_image(config.image, config.build)
                chosen: BackendConfig | dict[str, Any] | None = config.backend_config()
                if chosen is None:
                    chosen = {
                        "type": "docker",
                        "image": config.image,
                        "profile": config.profile,
                        "root_size_mb": config.root_size_mb,
                        "limits": config.limits,
                        "runtime": config.runtime,
                        "network": config.network,
                        "user": config.command_user(),
                        "tmpfs": config.tmpfs,
                        "extra_hosts": config.extra_hosts,
                        "labels": {PROVIDER_LABEL: "adk-sandbox", TASK_LABEL: task_name[:4096]},
                    }
                backend = cast("SessionBackend[Any]", make_backend(chosen))  # every one it takes has sessions
                cls._backends[key] = backend
            return backend

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        """``inspect sandbox connect``: ``adk-sandbox attach ID``, a terminal in the sample's session.

        Served by this process while the sample runs (:mod:`adk_sandbox.executor.attach`), on every
        backend whose session opens terminals; ``user`` runs it as that user.
        """
        if self._session.closed:
            raise ConnectionError("this sample's adk-sandbox container has been removed")
        if getattr(self._session, "open_pty", None) is None:
            raise ConnectionError(f"a {self._session.name} session offers no terminal to connect to")
        if user is not None and await self._resolve_user(user) is None:
            raise ConnectionError(f"user {user!r} is not in the sandbox's /etc/passwd")
        server = self._attach_server
        if server is None:
            server = self._attach_server = AttachServer(self._session)  # type: ignore[arg-type]
        as_user = ["--user", user] if user is not None else []
        command = shlex.join(["adk-sandbox", "attach", *as_user, self._session.session_id])
        container = getattr(self._session, "container_id", None)
        return SandboxConnection(
            type="adk-sandbox", command=command, container=container if isinstance(container, str) else None
        )

    def default_polling_interval(self) -> float:
        """How often inspect polls its tool helpers (``exec_remote``): an exec costs about a millisecond."""
        return 0.1

    # -- commands ------------------------------------------------------------------------------------
    async def exec(  # noqa: PLR0917 - inspect's signature
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        """Run ``cmd`` (argv, no shell) in the sample's container; see :class:`SandboxEnvironment`.

        ``timeout_retry`` is not honoured: a timed-out command is killed with its whole process tree and
        reported as ``TimeoutError``, never started again (it may have had effects).
        """
        if not cmd:
            raise ValueError("exec needs a command: cmd is empty")
        who: str | None = None
        if user is not None:
            who = await self._resolve_user(user)
            if who is None:
                # What `docker exec --user` says: a result, since the command could not run as asked.
                return ExecResult(
                    False, 126, "", f"unable to find user {user}: no matching entries in passwd file\n"
                )
        workdir = self._start.workdir
        directory = posixpath.normpath(posixpath.join(workdir, cwd)) if cwd else workdir
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        if self._links is not None:
            links, name = self._links
            # Its listeners for the siblings again when its agent (or container) was replaced.
            await _unavailable_on_failure(run_blocking(lambda _: links.serve(name), name="adk-sandbox-links"))
        try:
            request = ExecRequest(
                argv=tuple(cmd),
                stdin=input,
                # The session's own default is the working directory: not naming it saves a check.
                cwd=None if directory == self._start.session_workdir else directory,
                env={**self._config.env, **(env or {})},
                user=who,
                timeout=min(timeout, MAX_TIMEOUT_SECONDS) if timeout else MAX_TIMEOUT_SECONDS,
                max_output_bytes=limit,
                # inspect's tool server must outlive the call that starts it (bash_session, text_editor
                # keep their state in it); every other command keeps the default: nothing outlives it.
                background=_starts_tool_server(cmd),
            )
        except ValidationError as exc:
            raise ValueError(f"adk-sandbox cannot run this command: {exc}") from None
        try:
            result = await _unavailable_on_failure(
                run_blocking(
                    lambda cancel: self._session.execute(request, cancel=cancel), name="adk-sandbox-exec"
                )
            )
        except InvalidRequestError as exc:
            # A cwd the user cannot enter (nothing ran): a failed result, as `docker exec --workdir` gives.
            return ExecResult(False, 126, "", f"{exc}\n")
        return _inspect_result(result, cmd, timeout)

    async def _resolve_user(self, user: str) -> str | None:
        """``uid:gid`` for ``user`` (numbers, or names in the container's tables now); None: unknown.

        Read at each call, never kept: a user that ``adduser`` made a moment ago is found.
        """
        if is_numeric_user(user):
            uid, gid = parse_user(user)
            return f"{uid}:{gid}" if gid is not None else str(uid)
        files = self._session.files
        passwd = await self._file_call(lambda: files.read_bytes("/etc/passwd"))
        try:
            group = await self._file_call(lambda: files.read_bytes("/etc/group"))
        except FileNotFoundError:
            group = b""
        try:
            uid, gid = resolve_user(user, passwd.decode("utf-8", "replace"), group.decode("utf-8", "replace"))
        except InvalidRequestError:
            return None
        return f"{uid}:{gid}"

    # -- files ---------------------------------------------------------------------------------------
    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> Union[str | bytes]:  # noqa: UP007 - the ABC's
        """Read ``file`` inside the container as the sample's user (relative: to the working directory)."""
        if posixpath.basename(file.rstrip("/")) in (".", ".."):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", file)
        path = self._path(file)
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        # One byte past the limit tells "exactly at the limit" from "over it" without a stat.
        data = await self._file_call(lambda: self._read(path, limit + 1, file), file)
        if len(data) > limit:
            raise OutputLimitExceededError(
                limit_str=SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, truncated_output=None
            )
        return data.decode("utf-8") if text else data

    async def write_file(self, file: str, contents: str | bytes) -> None:
        """Write ``file`` inside the container as the sample's user, creating missing parent directories.

        Like ``open(file, "w")``: a file the user may not write is refused (``PermissionError``), a
        directory too (``IsADirectoryError``); an existing file keeps its mode.
        """
        path = self._path(file)
        data = contents.encode("utf-8") if isinstance(contents, str) else bytes(contents)
        await self._file_call(lambda: self._write(path, data, file), file)

    def _read(self, path: str, limit: int, shown: str) -> bytes:
        files = self._session.files
        if self._start.root and not files.stat(path).mode & stat.S_IRUSR:
            raise PermissionError(errno.EACCES, "Permission denied: its owner may not read it", shown)
        return files.read_bytes(path, limit=limit)

    def _write(self, path: str, data: bytes, shown: str) -> None:
        files = self._session.files
        try:
            found = files.stat(path)
        except FileNotFoundError:
            files.mkdir(posixpath.dirname(path), parents=True)
            files.write_bytes(path, data)
            return
        if found.type == "dir":
            raise IsADirectoryError(errno.EISDIR, "Is a directory: cannot write a file over it", shown)
        if self._start.root and not found.mode & stat.S_IWUSR:
            raise PermissionError(errno.EACCES, "Permission denied: its owner may not write it", shown)
        # The agent refuses a file this user may not write (PermissionError, as `open(file, "w")`) and
        # keeps an existing file's mode (docs/DOCKER.md, "Atomic writes").
        files.write_bytes(path, data)

    # -- snapshots (docs/snapshots.md, "In inspect and MCP") -------------------------------------------
    async def snapshot(self, name: str | None = None, *, labels: Mapping[str, str] | None = None) -> Snapshot:
        """The sample's files now: ``/tmp``, HOME, the extra tmpfs and, under the task profile, the root.

        Reach it with ``sandbox().as_type(AdkSandboxEnvironment)``. No command runs while it is taken. The
        snapshot is removed with the sample (its cleanup); give it to :meth:`restore` to roll the sample
        back, any number of times. On Docker processes are not carried (``snapshot.carries``); a microVM
        is kept whole, its processes with it (docs/pause.md).
        """
        session, _, processes = self._forkable("snapshot")
        taken: Snapshot = await run_blocking(
            lambda _: session.snapshot(name, labels=labels, processes=processes), name="adk-sandbox-snapshot"
        )
        self._snapshots.append(taken)
        return taken

    async def restore(self, snapshot: Snapshot) -> None:
        """Roll this sample back: its sandbox is replaced by a fresh one holding ``snapshot``'s files.

        The old sandbox (and every process in it) is removed once the new one has started; if the new one
        cannot start, the sample keeps the old one and the error is raised.
        """
        _, backend, _ = self._forkable("restore")

        def swap(_: threading.Event) -> None:
            fresh: SandboxSession = backend.session(snapshot=snapshot)
            try:
                fresh.start()
            except BaseException:
                fresh.close()
                raise
            old, self._session = self._session, fresh
            old.close()

        await run_blocking(swap, name="adk-sandbox-restore")

    @contextlib.asynccontextmanager
    async def fork(self) -> AsyncIterator[AdkSandboxEnvironment]:
        """A sandbox of its own holding this sample's files now (best-of-n inside a solver).

        ``async with env.fork() as other:`` -- ``other`` runs commands and file operations like this
        sample's; nothing it does reaches this sample. It is removed, with the snapshot taken for it, when
        the block ends. Keep a fork's result with ``await other.snapshot()`` then ``await env.restore(...)``.
        """
        session, _, processes = self._forkable("fork")
        child: SandboxSession = await run_blocking(
            lambda _: session.fork(processes=processes), name="adk-sandbox-fork"
        )
        forked = AdkSandboxEnvironment(child, self._config, self._start, backend=self._opener)
        try:
            yield forked
        finally:
            await run_blocking(forked._close, name="adk-sandbox-fork-cleanup")

    def _forkable(self, what: str) -> tuple[_Forkable, Any, bool]:
        """The sample's session and backend, if ``what`` (snapshot, restore, fork) can be done.

        And whether it is copied with its processes (a microVM's files are in its memory).
        """
        if self._links is not None:
            raise InvalidRequestError(
                f"{what} is not available for a sample of several services: its services are linked to each "
                "other's running sandboxes, which a snapshot does not carry (docs/snapshots.md)"
            )
        opener = self._opener
        if opener is None:
            raise InvalidRequestError(f"{what} needs a sample started by this provider's sample_init")
        session = self._session
        kinds = session.capabilities().snapshots
        if not kinds or not isinstance(session, _Forkable):
            raise InvalidRequestError(
                f"{what} is not available on the {opener.name} backend: its sessions take no snapshots "
                "(docs/snapshots.md, docs/CAPABILITIES.md)"
            )
        return session, opener, "files" not in kinds

    def _close(self, _: threading.Event) -> None:
        if self._attach_server is not None:
            self._attach_server.close()
        if self._links is not None:
            self._links[0].close()
        self._session.close()
        # After the session: a snapshot whose root image a running session uses cannot be removed.
        for taken in reversed(self._snapshots):  # a later root image may be a child of an earlier one
            try:
                if isinstance(self._opener, DockerBackend):
                    self._opener.remove_snapshot(taken)
                else:  # a microVM's: its directory is all of it
                    SnapshotStore(os.path.dirname(taken.path)).remove(taken)
            except InvalidRequestError as exc:  # gone already, or in use by a fork still open
                log.warning("snapshot %s of a sample was not removed: %s", taken.id, exc)
        self._snapshots.clear()

    def _path(self, file: str) -> str:
        return posixpath.join(self._start.workdir, file)

    async def _file_call(self, call: Callable[[], T], shown: str | None = None) -> T:
        """Run a file operation off the event loop; OSErrors name ``shown`` (the path as inspect gave it)."""
        try:
            return await _unavailable_on_failure(run_blocking(lambda _: call(), name="adk-sandbox-file"))
        except OSError as exc:
            if shown is None or exc.filename == shown or isinstance(exc, TimeoutError):
                raise
            raise type(exc)(exc.errno, exc.strerror, shown) from exc


@dataclass(frozen=True)
class _SampleStart:
    """What a started sample's session says of itself, read once by one command at sample start."""

    workdir: str
    """Where commands start and relative paths lead (the config's ``working_dir``, else the session's)."""
    session_workdir: str
    """The session's own default directory (a command there needs no ``cwd``)."""
    user: str
    """``uid:gid`` commands run as by default (``inspect sandbox connect`` uses it)."""

    @property
    def root(self) -> bool:
        """Commands and file operations run as root: permission bits do not bind them.

        The file operations then honour the owner's bits themselves, as inspect's docker provider does
        for reads: a ``chmod -r`` / ``chmod -w`` file is a ``PermissionError`` for the model too.
        """
        return self.user.split(":")[0] == "0"

    @classmethod
    def of(cls, session: SandboxSession, config: AdkSandboxConfig) -> _SampleStart:
        """Ask ``session`` (started) where it starts and as whom; make ``working_dir`` (task profile)."""
        if config.working_dir is not None and config.profile == "task":
            # As Docker does for a compose file's working_dir: made when missing, by root (a Docker task
            # sandbox; elsewhere by the command user, where it may write).
            root = "0:0" if config.backend_type == "docker" else None
            _checked(session, ("mkdir", "-p", "--", config.working_dir), root)
        output = _checked(session, ("sh", "-c", 'pwd; echo "$(id -u):$(id -g)"'), None)
        session_workdir, user = output.split("\n")[:2]
        return cls(config.working_dir or session_workdir, session_workdir, user)


def _checked(
    session: SandboxSession, argv: tuple[str, ...], user: str | None, *, background: bool = False
) -> str:
    result = session.execute(ExecRequest(argv=argv, user=user, timeout=60, background=background))
    if result.exit_code != 0:
        raise SandboxFailedError(f"{shlex.join(argv)} failed at sample start: {result.stderr.strip()}")
    return result.stdout


def image_program(image: str) -> tuple[str, ...]:
    """What ``docker run IMAGE`` would run: the image's ``ENTRYPOINT`` then its ``CMD`` (empty: nothing).

    A service of several without ``command`` runs this, as under compose (its first process is the
    library's keeper, so the image's own program is started by the provider instead). Read from the engine
    of ``DOCKER_HOST``, where the backend runs the image.
    """
    client = docker.from_env()
    try:
        config = client.images.get(image).attrs.get("Config") or {}
    except docker.errors.DockerException as exc:
        why = f"the image {image} could not be read for its ENTRYPOINT and CMD: {exc}"
        raise SandboxFailedError(why) from None
    finally:
        client.close()
    return tuple(str(word) for word in (config.get("Entrypoint") or [])) + tuple(
        str(word) for word in (config.get("Cmd") or [])
    )


def build_image(image: str, build: ImageBuild) -> None:
    """Build ``image`` from ``build`` on the engine (``DOCKER_HOST``); a failure says why, with the log."""
    client = docker.from_env()
    try:
        client.images.build(
            path=build.context,
            dockerfile=build.dockerfile,
            tag=image,
            buildargs=dict(build.args),
            network_mode=build.network,
            rm=True,
            forcerm=True,
        )
    except docker.errors.BuildError as exc:
        lines = [str(entry.get("stream") or entry.get("error") or "").rstrip() for entry in exc.build_log]
        tail = "\n".join(line for line in lines if line)[-2000:]
        raise ValueError(f"building {image} from {build.context} failed: {exc.msg}\n{tail}") from None
    except docker.errors.DockerException as exc:
        raise BackendUnavailableError(f"cannot build {image} from {build.context}: {exc}") from exc
    finally:
        client.close()


async def _unavailable_on_failure(call: Awaitable[T]) -> T:
    """Await ``call``; the sandbox itself failing becomes inspect's ``SandboxUnavailableError``.

    Only the container or the engine failing: a refused request (``InvalidRequestError``) or policy
    (``PolicyNotEnforceableError``) is the caller's to see as it is.
    """
    try:
        return await call
    except (SandboxFailedError, BackendUnavailableError) as exc:
        raise SandboxUnavailableError(f"the adk-sandbox container cannot run commands: {exc}") from exc


def _inspect_result(result: CoreExecResult, cmd: list[str], timeout: int | None) -> ExecResult[str]:
    """Inspect's result (or error) for a core result."""
    if result.timed_out:
        error = TimeoutError(f"Command timed out after {timeout} seconds (its processes were killed)")
        partial = result.stdout + result.stderr
        if partial:
            error.truncated_output = partial  # type: ignore[attr-defined]  # what inspect's docker sets
        raise error
    if result.stdout_truncated or result.stderr_truncated:
        raise OutputLimitExceededError(
            limit_str=SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR,
            truncated_output=result.stdout if result.stdout_truncated else result.stderr,
        )
    status = result.exit_code if result.exit_code is not None else _KILLED_STATUS
    # The in-sandbox agent reports a program it could not execute as exit 126 and exactly this line.
    if status == 126 and not result.stdout and result.stderr == f"{cmd[0]}: Permission denied\n":
        raise PermissionError(errno.EACCES, "Permission denied: cannot execute this program", cmd[0])
    return ExecResult(status == 0, status, result.stdout, result.stderr)


def _closer(backend: SessionBackend[Any]) -> Callable[[threading.Event], None]:
    return lambda _: backend.close()


def _backend_of(
    cls: type[AdkSandboxEnvironment], task_name: str, config: AdkSandboxConfig, _: threading.Event
) -> SessionBackend[Any]:
    return cls._backend(task_name, config)


def _start_order(resolved: AdkSandboxServices) -> list[str]:
    """The services in an order where each starts after those it depends on (the dict's, when it can)."""
    order: list[str] = []

    def visit(name: str, seen: tuple[str, ...]) -> None:
        if name in order:
            return
        if name in seen:
            raise ValueError(f"depends_on makes a cycle: {' -> '.join([*seen, name])}")
        for other in resolved.services[name].depends_on:
            visit(other, (*seen, name))
        order.append(name)

    for name in resolved.services:
        visit(name, ())
    return order


def _services_config(loaded: dict[str, Any], path: Path) -> AdkSandboxConfig | AdkSandboxServices:
    """A compose file's config: one service as before; several linked (names, ``NO_PROXY``)."""
    services = compose_services(loaded, path)
    if len(services) == 1:
        return AdkSandboxConfig.model_validate(services[0].fields)
    names = [service.name for service in services]
    addresses = service_addresses(names)
    result: dict[str, AdkSandboxService] = {}
    for service in services:
        fields = dict(service.fields)
        hosts = {name: ("127.0.0.1" if name == service.name else addresses[name]) for name in names}
        env = dict(fields.get("env") or {})
        for key in ("NO_PROXY", "no_proxy"):
            # Siblings are reached directly (a listener of this sandbox), never through the policy's proxy.
            env[key] = ",".join(filter(None, [env.get(key) or "localhost,127.0.0.1", *names]))
        fields.update(env=env, extra_hosts=hosts)
        result[service.name] = AdkSandboxService(
            config=AdkSandboxConfig.model_validate(fields),
            command=service.command,
            image_program=service.command is None and not service.default,
            ports=service.ports,
            depends_on=service.depends_on,
        )
    return AdkSandboxServices(services=result)


def resolve_config(config: SandboxEnvironmentConfigType | None) -> AdkSandboxConfig:
    """The configuration of a one-container sample (:func:`resolve_sample`); several services: ValueError."""
    resolved = resolve_sample(config)
    if isinstance(resolved, AdkSandboxServices):
        raise ValueError(
            f"{config!r} has {len(resolved.services)} services: a sample of several (resolve_sample)"
        )
    return resolved


def resolve_sample(config: SandboxEnvironmentConfigType | None) -> AdkSandboxConfig | AdkSandboxServices:
    """The configuration inspect hands over: None (defaults), a file's path, or the model.

    The file: a YAML/JSON file of the fields, a compose file (several services give
    :class:`AdkSandboxServices`), or a Dockerfile.
    """
    if config is None:
        return AdkSandboxConfig()
    if isinstance(config, AdkSandboxConfig | AdkSandboxServices):
        return config
    if isinstance(config, str):
        path = Path(config)
        if not path.is_file():
            raise ValueError(f"adk-sandbox config file {config!r} does not exist")
        if is_dockerfile(path):
            return AdkSandboxConfig.model_validate(dockerfile_fields(path))
        loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if is_compose(loaded):
            try:
                return _services_config(loaded, path.resolve())
            except ValidationError as exc:
                raise ValueError(f"compose file {config!r}: {exc}") from None
        if not isinstance(loaded, dict):
            raise ValueError(
                f"adk-sandbox config file {config!r} must hold a mapping of AdkSandboxConfig fields"
            )
        return AdkSandboxConfig.model_validate(loaded)
    if isinstance(config, BaseModel):
        return AdkSandboxConfig.model_validate(config.model_dump())
    raise ValueError(
        f"adk-sandbox config must be a file path or AdkSandboxConfig, not {type(config).__name__}"
    )
