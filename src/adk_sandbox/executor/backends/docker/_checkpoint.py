"""A keeper container's checkpoints through the engine's API.

:class:`ContainerCheckpoints` checkpoints and restores a container made with
``ContainerSpec(checkpoints=True)``; :func:`keeper_opener`, :func:`checkpoint_agent` and
:func:`restore_agent` hand the session's agent over across them. Depth: docs/pause.md, "The checkpoint to
disk" (why a keeper, what ``pause()`` and a fork do).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import docker

from adk_sandbox.executor.backends.docker._daemon import engine_of
from adk_sandbox.executor.backends.docker._exec import DaemonSocket, DockerAgentStream, DockerExecs
from adk_sandbox.executor.backends.docker._restorable import criu_refusal
from adk_sandbox.executor.channel.agent_transport import AgentTransport, DetachedAgent
from adk_sandbox.executor.channel.streams import AgentStream, ResidentOpener
from adk_sandbox.executor.errors import (
    ExecutorError,
    InvalidRequestError,
    PolicyNotEnforceableError,
    SandboxFailedError,
)

if TYPE_CHECKING:
    from adk_sandbox.executor.channel.connections import ConnectionHandler

log = logging.getLogger(__name__)

__all__ = [
    "CHECKPOINT_SECONDS",
    "ContainerCheckpoints",
    "adopt_agent",
    "checkpoint_agent",
    "keeper_agent",
    "keeper_opener",
    "require_checkpoints",
    "restore_agent",
    "start_from_copy",
]

#: How long a checkpoint or a restore may take before it is given up.
CHECKPOINT_SECONDS = 120.0
#: The random file added to each checkpoint (see :meth:`ContainerCheckpoints._make_unique`).
NONCE_FILE = "adk-sandbox-nonce"


def require_checkpoints(client: docker.DockerClient, runtime: str | None) -> None:
    """Refuse a backend whose sessions could not be checkpointed with their processes on this engine."""
    info = client.info()
    if not info.get("ExperimentalBuild"):
        raise PolicyNotEnforceableError(
            "checkpoints=True needs the Docker engine's checkpoints, an experimental feature: start dockerd "
            'with --experimental (or "experimental": true in daemon.json; scripts/setup does)'
        )
    if (runtime or info.get("DefaultRuntime") or "runc") != "runc":
        return  # runsc: gVisor's own checkpoint; another runtime is refused by the config
    if not engine_of(client).local:
        raise PolicyNotEnforceableError(
            "checkpoints=True on runc binds the agent's binary from this machine, which a remote engine "
            "cannot see: use a local engine, or runtime='runsc'"
        )
    if shutil.which("criu") is None:
        raise PolicyNotEnforceableError(
            "checkpoints=True on runc needs CRIU where the engine runs (`criu` on its PATH; scripts/setup "
            "installs it, docs/pause.md \"runc\"); runtime='runsc' checkpoints without it"
        )


class ContainerCheckpoints:
    """Checkpoint, restore and attach to one keeper container."""

    def __init__(self, client: docker.DockerClient, container_id: str) -> None:
        engine = engine_of(client)
        self._id = container_id
        self._daemon = DaemonSocket(engine, client.api.api_version)
        self._exec = DockerExecs(client, container_id, engine)

    def attach(self, until: float) -> DockerAgentStream:
        """A stream to the keeper's stdin and output (see :meth:`DockerExecs.attach_keeper`)."""
        return self._exec.attach_keeper(until)

    def create(self, *, stop: bool = True) -> str:
        """Checkpoint the container, and stop it unless ``stop`` is False; the checkpoint's name.

        On runc, a process tree CRIU could not restore is refused first (:func:`._restorable.criu_refusal`).
        """
        runtime, pid = self._state()
        if runtime != "runsc" and pid is not None:
            refusal = criu_refusal(pid)
            if refusal is not None:
                raise PolicyNotEnforceableError(
                    f"{refusal}; nothing was done, the session runs on. End that program first, or "
                    "pause(keep_memory=True)"
                )
        name = "adk-" + secrets.token_hex(8)
        status, body = self._daemon.request(
            "POST",
            f"/containers/{self._id}/checkpoints",
            {"CheckpointID": name, "Exit": stop},
            time.monotonic() + CHECKPOINT_SECONDS,
        )
        if status != 201:
            if stop and self.pid() is None:  # runsc stops the container when a checkpoint to exit fails
                raise SandboxFailedError(
                    f"the engine could not checkpoint the session's container ({status}): {_message(body)}; "
                    "the container stopped with it, so its processes are lost: the next call starts a "
                    "fresh one (the workspace is kept)"
                )
            raise SandboxFailedError(
                f"the engine could not checkpoint the session's container ({status}): {_message(body)}; "
                "it runs on as it was"
            )
        if not stop:
            return name
        # The engine answers before the container has stopped; a start meanwhile would find it running.
        status, body = self._daemon.request(
            "POST",
            f"/containers/{self._id}/wait?condition=not-running",
            None,
            time.monotonic() + CHECKPOINT_SECONDS,
        )
        if status != 200:
            raise SandboxFailedError(f"the checkpointed container did not stop ({status}): {_message(body)}")
        self._make_unique(name)
        return name

    def _make_unique(self, name: str) -> None:
        """Add a random file to checkpoint ``name``, where this process may write the engine's directory.

        At a restore Docker 20.10 stores the checkpoint's files in containerd's content store, keyed by
        their digest, and fails ("content ... already exists") when the same bytes were stored before:
        CRIU's images of a fresh container are the same from one run to the next.
        """
        with (
            contextlib.suppress(OSError, SandboxFailedError),
            open(os.path.join(self._dir(name), NONCE_FILE), "wb") as nonce,
        ):
            nonce.write(secrets.token_bytes(16))

    def restore(self, name: str) -> None:
        """Start the container from checkpoint ``name``."""
        status, body = self._daemon.request(
            "POST",
            f"/containers/{self._id}/start?checkpoint={name}",
            None,
            time.monotonic() + CHECKPOINT_SECONDS,
        )
        if status != 204:  # 304: it was running, so it did not start from the checkpoint
            raise SandboxFailedError(
                f"the engine could not restore the session's container from its checkpoint ({status}): "
                f"{_message(body)}"
            )

    def copy_to(self, name: str, other: str) -> None:
        """Copy checkpoint ``name`` into container ``other``'s own (created, not started), same name.

        The engine restores a container only from its own directory (Docker 20.10 refuses another), so
        this reads and writes the engine's directory: a local engine, and a process that may (root).
        """
        _copy_checkpoint(self._dir(name), self._dir(name, other))

    def copy_out(self, name: str, target: str) -> None:
        """Copy checkpoint ``name`` to the host directory ``target`` (made; a snapshot's ``checkpoint/``)."""
        _copy_checkpoint(self._dir(name), target)

    def copy_in(self, source: str, name: str) -> None:
        """Make ``source`` (a snapshot's ``checkpoint/``) this container's checkpoint ``name``; unique."""
        _copy_checkpoint(source, self._dir(name))
        self._make_unique(name)

    def _dir(self, name: str, container_id: str | None = None) -> str:
        return os.path.join(self._root(), "containers", container_id or self._id, "checkpoints", name)

    def pid(self) -> int | None:
        """The host pid of the container's first process (its sandbox under gVisor), None if stopped."""
        return self._state()[1]

    def _state(self) -> tuple[str | None, int | None]:
        """The container's runtime and the host pid of its first process (None if stopped or unknown)."""
        status, body = self._daemon.request("GET", f"/containers/{self._id}/json", None, _soon())
        if status != 200 or not isinstance(body, dict):
            return None, None
        runtime = (body.get("HostConfig") or {}).get("Runtime")
        return runtime, int((body.get("State") or {}).get("Pid") or 0) or None

    def _root(self) -> str:
        status, body = self._daemon.request("GET", "/info", None, time.monotonic() + 30.0)
        if status != 200 or not isinstance(body, dict) or not body.get("DockerRootDir"):
            raise SandboxFailedError(f"the engine did not say where its files are ({status})")
        return str(body["DockerRootDir"])

    def delete(self, name: str) -> None:
        """Remove checkpoint ``name`` (a restored one is not needed again)."""
        status, body = self._daemon.request(
            "DELETE", f"/containers/{self._id}/checkpoints/{name}", None, time.monotonic() + 30.0
        )
        if status not in (200, 204, 404):
            raise SandboxFailedError(
                f"the engine could not delete checkpoint {name} ({status}): {_message(body)}"
            )


def _copy_checkpoint(source: str, target: str) -> None:
    """Copy a checkpoint's directory, in or out of the engine's (which only root may read and write)."""
    try:
        shutil.copytree(source, target, symlinks=True)
    except OSError as exc:
        raise PolicyNotEnforceableError(
            f"a fork or snapshot with processes copies a checkpoint in or out of the engine's own directory "
            f"({exc}); it needs a local engine and a process that may write there: root (docs/pause.md)"
        ) from exc


def _message(body: object) -> str:
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return repr(body)


def _soon() -> float:
    return time.monotonic() + 30.0


def keeper_opener(
    client: docker.DockerClient, container_id: str, user_of: Callable[[], str]
) -> ResidentOpener:
    """The keeper's stdin for the first agent of the session's own user (``user_of()``); None for others."""
    claimed = False

    def keeper_stream(user: str, until: float) -> AgentStream | None:
        nonlocal claimed
        if claimed or user != user_of():
            return None
        claimed = True
        return ContainerCheckpoints(client, container_id).attach(until)

    return keeper_stream


def keeper_agent(transport: AgentTransport, done: str, grace: float = 0.0) -> str:
    """The user of the keeper's agent, if a checkpoint would keep everything the session ran.

    Refused (nothing ``done``) when the agent is no longer the keeper's, when another user's agent runs
    (its processes are exec'd: lost), or when a program, terminal, listener or connection is open after
    ``grace`` seconds (a published port's connection that its client just closed takes a moment to end).
    """
    user = transport.resident_user
    if user is None:
        raise PolicyNotEnforceableError(
            "this session's agent is no longer the container keeper's (it was restarted), so a checkpoint "
            f"would not keep the processes it started; nothing was {done}. pause(keep_memory=True) "
            "freezes them in place"
        )
    others = [other for other in transport.users() if other != user]
    if others:
        raise PolicyNotEnforceableError(
            f"commands ran as {', '.join(others)} beside the session's user {user}: their agents are not "
            f"the keeper's, and a checkpoint would not keep what they started; nothing was {done}. "
            "pause(keep_memory=True) freezes every process in place"
        )
    in_use, until = transport.in_use(user), time.monotonic() + grace
    while in_use and time.monotonic() < until:
        time.sleep(0.05)
        in_use = transport.in_use(user)
    if in_use:
        raise InvalidRequestError(
            f"{in_use} spawned program(s), terminal(s), listener(s) or connection(s) of this session "
            f"are open, and their streams cannot be held through a checkpoint; nothing was {done}. Close "
            "them first"
        )
    return user


def checkpoint_agent(
    client: docker.DockerClient,
    container_id: str,
    transport: AgentTransport,
    *,
    stop: bool,
    grace: float = 0.0,
) -> tuple[str, DetachedAgent]:
    """Checkpoint a keeper container (stopped, or running on); the checkpoint's name and the agent let go.

    ``grace``: how long open connections may take to end (:func:`keeper_agent`).

    Its agent is let go first (its stream is no part of what is kept); a container that runs on after
    (a fork's parent, or a refused checkpoint) gets it served again.
    """
    user = keeper_agent(transport, "paused" if stop else "forked", grace)
    checkpoints = ContainerCheckpoints(client, container_id)
    detached = transport.detach(user)
    try:
        name = checkpoints.create(stop=stop)
    except BaseException:
        with contextlib.suppress(ExecutorError):  # it runs on as it was
            transport.reattach(detached, checkpoints.attach(_soon()), _soon())
        raise
    if not stop:
        transport.reattach(detached, checkpoints.attach(_soon()), _soon())
    return name, detached


def restore_agent(
    client: docker.DockerClient,
    container_id: str,
    transport: AgentTransport,
    checkpoint: tuple[str, DetachedAgent],
) -> int | None:
    """Start a container from its ``checkpoint`` and serve its agent (the one let go) again.

    The restored checkpoint is deleted. Returns the container's sandbox pid on the host.
    """
    name, detached = checkpoint
    checkpoints = ContainerCheckpoints(client, container_id)
    checkpoints.restore(name)
    transport.reattach(detached, checkpoints.attach(_soon()), _soon())
    try:
        checkpoints.delete(name)
    except ExecutorError as exc:  # it goes with the container
        log.warning("a restored checkpoint was not deleted: %s", exc)
    return checkpoints.pid()


def start_from_copy(client: docker.DockerClient, source: str, name: str) -> Callable[[str], None]:
    """Starts a created container from a copy of container ``source``'s checkpoint ``name`` (a fork)."""

    def start(created: str) -> None:
        ContainerCheckpoints(client, source).copy_to(name, created)
        ContainerCheckpoints(client, created).restore(name)

    return start


def adopt_agent(
    client: docker.DockerClient,
    container_id: str,
    transport: AgentTransport,
    detached: DetachedAgent,
    *,
    listeners: Mapping[int, ConnectionHandler] | None = None,
) -> None:
    """Serve, as this container keeper's agent, the copy of another session's agent restored in it.

    ``listeners``: the copied agent's listeners to serve, with their handlers (others are closed).
    """
    stream = ContainerCheckpoints(client, container_id).attach(_soon())
    transport.reattach(detached, stream, _soon(), resident=True, listeners=listeners or {})
