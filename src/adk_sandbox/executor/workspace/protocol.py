"""The seam between a session and its workspace: what a workspace transport is asked, and with what.

A :class:`WorkspaceTransport` is asked at four moments of a session: once the container is up
(:meth:`~WorkspaceTransport.started`), before and after every command, and before the container goes
(:meth:`~WorkspaceTransport.closing`). Each moment is given a :data:`Run`, which runs one command in the
sandbox as the command user and returns a :class:`RunResult`. The transports are
:class:`~adk_sandbox.executor.workspace.bind.BindWorkspace` (``"bind"``) and
:class:`~adk_sandbox.executor.workspace.mirror.MirrorWorkspace` (``"mirror"``);
:class:`~adk_sandbox.executor.workspace.synced.SyncedWorkspace` drives either over a session's channel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

__all__ = ["WORKSPACE_TRANSPORTS", "Run", "RunResult", "WorkspaceTransport"]


#: The choices of ``DockerBackend(workspace_transport=...)``.
WORKSPACE_TRANSPORTS = ("auto", "bind", "mirror")


@dataclass(frozen=True)
class RunResult:
    """What a sync command in the container gave: exit status (None: timed out), stdout, stderr."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    truncated: bool
    """stdout was longer than the ``max_output`` asked for."""


#: Runs argv in the container as the command user: (argv, stdin, max_output bytes) -> result.
Run = Callable[[tuple[str, ...], bytes | None, int], RunResult]


class WorkspaceTransport(Protocol):
    """How the workspace reaches the container (see the module docstring)."""

    mode: Literal["bind", "mirror"]

    def started(self, run: Run) -> None:
        """The container is up and verified: make the workspace present in it."""

    def before_command(self, run: Run) -> None:
        """Bring host-side changes into the container (the host copy is the truth)."""

    def after_command(self, run: Run) -> list[str]:
        """Bring the container's changes back to the host; what was refused (for the model to read)."""

    def closing(self, run: Run) -> None:
        """The container is about to be removed: bring its last changes back."""
