"""Snapshots with processes: a keeper container's checkpoint kept in the snapshot store.

:func:`take_with_processes` copies a running session's checkpoint (and its workspace) into a snapshot,
always on disk; :func:`start_from_kept` restores a copy in a new session's container. Depth:
docs/pause.md, "What a snapshot with processes is".
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import TYPE_CHECKING

from adk_sandbox.executor.backends.docker._checkpoint import ContainerCheckpoints, checkpoint_agent
from adk_sandbox.executor.backends.docker._snapshot import copy_as_source
from adk_sandbox.executor.backends.docker._spec import MIB
from adk_sandbox.executor.channel.agent_transport import DetachedAgent
from adk_sandbox.executor.errors import ExecutorError, InvalidRequestError, PolicyNotEnforceableError
from adk_sandbox.executor.snapshots.model import KeptProcesses, Snapshot, SnapshotOptions, new_record
from adk_sandbox.executor.snapshots.store import SnapshotStore, new_id

if TYPE_CHECKING:
    from adk_sandbox.executor.backends.docker.session import DockerSession

__all__ = ["start_from_kept", "take_with_processes"]

log = logging.getLogger(__name__)


def take_with_processes(session: DockerSession, options: SnapshotOptions, store: SnapshotStore) -> Snapshot:
    """Snapshot every process of ``session`` into ``store`` (see the module docstring); it runs on.

    Over ``options.max_mb`` it is refused (:class:`PolicyNotEnforceableError`) and nothing of it is kept.
    """
    client = session._client
    snapshot_id, created = new_id(), time.time()
    with session._quiesced(options.wait_seconds, "a snapshot is taken"):
        container = session._opened()
        transport = session._keeper_transport()
        endpoint = session._egress.carried(transport)
        name, detached = checkpoint_agent(client, container.id, transport, stop=False)
        checkpoints = ContainerCheckpoints(client, container.id)
        spec = session._config.spec

        def build(partial: str) -> Snapshot:
            target = os.path.join(partial, "checkpoint")
            checkpoints.copy_out(name, target)
            size, cap, method = _size(target), options.max_mb * MIB, "none"
            if size > cap:
                raise _over_cap(size, options.max_mb)
            if spec.workspace is not None and session.workspace is not None:
                # Commands are still held back: the copy is the workspace the checkpoint's processes saw.
                copied = os.path.join(partial, "workspace")
                os.mkdir(copied, 0o700)
                setting = f"the snapshot's cap (max_mb={options.max_mb})"
                report = copy_as_source(session.workspace, copied, cap - size, setting)
                size, method = size + report.size_bytes, report.method
            return new_record(
                options,
                snapshot_id,
                created,
                image=spec.image,
                image_id=str(container.inspect.get("Image") or ""),
                profile=spec.profile,
                runtime=spec.runtime,
                workspace=spec.workspace,
                method=method,
                size_bytes=size,
                carries=("files", "processes", "memory"),
                processes=KeptProcesses(
                    checkpoint=name,
                    user=detached.user,
                    hello=detached.hello,
                    numbering=detached.numbering,
                    endpoint=endpoint,
                ),
            )

        try:
            # On disk whatever the options say: a checkpoint in the memory tier would be host memory again.
            return store.take(snapshot_id, build, durable=True)
        finally:
            try:
                checkpoints.delete(name)
            except ExecutorError as exc:  # it goes with the container
                log.warning("a snapshot's engine checkpoint was not deleted: %s", exc)


def start_from_kept(session: DockerSession, snapshot: Snapshot) -> None:
    """Make ``session`` (not started) start as a restored copy of ``snapshot``'s checkpoint.

    Its container is created as usual; before it starts it must run the image the snapshot was taken of
    (else refused: the processes' memory belongs with those files), and gets a copy of the checkpoint.
    """
    kept = snapshot.processes
    assert kept is not None  # noqa: S101 - the caller checked
    client = session._client

    def start(created: str) -> None:
        image = str(client.api.inspect_container(created).get("Image") or "")
        if image != snapshot.image_id:
            raise InvalidRequestError(
                f"snapshot {snapshot.id} was taken of image {snapshot.image} as {snapshot.image_id[:19]}, "
                f"which is now {image[:19]}: its processes' memory goes only with the files they ran from. "
                "Start a session of the new image afresh"
            )
        checkpoints = ContainerCheckpoints(client, created)
        checkpoints.copy_in(snapshot.checkpoint_dir, kept.checkpoint)
        try:
            checkpoints.restore(kept.checkpoint)
        finally:
            with contextlib.suppress(ExecutorError):  # restored or not, the copy is not needed again
                checkpoints.delete(kept.checkpoint)

    session._adopting = DetachedAgent(kept.user, dict(kept.hello), kept.numbering, resident=True)
    session._adopting_endpoint = kept.endpoint
    session._provider.starts_from = start


def _over_cap(size: int, max_mb: int) -> PolicyNotEnforceableError:
    return PolicyNotEnforceableError(
        f"the snapshot would hold {size // MIB} MiB (the sandbox's checkpoint: its processes' memory, tmpfs "
        f"and root writes), more than its cap of {max_mb} MiB; nothing was taken and nothing is left of it. "
        "Take it with a larger max_mb, or free memory in the session first"
    )


def _size(path: str) -> int:
    """Bytes the files under ``path`` take on disk (a sparse file counts what it holds)."""
    total = 0
    for parent, _, files in os.walk(path):
        for name in files:
            total += os.lstat(os.path.join(parent, name)).st_blocks * 512
    return total
