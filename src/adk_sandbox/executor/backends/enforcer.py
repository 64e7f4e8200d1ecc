"""The interface of an OS-level enforcer that wraps host processes (bubblewrap on Linux)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from adk_sandbox.executor.errors import PolicyNotEnforceableError
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

    def check_network_policy(self, policy: SandboxPolicy) -> None:
        """Raise ``PolicyNotEnforceableError`` unless this enforcer can carry a ``NetworkPolicy``.

        Carrying one means no route out (only the sandbox's own loopback) and a host directory bound
        read-only for the proxy's socket (:meth:`wrap`'s ``egress_dir``). An enforcer that cannot keeps
        this default: the policy is refused, never weakened to a route out or to no network at all.
        """
        del policy
        raise PolicyNotEnforceableError(
            f"the {self.name} enforcer cannot carry a NetworkPolicy (no route out, a proxy socket bound in); "
            "it is refused. Use the bubblewrap enforcer (get_enforcer()) or a DockerBackend"
        )

    @abstractmethod
    def wrap(
        self,
        argv: Sequence[str],
        *,
        policy: SandboxPolicy,
        workdir: str,
        scratch_dir: str,
        runtime_paths: Sequence[str],
        egress_dir: str | None = None,
    ) -> list[str]:
        """Return the command line that runs ``argv`` confined by ``policy``.

        ``scratch_dir`` is a fresh directory of this execution (read-write); ``workdir`` is the working
        directory; ``runtime_paths`` are host paths the program's runtime needs to read (its interpreter
        or compiler installation). ``egress_dir`` (only after :meth:`check_network_policy` passed) is the
        host directory of a network policy's socket and forwarder, shown read-only at the same path, with
        no route out.
        """
