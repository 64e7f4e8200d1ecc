"""A session: one hardened container, reused by every command, removed at close."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import docker
import docker.errors

from executor._env import build_child_env
from executor._languages import LANGUAGES, check_argument_sizes, inline_argv
from executor._output import OutputCapture
from executor.backend import OutputCallback, SandboxBackend
from executor.backends.docker._agent_transport import AgentTransport
from executor.backends.docker._daemon import daemon_socket_path, idempotent, remove_container
from executor.backends.docker._reaper import owner_labels
from executor.backends.docker._spec import (
    GVISOR_RUNTIME,
    HOME_DIR,
    ContainerSpec,
    capabilities_from_inspect,
    hardening_violations,
    host_config_arguments,
    isolation_of,
)
from executor.backends.docker._transport import (
    CommandOutcome,
    CommandTransport,
    ContainerGoneError,
    DockerExecTransport,
    PreparedCommand,
)
from executor.errors import InvalidRequestError, PolicyNotEnforceableError, SandboxFailedError
from executor.types import Capabilities, ExecRequest, ExecResult, IsolationClass, Language, parse_user

__all__ = ["DockerSession", "SessionConfig"]

log = logging.getLogger(__name__)

NOBODY = "65534:65534"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_PROGRAM_LANGUAGES = {
    LANGUAGES[lang].program: lang for lang in (Language.PYTHON, Language.JAVASCRIPT, Language.RUST)
}
_PROBE_LANGUAGES = (
    f"for p in {' '.join(_PROGRAM_LANGUAGES)}; do command -v $p >/dev/null 2>&1 && echo $p; done"
)
# Enters the requested cwd as the command's user, before the command: a cwd it cannot enter is refused.
_PROBE_CWD = 'cd -- "$1" 2>&1'


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
    transport: str = "agent"
    """How commands reach the container: ``"agent"`` (one long-lived agent) or ``"exec"`` (an exec each)."""


#: The command channels a session can use (see docs/DOCKER.md, "The agent channel").
TRANSPORTS = ("agent", "exec")


def argv_for(request: ExecRequest) -> tuple[str, ...]:
    """The program and arguments that run ``request`` inside the container.

    ``argv`` runs as given; code travels on the argv (:func:`executor._languages.inline_argv`, in
    pieces when longer than one argument may be), on both transports.
    """
    if request.argv is not None:
        check_argument_sizes(request.argv, "docker")
        return request.argv
    assert request.language is not None and request.code is not None  # noqa: S101 - ExecRequest checks
    if request.language not in LANGUAGES:
        raise InvalidRequestError(f"the Docker backend cannot run {request.language.value!r} code")
    return inline_argv(request.language, request.code)


def container_user(user: str) -> str:
    """``"uid:gid"`` for a request's ``user``; a bare uid runs with the group of the same number.

    Never Docker's own fallback, group 0, for a uid the image's ``/etc/passwd`` does not know.
    """
    uid, gid = parse_user(user)
    return f"{uid}:{gid if gid is not None else uid}"


class DockerSession(SandboxBackend):
    """One container for the whole session: created at entry (or first use), reused, removed at close.

    Every command runs with a cleared environment (the image's own variables, then policy, then request
    env), as the uid:gid owning the workspace root, with the workspace root as cwd. A request's ``user``
    (any uid or uid:gid; a bare uid means uid:uid) and ``cwd`` (any directory of the container: the
    container is the confinement, the workspace is not required) replace those for one call; a cwd the
    user cannot enter is refused with ``InvalidRequestError`` before the command starts. A timeout or a cancel
    kills the command's whole process tree inside the container and keeps the output so far. After a
    fork bomb, OOM or timeout the session keeps working; when the container itself died or could not be
    cleaned, the next command gets a fresh container (logged, and counted in :attr:`restarts`).
    """

    name = "docker"

    def __init__(self, client: docker.DockerClient, config: SessionConfig) -> None:
        self._client = client
        self._config = config
        self._lock = threading.Lock()
        self._container_id: str | None = None
        self._inspect: Mapping[str, Any] = {}
        self._transport: CommandTransport | None = None
        self._base_env: dict[str, str] = {}
        self._user = config.user or NOBODY
        self._workdir = config.spec.workdir
        self._languages: tuple[Language, ...] | None = None
        self._oom_counter: _OomCounter | None = None
        self._confined_mounts: tuple[str, ...] = ()
        self._placeholder_made = False
        self._closed = False
        # (container, user) pairs known to enter the default working directory (see _check_cwd).
        self._enterable: set[tuple[str, str]] = set()
        #: How many times the container (or its in-sandbox agent) was replaced by a fresh one.
        self.restarts = 0

    # -- lifecycle -----------------------------------------------------------------------------------
    @property
    def container_id(self) -> str:
        """The id of the session's container (started on demand)."""
        self.start()
        if self._container_id is None:  # closed concurrently
            raise SandboxFailedError("this Docker session is closed")
        return self._container_id

    @property
    def attached(self) -> bool:
        """True when this session uses an existing container it did not create (and will not remove)."""
        return self._config.attach_to is not None

    def start(self) -> None:
        """Create (or attach to) the container and verify its hardening; idempotent."""
        with self._lock:
            if self._closed:
                raise SandboxFailedError("this Docker session is closed")
            if self._container_id is None:
                self._open_container()

    def __enter__(self) -> DockerSession:
        self.start()
        return self

    def close(self) -> None:
        """Remove the container (unless attached). Idempotent."""
        with self._lock:
            self._closed = True
            self._discard_container()

    def _open_container(self) -> None:
        attach_to = self._config.attach_to
        if attach_to is not None:
            inspect = idempotent(lambda: self._client.api.inspect_container(attach_to))
            self._adopt(inspect, verify_limits=False)
            return
        spec = self._config.spec
        self._make_git_placeholder()
        session_id = uuid.uuid4().hex[:12]
        spec = replace(spec, labels={**spec.labels, **owner_labels(session_id, spec.lifetime_seconds)})
        container_id = self._create(spec, f"adk-sandbox-{session_id}")
        api = self._client.api

        def start() -> None:
            # A refused start (the runtime failed: a rejected rlimit, mount, ...) is final: retrying it
            # would only find the container erased by auto_remove and hide the daemon's reason.
            try:
                api.start(container_id)
            except docker.errors.APIError as exc:
                gone = " (the container was removed meanwhile)" if exc.status_code == 404 else ""
                raise SandboxFailedError(
                    f"the sandbox container could not start{gone}: {exc.explanation or exc}"
                ) from exc

        try:
            idempotent(start)  # retried only when the daemon was unreachable
            self._container_id = container_id
            self._adopt(
                idempotent(lambda: self._client.api.inspect_container(container_id)), verify_limits=True
            )
        except BaseException:
            # Never leave a half-started container behind.
            self._discard_container(container_id)
            raise

    def _create(self, spec: ContainerSpec, name: str) -> str:
        api = self._client.api
        host_config = api.create_host_config(**host_config_arguments(spec))

        def create() -> str:
            try:
                created = api.create_container(
                    spec.image,
                    entrypoint=["sleep"],
                    command=[str(spec.lifetime_seconds)],
                    user="0:0",  # the keeper; commands run as the workspace owner
                    working_dir=spec.workdir,
                    environment={"HOME": HOME_DIR},
                    labels=dict(spec.labels),
                    host_config=host_config,
                    name=name,
                    hostname="sandbox",
                )
            except docker.errors.APIError as exc:
                if exc.status_code == 409:  # a retried create whose first attempt went through
                    return str(api.inspect_container(name)["Id"])
                if "bind source path does not exist" in str(exc.explanation or ""):
                    raise PolicyNotEnforceableError(_split_brain(spec.workspace, exc.explanation)) from exc
                if "runtime" in str(exc).lower() and spec.runtime:
                    raise PolicyNotEnforceableError(
                        f"the Docker daemon cannot run runtime {spec.runtime!r} ({exc.explanation}); "
                        + _runtime_hint(spec.runtime)
                    ) from exc
                raise
            return str(created["Id"])

        return idempotent(create)

    def _adopt(self, inspect: Mapping[str, Any], *, verify_limits: bool) -> None:
        """Take a running container into use after checking that its hardening is really in force."""
        spec = self._config.spec
        container_id = str(inspect["Id"])
        self._container_id = container_id
        mounts = [spec.workspace] if spec.workspace else []
        mounts += [allowed.path for allowed in spec.extra_mounts] + list(spec.read_only_mounts)
        if self.attached:
            self._workdir = spec.workspace or inspect.get("Config", {}).get("WorkingDir") or "/"
            if spec.workspace:
                self._check_attached_workspace(inspect, spec.workspace)
                mounts.append(os.path.join(spec.workspace, ".git"))
        problems = hardening_violations(
            inspect,
            network=spec.network,
            runtime=spec.runtime,
            limits=spec.limits if verify_limits else None,
            mounts=mounts,
            attached=self.attached,
            engine_sockets=(daemon_socket_path(),),
        )
        if problems:
            raise PolicyNotEnforceableError(
                f"container {inspect.get('Name', container_id)!r} is not hardened as required: "
                + "; ".join(problems)
            )
        self._inspect = inspect
        self._confined_mounts = tuple(mounts)
        self._base_env = _image_env(inspect)
        owner_path = spec.workspace or (_mount_source_of(inspect, self._workdir) if self.attached else None)
        if self._config.user is None and owner_path:
            status = os.stat(owner_path)
            self._user = f"{status.st_uid}:{status.st_gid}"
        self._transport = self._make_transport(container_id)
        self._verify_by_probe(self._transport, spec.workspace)
        self._oom_counter = _OomCounter.for_container(inspect)

    def _make_transport(self, container_id: str) -> CommandTransport:
        if self._config.transport == "exec":
            return DockerExecTransport(self._client, container_id, daemon_socket_path())
        return AgentTransport(
            self._client, container_id, daemon_socket_path(), on_restart=self._agent_restarted
        )

    def _agent_restarted(self, why: str) -> None:
        self.restarts += 1

    @property
    def channel(self) -> str:
        """How commands reach the container: ``"agent"`` or ``"exec"``."""
        return self._config.transport

    def _check_attached_workspace(self, inspect: Mapping[str, Any], workspace: str) -> None:
        """An attached container must mount the workspace at its path, and its ``.git`` read-only."""
        name = self._config.attach_to
        if not _is_mounted(inspect, workspace):
            raise PolicyNotEnforceableError(
                f"container {name!r} does not mount the workspace {workspace} "
                "at the same path; mount it there (see compose.yaml) or attach without a workspace"
            )
        git = os.path.join(workspace, ".git")
        protected = (
            m.get("Type") == "bind" and m.get("Destination") == m.get("Source") == git and not m.get("RW")
            for m in inspect.get("Mounts") or []
        )
        if not any(protected):
            raise PolicyNotEnforceableError(
                f"container {name!r} can write {git}, so it could plant hooks or config that host git "
                f"would run; mount it read-only at the same path ({git}:{git}:ro, see compose.yaml)"
            )

    def _verify_by_probe(self, transport: CommandTransport, workspace: str | None) -> None:
        """Confirm from inside what inspect cannot show: the same workspace, and no set-id modes.

        The workspace: a daemon in another mount namespace (rootless Docker, Docker Desktop, a DinD
        sidecar, a forwarded socket) bind-mounts *its* copy of the path, and commands would silently run
        against other files. A nonce file written on the host must be visible inside. Set-id modes: a
        runtime may not apply the seccomp profile to exec'd processes (gVisor), so a ``chmod 4755`` on a
        scratch file in the container's /tmp must fail — run exactly as a command runs, under its
        supervisor and filter.
        """
        nonce = _IdentityNonce.create(workspace) if workspace else None
        try:
            script = _PROBE_SETID + (' ; cat -- "$1" 2>/dev/null' if nonce else "")
            argv = ("/bin/sh", "-c", script, "adk-sandbox-probe") + ((nonce.path,) if nonce else ())
            probe = PreparedCommand(
                argv=argv, env=dict(self._base_env), user=self._user, workdir="/", stdin=None,
                marker=uuid.uuid4().hex,
            )  # fmt: skip
            capture = OutputCapture(64 * 1024)
            outcome = transport.run(probe, capture, deadline=time.monotonic() + _PROBE_SECONDS, cancel=None)
            output = capture.finish()["stdout"].text
        finally:
            if nonce:
                nonce.remove()
        if outcome.exit_code is None:
            raise SandboxFailedError("the sandbox container did not answer its start-up check in time")
        if "setid-refused" not in output.split():
            if "setid-allowed" not in output.split():
                raise PolicyNotEnforceableError(
                    "could not check that commands cannot create setuid files: the start-up probe found no "
                    f"writable /tmp in the container (it printed {output[:200]!r}); give it a /tmp tmpfs"
                )
            raise PolicyNotEnforceableError(
                "commands in this container can create setuid/setgid files: neither the sandbox seccomp "
                "profile nor the command's own set-id filter is in force (docs/DOCKER.md, Set-id files)"
            )
        if nonce and nonce.token not in output:
            raise PolicyNotEnforceableError(_split_brain(workspace, "a probe file written here is not there"))

    def _discard_container(self, container_id: str | None = None) -> None:
        container_id = container_id or self._container_id
        self._container_id = None
        transport, self._transport = self._transport, None
        if isinstance(transport, AgentTransport):
            transport.close()
        if container_id is None or self.attached:
            return
        remove_container(self._client, container_id)
        self._remove_git_placeholder()

    def _make_git_placeholder(self) -> None:
        """Create the empty ``.git`` that is mounted read-only when the workspace has none."""
        path = self._config.spec.git_placeholder
        if path is None or self.attached:
            return
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            return  # another session made it, or the user: it is mounted read-only either way
        self._placeholder_made = True
        owner = os.stat(os.path.dirname(path))
        if os.geteuid() == 0 and (owner.st_uid, owner.st_gid) != (0, 0):
            os.chown(path, owner.st_uid, owner.st_gid)  # the workspace owner can remove it

    def _remove_git_placeholder(self) -> None:
        path = self._config.spec.git_placeholder
        if path is not None and self._placeholder_made:
            self._placeholder_made = False
            with contextlib.suppress(OSError):  # not empty (the user ran git init meanwhile): keep it
                os.rmdir(path)

    def _replace_container(self, why: str) -> None:
        """Swap in a fresh container (the old one died or could not be cleaned); said in the log.

        Called with the lock held. A closed session refuses: a container opened now would be removed by
        nothing (a close from another thread may land while a command is running).
        """
        if self._closed:
            raise SandboxFailedError("this Docker session is closed")
        log.warning("sandbox container %s replaced by a fresh one: %s", self._container_id, why)
        if self.attached:
            raise SandboxFailedError(f"the attached container {self._config.attach_to!r} {why}")
        self._discard_container()
        self._open_container()
        self.restarts += 1

    # -- what is enforced ----------------------------------------------------------------------------
    def isolation(self) -> IsolationClass:
        """The class of the running container (from ``docker inspect``; starts the session)."""
        self.start()
        return isolation_of(self._inspect)

    def capabilities(self) -> Capabilities:
        """What the running container enforces, read from ``docker inspect`` (starts the session)."""
        self.start()
        if self._languages is None:
            probe = self.execute(ExecRequest(language=Language.COMMAND, code=_PROBE_LANGUAGES, timeout=30))
            found = [_PROGRAM_LANGUAGES[word] for word in probe.stdout.split() if word in _PROGRAM_LANGUAGES]
            self._languages = (Language.COMMAND, *found)
        return capabilities_from_inspect(self._inspect, self._languages, self._confined_mounts)

    # -- commands ------------------------------------------------------------------------------------
    def execute(
        self,
        request: ExecRequest,
        on_output: OutputCallback | None = None,
        *,
        cancel: threading.Event | None = None,
    ) -> ExecResult:
        """Run ``request`` in the session's container (see the class docstring)."""
        argv = argv_for(request)
        self.start()
        # The container's limit is the only one enforced (read from inspect: an attached container's
        # limit is whatever its compose file chose).
        limit = int(self._inspect.get("HostConfig", {}).get("Memory") or 0) // (1024 * 1024)
        if request.memory_limit_mb is not None and (limit == 0 or request.memory_limit_mb < limit):
            raise PolicyNotEnforceableError(
                f"memory_limit_mb={request.memory_limit_mb} is below the session container's limit "
                f"({limit} MiB), which is the only one enforced; create the backend with "
                f"ResourceLimits(memory_mb={request.memory_limit_mb})"
                + (" or give the attached container that limit" if self.attached else "")
            )
        started = time.monotonic()
        self._check_cwd(request, started)
        capture = OutputCapture(request.output_cap, on_output)
        outcome, oom_killed = self._run(request, argv, capture, started, cancel)
        streams = capture.finish()
        killed = outcome.timed_out or outcome.cancelled or oom_killed
        return ExecResult(
            stdout=streams["stdout"].text,
            stderr=streams["stderr"].text,
            exit_code=None if killed else outcome.exit_code,
            timed_out=outcome.timed_out,
            oom_killed=oom_killed,
            cancelled=outcome.cancelled,
            stdout_truncated=streams["stdout"].truncated,
            stderr_truncated=streams["stderr"].truncated,
            duration_ms=int((time.monotonic() - started) * 1000),
        )

    def _check_cwd(self, request: ExecRequest, started: float) -> None:
        """Refuse a cwd the command's user cannot enter (nothing of the command ran).

        Asked of the container before the command for every explicit ``cwd``, and once per user for the
        default working directory when another user than the session's runs the call (the workspace
        root may be closed to it). Without this the program would fail to start with a misleading
        "Permission denied" or "No such file" about itself.
        """
        user = container_user(request.user) if request.user is not None else self._user
        if request.cwd is None and user == self._user:
            return
        cwd = request.cwd if request.cwd is not None else self._workdir
        known = (self._container_id or "", user)
        if request.cwd is None and known in self._enterable:
            return
        # Started in "/", which every user can enter (the workspace root may be closed to this user).
        probe = ExecRequest(argv=("/bin/sh", "-c", _PROBE_CWD, "adk-sandbox-cwd", cwd), cwd="/",
                            user=user, timeout=request.timeout)  # fmt: skip
        capture = OutputCapture(4096)
        outcome, _ = self._run(probe, probe.argv or (), capture, started, None)
        if outcome.timed_out:
            return  # the call's time ran out during the check: the command then times out, a result
        if outcome.exit_code != 0:
            streams = capture.finish()
            why = (
                streams["stdout"].text + streams["stderr"].text
            ).strip() or f"exit status {outcome.exit_code}"
            if request.cwd is None:
                raise InvalidRequestError(
                    f"user {user} cannot enter the session's working directory {cwd!r} in the Docker "
                    f"session's container ({why}); nothing ran. Give a cwd this user can enter"
                )
            raise InvalidRequestError(
                f"cwd {cwd!r} is not a directory the command can enter in the Docker session's "
                f"container ({why}); nothing ran. Create it first or give another cwd"
            )
        if request.cwd is None:
            self._enterable.add(known)

    def _run(
        self,
        request: ExecRequest,
        argv: tuple[str, ...],
        capture: OutputCapture,
        started: float,
        cancel: threading.Event | None,
    ) -> tuple[CommandOutcome, bool]:
        env = build_child_env(self._base_env, self._config.policy_env, request.env)
        command = PreparedCommand(
            argv=argv,
            env=env,
            user=container_user(request.user) if request.user is not None else self._user,
            workdir=request.cwd if request.cwd is not None else self._workdir,
            stdin=request.stdin_bytes,
            marker=uuid.uuid4().hex,
        )
        for attempt in (1, 2):
            transport, oom_counter = self._transport, self._oom_counter
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
            if outcome.kill_failed:
                with self._lock:
                    if not self._closed:  # closed meanwhile: the container is gone with the processes
                        self._replace_container("the command's processes could not be killed inside it")
            return outcome, oom_killed
        raise SandboxFailedError("the sandbox container could not be started")  # pragma: no cover


class _OomCounter:
    """Reads the container cgroup's OOM-kill counter on the host (cgroup v1 or v2)."""

    def __init__(self, path: str, v2: bool) -> None:
        self._path = path
        self._key = "oom_kill"
        self._v2 = v2

    @classmethod
    def for_container(cls, inspect: Mapping[str, Any]) -> _OomCounter | None:
        pid = inspect.get("State", {}).get("Pid")
        try:
            with open(f"/proc/{pid}/cgroup") as handle:
                lines = handle.read().splitlines()
        except OSError:
            return None
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                counter = cls(f"/sys/fs/cgroup/memory{path}/memory.oom_control", v2=False)
                return counter if counter.read() is not None else None
        for line in lines:
            if line.startswith("0::"):
                counter = cls(f"/sys/fs/cgroup{line[3:]}/memory.events", v2=True)
                return counter if counter.read() is not None else None
        return None

    def read(self) -> int | None:
        try:
            with open(self._path) as handle:
                for line in handle:
                    key, _, value = line.partition(" ")
                    if key == self._key:
                        return int(value)
        except (OSError, ValueError):
            return None
        return None


def _image_env(inspect: Mapping[str, Any]) -> dict[str, str]:
    """The container's own defaults (from its image): the base of every command's cleared environment."""
    env = {"PATH": DEFAULT_PATH}
    for entry in inspect.get("Config", {}).get("Env") or []:
        name, _, value = entry.partition("=")
        env[name] = value
    env["HOME"] = HOME_DIR
    return env


def _is_mounted(inspect: Mapping[str, Any], path: str) -> bool:
    for mount in inspect.get("Mounts") or []:
        target = mount.get("Destination", "")
        if mount.get("Source") == target and (path == target or path.startswith(target.rstrip("/") + "/")):
            return True
    return False


def _mount_source_of(inspect: Mapping[str, Any], path: str) -> str | None:
    """The host directory bind-mounted at ``path`` in the container (its owner runs the commands)."""
    for mount in inspect.get("Mounts") or []:
        if (
            mount.get("Type") == "bind"
            and mount.get("Destination") == path
            and os.path.isdir(mount["Source"])
        ):
            return str(mount["Source"])
    return None


_PROBE_SECONDS = 30.0
# Prints "setid-allowed" when a set-id mode can be set in the container (it must not: see _seccomp).
_PROBE_SETID = (
    'f=$(mktemp) && { if chmod 4755 "$f" 2>/dev/null; then echo setid-allowed; else echo setid-refused; fi; '
    'rm -f "$f"; }'
)


@dataclass(frozen=True)
class _IdentityNonce:
    """A random file in the workspace root, briefly, to prove the container sees the same directory."""

    path: str
    token: str

    @classmethod
    def create(cls, workspace: str) -> _IdentityNonce:
        token = uuid.uuid4().hex
        path = os.path.join(workspace, f".adk-sandbox-identity-{token}")
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            raise PolicyNotEnforceableError(
                f"cannot write a probe file into the workspace {workspace} ({exc.strerror}) to check that "
                "the Docker daemon sees the same directory"
            ) from exc
        with os.fdopen(descriptor, "w") as handle:
            handle.write(token)
        return cls(path, token)

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def _split_brain(workspace: str | None, evidence: object) -> str:
    return (
        f"the Docker daemon does not see this machine's {workspace} ({evidence}): it mounts a different "
        "directory at that path (a daemon in another mount namespace: rootless Docker, Docker Desktop, a "
        "remote or DinD engine). Commands would run against other files; use a daemon that shares this "
        "machine's filesystem"
    )


def _runtime_hint(runtime: str) -> str:
    if runtime == GVISOR_RUNTIME:
        return (
            "install gVisor (`apt install runsc`) and register it in /etc/docker/daemon.json as "
            '{"runtimes": {"runsc": {"path": "/usr/bin/runsc", '
            '"runtimeArgs": ["--network=none", "--oci-seccomp"]}}}, '
            "then reload dockerd (scripts/setup does this)"
        )
    return f"register the runtime {runtime!r} with the Docker daemon"
