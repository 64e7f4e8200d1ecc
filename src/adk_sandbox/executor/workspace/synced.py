"""A session's workspace synced over the session's own command channel: one place for the container backends.

:class:`SyncedWorkspace` drives a ``WorkspaceTransport`` (bind mount or mirror) for the Docker and
Kubernetes sessions: each sync step a command on the session's :class:`SyncChannel` (bounded by
:data:`SYNC_SECONDS`), the syncs one at a time, and :func:`refusal_note` for what pull-back refused.
See docs/docker/workspace-transport.md, section "Workspace transport".
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from adk_sandbox.executor._output import OutputCapture
from adk_sandbox.executor.channel.transport import CommandTransport, PreparedCommand
from adk_sandbox.executor.errors import ExecutorError, SandboxFailedError
from adk_sandbox.executor.workspace.mirror import MirrorWorkspace
from adk_sandbox.executor.workspace.protocol import RunResult, WorkspaceTransport

__all__ = ["MAX_REPORTED", "SYNC_SECONDS", "SyncChannel", "SyncedWorkspace", "refusal_note"]

log = logging.getLogger(__name__)

#: How long one sync step (a listing, a push, a fetch) may take.
SYNC_SECONDS = 300.0
#: Refusals said at the end of a command's stderr, at most.
MAX_REPORTED = 10


@dataclass(frozen=True)
class SyncChannel:
    """Where a sync step runs now: the session's transport, its sandbox's base environment, the user."""

    transport: CommandTransport
    env: Mapping[str, str]
    user: str
    """``"uid:gid"`` of the command user (what the sync creates in the sandbox is theirs)."""


class SyncedWorkspace:
    """A :class:`WorkspaceTransport` driven over a session's channel (see the module docstring).

    ``channel`` says where a sync step runs at the moment it runs (a Docker session replaces its container
    and transport when one dies); None when the sandbox is gone, which fails the step.
    """

    def __init__(self, workspace: WorkspaceTransport, channel: Callable[[], SyncChannel | None]) -> None:
        self.workspace = workspace
        """The transport being driven (a :class:`BindWorkspace` or a :class:`MirrorWorkspace`)."""
        self._channel = channel
        self._lock = threading.Lock()  # one sync of the copy at a time (commands may overlap)

    @property
    def mode(self) -> Literal["bind", "mirror"]:
        """``"bind"`` or ``"mirror"``."""
        return self.workspace.mode

    @property
    def mirror(self) -> MirrorWorkspace | None:
        """The mirror (its ``refused`` says what the last pull-back left), or None for a bind mount."""
        return self.workspace if isinstance(self.workspace, MirrorWorkspace) else None

    def run(self, argv: tuple[str, ...], stdin: bytes | None, max_output: int) -> RunResult:
        """One sync step in the sandbox, as the command user, outside any request (the mirror's ``Run``)."""
        channel = self._channel()
        if channel is None:
            raise SandboxFailedError("the sandbox container is gone; its workspace copy cannot be synced")
        command = PreparedCommand(
            argv=argv, env=dict(channel.env), user=channel.user, workdir="/", stdin=stdin,
            marker=uuid.uuid4().hex,
        )  # fmt: skip
        capture = OutputCapture(max_output)
        deadline = time.monotonic() + SYNC_SECONDS
        outcome = channel.transport.run(command, capture, deadline=deadline, cancel=None)
        streams = capture.finish()
        stdout = streams["stdout"]
        return RunResult(outcome.exit_code, stdout.data, streams["stderr"].data, stdout.truncated)

    def started(self) -> None:
        """A fresh sandbox is up and verified: give it the workspace (the whole host copy, for a mirror)."""
        with self._lock:
            self.workspace.started(self.run)

    def adopt(self, fill: Callable[[str], object], volume: str) -> list[str]:
        """Fill the mirror's copy on the host (``fill(volume)``) and take it as in sync.

        See :meth:`MirrorWorkspace.adopt` (what it returns). One sync at a time, like the others.
        """
        mirror = self.mirror
        if mirror is None:
            raise SandboxFailedError("only a mirrored workspace has a copy to fill on the host")
        with self._lock:
            fill(volume)
            return mirror.adopt(volume)

    def before_command(self) -> None:
        """Bring the host's changes in (the host copy is the truth)."""
        with self._lock:
            self.workspace.before_command(self.run)

    def after_command(self) -> list[str]:
        """Bring the sandbox's changes back; what pull-back refused (see :func:`refusal_note`)."""
        with self._lock:
            return self.workspace.after_command(self.run)

    def closing(self) -> None:
        """The sandbox is about to go: bring its last changes back (a failure is logged, not raised)."""
        try:
            with self._lock:
                self.workspace.closing(self.run)
        except ExecutorError as exc:
            log.warning("the workspace copy's last changes could not be brought back: %s", exc)

    def close(self) -> None:
        """Release what the host side holds (the mirror's descriptor of the workspace root)."""
        mirror = self.mirror
        if mirror is not None:
            mirror.close()


def refusal_note(refused: list[str]) -> str:
    """What pull-back did not bring to the host workspace, said at the end of stderr for the model."""
    if not refused:
        return ""
    lines = refused[:MAX_REPORTED] + (
        [f"... and {len(refused) - MAX_REPORTED} more"] if len(refused) > MAX_REPORTED else []
    )
    return "\n[adk-sandbox: not copied back to the host workspace: " + "; ".join(lines) + "]\n"
