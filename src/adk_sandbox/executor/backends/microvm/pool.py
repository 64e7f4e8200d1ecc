"""The microVM pool: booted, never-reused VMs kept ready, so a session starts without a boot.

:class:`MicroVMPool` (over :class:`~adk_sandbox.executor.pool.WarmPool`) serves ``MicroVMBackend(pool=N)``:
each member boots sharing a fresh, empty directory of its own at the pool's ``path`` inside, which
``session(copy_of=X)`` fills on the host. Depth: docs/MICROVM.md, "The pool of booted VMs".
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from adk_sandbox.executor.backends.microvm._qemu import Share
from adk_sandbox.executor.backends.microvm._share import plan_share
from adk_sandbox.executor.backends.microvm.config import MicroVMConfig, MicroVMPoolConfig
from adk_sandbox.executor.errors import PolicyNotEnforceableError, SandboxFailedError
from adk_sandbox.executor.pool import PoolStats, WarmPool
from adk_sandbox.executor.workspace.copies import _Copier, copies_dir, copy_prefix, walk_copy

if TYPE_CHECKING:
    from adk_sandbox.executor.backends.microvm.backend import MicroVMSession

__all__ = ["MicroVMPool", "PoolStats"]

log = logging.getLogger(__name__)

#: How often the tending thread looks at the ready members' QEMU processes.
TEND_SECONDS = 1.0


class MicroVMPool(WarmPool["MicroVMSession", MicroVMPoolConfig]):
    """Booted sessions kept ready for one backend's config (see the module docstring).

    ``MicroVMBackend(pool=...)`` makes and owns one; ``make_session`` builds an unstarted session sharing a
    member's workspace (the backend's tracked session class). The lifecycle is
    :class:`~adk_sandbox.executor.pool.WarmPool`'s (``stats().booting`` is its ``creating``).
    """

    noun = "microVM pool member"
    threads = "adk-sandbox-vm-pool"
    closed_message = "this MicroVMBackend is closed: its pool hands out no more sessions"
    timeout_message = (
        "no booted microVM was ready within {timeout:g} s ({creating} booting, at most {limit} at once): "
        "the machine is slow or overloaded; nothing ran. Retry, or raise "
        "MicroVMPoolConfig(acquire_timeout_seconds=...)"
    )
    kill_starting = True
    close_seconds = 60.0
    ready_seconds = 300.0

    def __init__(
        self,
        config: MicroVMConfig,
        settings: MicroVMPoolConfig,
        make_session: Callable[[Share], MicroVMSession],
    ) -> None:
        self._config = config
        self._make_session = make_session
        uid, _, gid = config.user.partition(":")
        self._owner = (os.geteuid(), os.getegid()) if os.geteuid() != 0 else (int(uid), int(gid))
        if 0 in self._owner:
            raise PolicyNotEnforceableError(
                f"a microVM pool's workspaces are owned by the command user when this process is root, and "
                f"MicroVMConfig(user={config.user!r}) is root: the VMs would make root-owned files on the "
                "host. Use a non-root user"
            )
        self.root = Path(tempfile.mkdtemp(prefix=copy_prefix("pool"), dir=copies_dir()))
        """The host directory holding the members' workspaces (one directory each)."""
        self.root.chmod(0o711)  # the members' virtiofsd (their owner's uid) passes through, lists nothing
        super().__init__(settings, concurrency=settings.boot_concurrency, tend_seconds=TEND_SECONDS)

    def acquire(self, copy_of: str | None = None) -> MicroVMSession:
        """A booted session no one used before; closing it kills its VM and removes its workspace.

        ``copy_of`` (an absolute host directory) is copied into the member's workspace first; when that
        fails the member is killed and the error raised. :class:`SandboxFailedError` when the pool is
        closed or no member was ready within ``acquire_timeout_seconds``; a failed boot's own error when
        one failed while this waited.
        """
        if copy_of is None:
            return self._acquire()
        source = copy_of

        def copy(member: MicroVMSession) -> None:
            workspace = member.workspace
            if workspace is None:  # pragma: no cover - every member has one
                raise SandboxFailedError("a microVM pool member has no workspace")
            cap = self.settings.copy_size_mb * 1024 * 1024
            # copy_tree's walk, with this pool's setting named when the source is too large
            copier = walk_copy(source, str(workspace), cap, _Copier, "MicroVMPoolConfig(copy_size_mb=...)")
            for reason in copier.skipped:
                log.warning("copying %s into %s left out %s", source, workspace, reason)

        return self._acquire(copy)

    def _new_member(self) -> MicroVMSession:
        """An unstarted session sharing a fresh directory of its own at the pool's path."""
        workspace = tempfile.mkdtemp(prefix="vm-", dir=self.root)
        try:
            if os.geteuid() == 0:
                os.chown(workspace, *self._owner)
            share = plan_share(workspace, self._config.user, guest_path=self.settings.path)
            return self._make_session(share)
        except BaseException:
            shutil.rmtree(workspace, ignore_errors=True)
            raise

    def _tended(self, member: MicroVMSession) -> bool:
        return member.alive()  # QEMU still runs (no round trip into the guest)
