"""The container provider: the engine-specific part of a session.

:class:`ContainerProvider` creates (or adopts) one hardened container, verifies from ``docker inspect``
that its hardening is really in force, and removes it: nothing about commands. What a session needs to run
commands in the container it got is an :class:`OpenedContainer`. The session (:mod:`.session`) owns the
lifecycle and the restarts; the command transport (:mod:`adk_sandbox.executor.channel.agent_transport`
over a stream of :mod:`._exec`, or :mod:`._exec` alone) talks to the container.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import docker
import docker.errors

from adk_sandbox.executor._layout import AGENT_MOUNT, DIRECT_MOUNT
from adk_sandbox.executor.backends.docker._daemon import (
    DEFAULT_SOCKET,
    engine_of,
    idempotent,
    remove_container,
)
from adk_sandbox.executor.backends.docker._dialect import Dialect, dialect_of, podman_host_config, podman_view
from adk_sandbox.executor.backends.docker._reaper import note_unremoved, owner_labels
from adk_sandbox.executor.backends.docker._spec import (
    GVISOR_RUNTIME,
    HOME_DIR,
    ContainerSpec,
    hardening_violations,
    host_config_arguments,
)
from adk_sandbox.executor.channel.probe import WorkspaceNotSharedError, split_brain_message
from adk_sandbox.executor.channel.static_agent import agent_launch
from adk_sandbox.executor.channel.transport import DEFAULT_PATH
from adk_sandbox.executor.errors import ExecutorError, PolicyNotEnforceableError, SandboxFailedError

log = logging.getLogger(__name__)

__all__ = [
    "ContainerProvider",
    "OomCounter",
    "OpenedContainer",
    "WorkspaceNotSharedError",
    "split_brain_message",
]


@dataclass(frozen=True)
class OpenedContainer:
    """A running container whose hardening was verified, and what commands in it start from."""

    id: str
    inspect: Mapping[str, Any]
    """``docker inspect`` of the container when it was verified (isolation is reported from it)."""
    workdir: str
    """The commands' default working directory (the workspace root, or the attached container's)."""
    base_env: dict[str, str]
    """The image's own variables (plus PATH and HOME): the base of every command's cleared environment."""
    confined_mounts: tuple[str, ...]
    """The host paths this library mounted on purpose (any other host mount is reported as unconfined)."""
    owner: str | None
    """uid:gid of the workspace root's owner on the host (who commands run as by default), if known."""
    dialect: Dialect = Dialect.DOCKER
    """The engine's dialect (:mod:`._dialect`): Podman's inspect was normalised, see ``deviations``."""
    deviations: tuple[str, ...] = ()
    """What the engine reported or did differently from Docker, and how it was counted."""

    @property
    def memory_limit_mb(self) -> int:
        """The container's memory limit in MiB (0: none)."""
        return int(self.inspect.get("HostConfig", {}).get("Memory") or 0) // (1024 * 1024)


class ContainerProvider:
    """Creates, verifies and removes a session's container (or adopts an existing one, never removed).

    ``attach_to`` names a container this library did not create (a compose service): its hardening is
    checked the same way, its limits are whatever it was given, and :meth:`remove` leaves it alone.
    """

    def __init__(
        self,
        client: docker.DockerClient,
        spec: ContainerSpec,
        attach_to: str | None,
        session_id: str | None = None,
    ) -> None:
        self._client = client
        self._spec = spec
        self._attach_to = attach_to
        self._placeholder_made = False
        self.session_id = session_id or uuid.uuid4().hex[:12]
        """The ``io.adk-sandbox.session`` label of each container this provider creates."""
        self._opened = 0
        self.starts_from: Callable[[str], None] | None = None
        """Starts the next container (given its id, created) from a checkpoint instead of afresh: a fork
        with its processes (docs/pause.md). Used once."""

    def use_spec(self, spec: ContainerSpec) -> None:
        """Create the next containers from ``spec`` (a workspace that turned out to need a mirror)."""
        self._spec = spec

    @property
    def spec(self) -> ContainerSpec:
        """The spec the next container is created from."""
        return self._spec

    @property
    def attached(self) -> bool:
        """True when the container is an existing one this provider did not create."""
        return self._attach_to is not None

    def open(self) -> OpenedContainer:
        """A running, verified container: created and started, or the attached one inspected."""
        attach_to = self._attach_to
        if attach_to is not None:
            inspect = idempotent(lambda: self._client.api.inspect_container(attach_to))
            return self._verify(inspect, verify_limits=False)
        spec = self._spec
        self._make_git_placeholder()
        spec = replace(spec, labels={**spec.labels, **owner_labels(self.session_id, spec.lifetime_seconds)})
        # A replacement gets a name of its own: the old container may still be being removed.
        self._opened += 1
        suffix = f"-{self._opened}" if self._opened > 1 else ""
        try:
            container_id = self._create(spec, f"adk-sandbox-{self.session_id}{suffix}")
        except _DirectNotSharedError as exc:
            # The daemon does not see this machine's directory (its own mount namespace): no direct path,
            # the proxy's connections travel as frames (the agent's probe would have found the same).
            log.info(
                "the engine does not see the egress socket directory (%s): proxying over the channel", exc
            )
            self._spec = replace(self._spec, direct_egress=None)
            spec = replace(spec, direct_egress=None)
            container_id = self._create(spec, f"adk-sandbox-{self.session_id}{suffix}")
        api = self._client.api

        restore, self.starts_from = self.starts_from, None

        def start() -> None:
            # A refused start (the runtime failed: a rejected rlimit, mount, ...) is final: retrying it
            # would only find the container erased by auto_remove and hide the daemon's reason.
            if restore is not None:
                restore(container_id)
                return
            try:
                api.start(container_id)
            except docker.errors.APIError as exc:
                gone = " (the container was removed meanwhile)" if exc.status_code == 404 else ""
                raise SandboxFailedError(
                    f"the sandbox container could not start{gone}: {exc.explanation or exc}"
                ) from exc

        try:
            idempotent(start)  # retried only when the daemon was unreachable
            return self._verify(idempotent(lambda: api.inspect_container(container_id)), verify_limits=True)
        except BaseException:
            # Never leave a half-started container behind (one the engine cannot remove now is noted for
            # the next reaper; the error that stopped the start is the one to report).
            with contextlib.suppress(ExecutorError):
                self.remove(container_id)
            raise

    def remove(self, container_id: str | None) -> None:
        """Remove a container this provider created (never an attached one), and the ``.git`` placeholder."""
        if container_id is None or self.attached:
            return
        try:
            remove_container(self._client, container_id)
        except ExecutorError as exc:
            note_unremoved(container_id)  # the engine is unreachable: the next backend's reaper removes it
            raise type(exc)(
                f"{exc}; the sandbox container {container_id[:12]} is left behind: the next DockerBackend() "
                "made in this process removes it once the engine answers"
            ) from exc
        self._remove_git_placeholder()

    def _create(self, spec: ContainerSpec, name: str) -> str:
        api = self._client.api
        arguments = host_config_arguments(spec)
        if dialect_of(self._client) is Dialect.PODMAN:
            arguments = podman_host_config(self._client, arguments)
        host_config = api.create_host_config(**arguments)

        if spec.checkpoints:  # the agent's keeper, reached by attaching (docs/pause.md)
            keeper = agent_launch(
                None,
                setid_allowed=spec.task,
                keeper_lifetime=spec.lifetime_seconds,
                bound=spec.bound_agent is not None,
            )
            entrypoint, command = keeper.argv, None
        else:
            entrypoint, command = ["sleep"], [str(spec.lifetime_seconds)]

        def create() -> str:
            try:
                created = api.create_container(
                    spec.image,
                    entrypoint=entrypoint,
                    command=command,
                    # stdin open and kept open between attaches (detach: StdinOnce false)
                    stdin_open=spec.checkpoints,
                    detach=spec.checkpoints,
                    user="0:0",  # the keeper; commands run as the workspace owner
                    # A task image starts where its WORKDIR says, as under `docker run`.
                    working_dir=None if spec.task and not spec.workspace else spec.workdir,
                    environment={"HOME": HOME_DIR},
                    labels=dict(spec.labels),
                    host_config=host_config,
                    name=name,
                    hostname="sandbox",
                )
            except docker.errors.APIError as exc:
                if exc.status_code == 409:  # a retried create whose first attempt went through
                    return str(api.inspect_container(name)["Id"])
                missing = "bind source path does not exist" in str(exc.explanation or "")
                if missing and spec.direct_egress is not None and spec.direct_egress in str(exc.explanation):
                    raise _DirectNotSharedError(str(exc.explanation)) from exc
                if missing:
                    raise WorkspaceNotSharedError(
                        split_brain_message(spec.workspace, exc.explanation)
                    ) from exc
                if "runtime" in str(exc).lower() and spec.runtime:
                    raise PolicyNotEnforceableError(
                        f"the Docker daemon cannot run runtime {spec.runtime!r} ({exc.explanation}); "
                        + _runtime_hint(spec.runtime)
                    ) from exc
                raise
            return str(created["Id"])

        return idempotent(create)

    def _verify(self, inspect: Mapping[str, Any], *, verify_limits: bool) -> OpenedContainer:
        """Check that a running container's hardening is really in force; what commands start from."""
        spec = self._spec
        engine = engine_of(self._client)
        container_id = str(inspect["Id"])
        dialect = dialect_of(self._client)
        deviations: tuple[str, ...] = ()
        if dialect is Dialect.PODMAN:
            view = podman_view(self._client, inspect)
            inspect, deviations = view.inspect, view.deviations
        mounts = [spec.workspace_source or spec.workspace] if spec.workspace else []
        mounts += [allowed.path for allowed in spec.extra_mounts] + [
            spec.host_path(p) for p in spec.read_only_mounts
        ]
        workdir = spec.workdir
        if self.attached or (spec.task and not spec.workspace):
            workdir = spec.workspace or inspect.get("Config", {}).get("WorkingDir") or "/"
            if spec.workspace:
                self._check_attached_workspace(inspect, spec.workspace)
                mounts.append(os.path.join(spec.workspace, ".git"))
        if spec.direct_egress is not None and not self.attached:
            mounts.append(spec.direct_egress)
        if spec.bound_agent is not None:
            mounts.append(spec.bound_agent)
        mounts += [source for source, _ in spec.layer_binds]  # a layered member's (checked by _layers)
        problems = hardening_violations(
            inspect,
            network=spec.network,
            runtime=spec.runtime,
            limits=spec.limits if verify_limits else None,
            mounts=mounts,
            attached=self.attached,
            engine_sockets=(engine.socket_path or DEFAULT_SOCKET,),
            tmpfs=None if self.attached else host_config_arguments(spec)["tmpfs"],
            task=spec.task and not self.attached,
            keeper=spec.checkpoints and not self.attached,
        )
        if spec.direct_egress is not None and not self.attached:
            direct = [m for m in inspect.get("Mounts") or [] if m.get("Source") == spec.direct_egress]
            if [(m.get("Destination"), bool(m.get("RW"))) for m in direct] != [(DIRECT_MOUNT, False)]:
                problems.append(f"the egress socket directory is not bound read-only at {DIRECT_MOUNT} alone")
        if spec.bound_agent is not None:
            agent_binds = [m for m in inspect.get("Mounts") or [] if m.get("Source") == spec.bound_agent]
            if [(m.get("Destination"), bool(m.get("RW"))) for m in agent_binds] != [(AGENT_MOUNT, False)]:
                problems.append(f"the agent's directory is not bound read-only at {AGENT_MOUNT} alone")
        if problems:
            hint = ""
            if dialect is Dialect.PODMAN and any(problem.startswith("runtime is") for problem in problems):
                hint = (
                    " (podman runs its own OCI runtime whatever a Docker API client asks; for gVisor use a "
                    "Docker engine with runsc registered)"
                )
            raise PolicyNotEnforceableError(
                f"container {inspect.get('Name', container_id)!r} is not hardened as required: "
                + "; ".join(problems)
                + hint
            )
        # A mirrored workspace's owner is the session's to choose (its host copy may be elsewhere: a session
        # from a snapshot mirrors its own directory at the snapshot's path, which need not exist here).
        layered = bool(spec.layer_binds)  # its workspace's host side is not at its path
        bound = spec.workspace_source or spec.workspace
        owner_path = (bound if spec.mirror is None and not layered else None) or (
            _mount_source_of(inspect, workdir) if self.attached else None
        )
        owner = None
        # A remote engine's mount sources are paths of another machine: a directory of the same name here
        # says nothing about who owns the one the container sees.
        if owner_path and engine.local:
            status = os.stat(owner_path)
            owner = f"{status.st_uid}:{status.st_gid}"
        return OpenedContainer(
            id=container_id,
            inspect=inspect,
            workdir=workdir,
            base_env=_image_env(inspect),
            confined_mounts=tuple(mounts),
            owner=owner,
            dialect=dialect,
            deviations=deviations,
        )

    def _check_attached_workspace(self, inspect: Mapping[str, Any], workspace: str) -> None:
        """An attached container must mount the workspace at its path, and its ``.git`` read-only."""
        name = self._attach_to
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

    def _make_git_placeholder(self) -> None:
        """Create the empty ``.git`` that is mounted read-only when the workspace has none."""
        path = self._spec.git_placeholder
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
        path = self._spec.git_placeholder
        if path is not None and self._placeholder_made:
            self._placeholder_made = False
            with contextlib.suppress(OSError):  # not empty (the user ran git init meanwhile): keep it
                os.rmdir(path)


class _DirectNotSharedError(Exception):
    """The engine does not see the direct egress socket's directory (its daemon has a mount namespace)."""


class OomCounter:
    """Reads the container cgroup's OOM-kill counter on the host (cgroup v1 or v2).

    Only possible when the engine runs on this machine; the in-sandbox agent reports the same counter
    from inside the container, which is preferred when it can.
    """

    def __init__(self, path: str, v2: bool) -> None:
        self._path = path
        self._key = "oom_kill"
        self._v2 = v2

    @classmethod
    def for_container(cls, inspect: Mapping[str, Any]) -> OomCounter | None:
        """The counter of the container's memory cgroup, or None when it cannot be read here."""
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
        """How many processes the OOM killer has killed in the cgroup (None: unreadable)."""
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


def _runtime_hint(runtime: str) -> str:
    if runtime == GVISOR_RUNTIME:
        return (
            "install gVisor's runsc 0.0~20240729 or later (`apt install runsc` on Debian trixie) and "
            "register it in /etc/docker/daemon.json as "
            '{"runtimes": {"runsc": {"path": "/usr/bin/runsc", '
            '"runtimeArgs": ["--network=none", "--oci-seccomp", "--overlay2=root:memory"]}}}, '
            "then reload dockerd (scripts/setup does this)"
        )
    return f"register the runtime {runtime!r} with the Docker daemon"
