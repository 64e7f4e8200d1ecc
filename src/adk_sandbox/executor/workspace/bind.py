"""The bind transport: the host directory bind-mounted at its own path, so there is nothing to copy.

Whether the engine mounted *this* machine's directory is the Docker backend's start-up probe's to check
(a nonce file, :mod:`adk_sandbox.executor.channel.probe`); a failed check goes to the mirror.
"""

from __future__ import annotations

from typing import Literal

from adk_sandbox.executor.workspace.protocol import Run

__all__ = ["BindWorkspace"]


class BindWorkspace:
    """The host directory bind-mounted at its own path: both sides see the same files, nothing to copy."""

    mode: Literal["bind", "mirror"] = "bind"

    def started(self, run: Run) -> None:
        """Nothing to copy (the identity probe already proved the mount is this machine's directory)."""

    def before_command(self, run: Run) -> None:
        """Nothing to copy."""

    def after_command(self, run: Run) -> list[str]:
        """Nothing to copy, nothing refused."""
        return []

    def closing(self, run: Run) -> None:
        """Nothing to copy."""
