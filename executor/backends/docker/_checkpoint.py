"""A keeper container's checkpoints through the engine's API (docs/pause.md).

A container made with ``ContainerSpec(checkpoints=True)`` runs the agent's keeper as its command, so the
engine's checkpoint (``POST /containers/{id}/checkpoints``, gVisor's ``runsc checkpoint`` under it) keeps
the agent and everything it started; ``start?checkpoint=`` restores them. Docker 20.10 offers these only
with the daemon's experimental features on (``scripts/setup`` turns them on).

A checkpoint lives in the container's own directory on the engine: it is removed with the container
(so the reaper that removes a leaked container removes its checkpoints) and deleted once restored.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import time

import docker

from adk_sandbox.executor.backends.docker._daemon import engine_of
from adk_sandbox.executor.backends.docker._exec import DaemonSocket, DockerAgentStream, DockerExecTransport
from adk_sandbox.executor.errors import PolicyNotEnforceableError, SandboxFailedError

__all__ = ["CHECKPOINT_SECONDS", "ContainerCheckpoints", "require_checkpoints"]

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


class ContainerCheckpoints:
    """Checkpoint, restore and attach to one keeper container."""

    def __init__(self, client: docker.DockerClient, container_id: str) -> None:
        engine = engine_of(client)
        self._id = container_id
        self._daemon = DaemonSocket(engine, client.api.api_version)
        self._exec = DockerExecTransport(client, container_id, engine)

    def attach(self, until: float) -> DockerAgentStream:
        """A stream to the keeper's stdin and output (see :meth:`DockerExecTransport.attach_keeper`)."""
        return self._exec.attach_keeper(until)

    def create(self, *, stop: bool = True) -> str:
        """Checkpoint the container, and stop it unless ``stop`` is False; the checkpoint's name."""
        name = "adk-" + secrets.token_hex(8)
        status, body = self._daemon.request(
            "POST",
            f"/containers/{self._id}/checkpoints",
            {"CheckpointID": name, "Exit": stop},
            time.monotonic() + CHECKPOINT_SECONDS,
        )
        if status != 201:
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
        with contextlib.suppress(OSError, SandboxFailedError):
            path = os.path.join(self._root(), "containers", self._id, "checkpoints", name, NONCE_FILE)
            with open(path, "wb") as nonce:
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
        root = self._root()
        source = os.path.join(root, "containers", self._id, "checkpoints", name)
        target = os.path.join(root, "containers", other, "checkpoints", name)
        try:
            shutil.copytree(source, target, symlinks=True)
        except OSError as exc:
            raise PolicyNotEnforceableError(
                f"a fork with processes copies the checkpoint in the engine's own directory ({root}), which "
                f"this process cannot ({exc}); it needs a local engine and root (docs/pause.md)"
            ) from exc

    def pid(self) -> int | None:
        """The host pid of the container's first process (its sandbox under gVisor), None if stopped."""
        until = time.monotonic() + 30.0
        status, body = self._daemon.request("GET", f"/containers/{self._id}/json", None, until)
        if status != 200 or not isinstance(body, dict):
            return None
        return int((body.get("State") or {}).get("Pid") or 0) or None

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


def _message(body: object) -> str:
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return repr(body)
