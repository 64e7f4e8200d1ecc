"""The interface of an OS-level enforcer that wraps host processes (bubblewrap on Linux)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from adk_sandbox.executor.policy import SandboxPolicy

__all__ = ["Confinement", "Enforcer"]


@dataclass(frozen=True)
class Confinement:
    """What an enforcer really confines for a given policy (feeds ``Capabilities``)."""

    network: bool
    fs_read: bool
    fs_write: bool
    pids: bool


class Enforcer(ABC):
    """Wraps a host command line so that it runs under a :class:`SandboxPolicy`."""

    #: Short identifier ("bwrap").
    name: str

    @abstractmethod
    def check_policy(self, policy: SandboxPolicy) -> None:
        """Raise ``PolicyNotEnforceableError`` if ``policy`` asks for something this enforcer cannot do."""

    @abstractmethod
    def confinement(self, policy: SandboxPolicy) -> Confinement:
        """What is really confined when running under ``policy``."""

    @abstractmethod
    def wrap(
        self,
        argv: Sequence[str],
        *,
        policy: SandboxPolicy,
        workdir: str,
        scratch_dir: str,
        runtime_paths: Sequence[str],
    ) -> list[str]:
        """Return the command line that runs ``argv`` confined by ``policy``.

        ``scratch_dir`` is a fresh directory of this execution (read-write); ``workdir`` is the working
        directory; ``runtime_paths`` are host paths the program's runtime needs to read (its interpreter
        or compiler installation).
        """
