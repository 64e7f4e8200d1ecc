"""The microVM pool: booted, never-reused VMs kept ready, so a session starts without a boot.

``MicroVMBackend(pool=N)`` (or a :class:`~adk_sandbox.executor.backends.microvm.config.MicroVMPoolConfig`)
keeps ``N`` sessions *started*: VM booted, the start-up checks run from inside (set-id probe, the guest's
kernel, no NIC, its limits), the command user's agent up. As Docker's warm pool
(``executor/backends/docker/pool.py``), and for the same reasons:

* **A workspace chosen ahead.** A VM's share is fixed at boot (the virtiofs device and its server are on
  QEMU's command line, the mount point on the kernel's), so every member boots sharing a fresh, empty
  directory of its own, ``D``, made by this process below the pool's directory (in
  :func:`~adk_sandbox.executor.workspace.copies.copies_dir`, named for the reaper by
  :func:`~adk_sandbox.executor.workspace.copies.copy_prefix`), mounted at the pool's ``path`` inside
  (``/workspace`` by default, the same for every member). ``D`` is owned by who owns what the VM writes
  (docs/MICROVM.md, "The workspace"): this process's user, or, when this process is root, the command
  user (never root: such a pool is refused). The pool's directory is ``0711`` so the jailed virtiofsd,
  running as that user, reaches ``D`` without listing its neighbours.
* **Acquire** pops the oldest ready member, checks that QEMU runs and that its agent answers a PING,
  else replaces it (:attr:`PoolStats.replaced`) and takes the next; with none ready it waits for a boot
  (at most ``acquire_timeout_seconds``; a failed boot is raised to a waiting caller). With ``copy_of``
  the source is copied into ``D`` on the host (:func:`~adk_sandbox.executor.workspace.copies.copy_tree`:
  only read, no link followed out of it, special files left out, capped) before the member is handed out;
  the guest sees it at once (the share has no cache). Each acquire starts a refill.
* **Never reused.** Closing a pooled session kills its VM and removes ``D``.
* **Tending.** A thread checks every second that each ready member's QEMU still runs and replaces the
  ones that died, so a member killed from outside is replaced before anyone asks for it.
* **Close** stops refills, kills the ready members and the ones still booting (not waited for), and
  removes the pool's directory: no QEMU, no virtiofsd, no run directory is left. A killed owner's VMs die
  with it (their lifelines), and the next ``MicroVMBackend()`` removes the run directories and the pool
  directory it left (``backend.reaped``).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from adk_sandbox.executor.backends.microvm._qemu import Share
from adk_sandbox.executor.backends.microvm._share import plan_share
from adk_sandbox.executor.backends.microvm.config import MicroVMConfig, MicroVMPoolConfig
from adk_sandbox.executor.errors import ExecutorError, PolicyNotEnforceableError, SandboxFailedError
from adk_sandbox.executor.workspace.copies import _Copier, copies_dir, copy_prefix, walk_copy

if TYPE_CHECKING:
    from adk_sandbox.executor.backends.microvm.backend import MicroVMSession

__all__ = ["MicroVMPool", "PoolStats"]

log = logging.getLogger(__name__)

#: How often the tending thread looks at the ready members' QEMU processes.
TEND_SECONDS = 1.0


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of a pool's counters."""

    ready: int
    """Members booted and waiting to be handed out."""
    booting: int
    """Members booting now."""
    created: int
    """Members made ready since the pool started."""
    served: int
    """Members handed out."""
    replaced: int
    """Members found dead or not answering, killed instead of handed out."""
    failed: int
    """Boots that failed."""


class MicroVMPool:
    """Booted sessions kept ready for one backend's config (see the module docstring).

    ``MicroVMBackend(pool=...)`` makes and owns one; ``make_session`` builds an unstarted session sharing a
    member's workspace (the backend's tracked session class).
    """

    def __init__(
        self,
        config: MicroVMConfig,
        settings: MicroVMPoolConfig,
        make_session: Callable[[Share], MicroVMSession],
    ) -> None:
        self.settings = settings
        """How this pool keeps its members."""
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
        self._cond = threading.Condition()
        self._ready: deque[MicroVMSession] = deque()
        self._booting: set[MicroVMSession] = set()
        self._creating = 0
        self._waiting = 0
        self._closed = False
        self._created = self._served = self._replaced = self._failed = 0
        self._failures: deque[Exception] = deque()
        self._stop = threading.Event()
        with self._cond:
            self._fill_locked()
        self._tender = threading.Thread(target=self._tend, name="adk-sandbox-vm-pool-tend", daemon=True)
        self._tender.start()
        atexit.register(self.close)  # a pool its owner forgot to close is drained at a normal exit

    def stats(self) -> PoolStats:
        """The pool's counters now."""
        with self._cond:
            return PoolStats(
                ready=len(self._ready),
                booting=self._creating,
                created=self._created,
                served=self._served,
                replaced=self._replaced,
                failed=self._failed,
            )

    def wait_ready(self, timeout: float = 300.0) -> bool:
        """Wait until ``size`` members are ready (True), or ``timeout`` passed or the pool closed (False)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self._ready) < self.settings.size:
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    return False
                self._cond.wait(left)
        return True

    # -- acquire -------------------------------------------------------------------------------------
    def acquire(self, copy_of: str | None = None) -> MicroVMSession:
        """A booted session no one used before; closing it kills its VM and removes its workspace.

        ``copy_of`` (an absolute host directory) is copied into the member's workspace first; when that
        fails the member is killed and the error raised. :class:`SandboxFailedError` when the pool is
        closed or no member was ready within ``acquire_timeout_seconds``; a failed boot's own error when
        one failed while this waited.
        """
        deadline = time.monotonic() + self.settings.acquire_timeout_seconds
        while True:
            member = self._take(deadline)
            healthy = member.ping(self.settings.ping_timeout_seconds)
            with self._cond:
                self._fill_locked()
            if not healthy:
                log.info("microVM pool member %s did not answer: replaced", member.session_id)
                self._discard([member])
                continue
            if copy_of is not None:
                workspace = member.workspace
                try:
                    if workspace is None:  # pragma: no cover - every member has one
                        raise SandboxFailedError("a microVM pool member has no workspace")
                    cap = self.settings.copy_size_mb * 1024 * 1024
                    # copy_tree's walk, with this pool's setting named when the source is too large
                    copier = walk_copy(
                        copy_of, str(workspace), cap, _Copier, "MicroVMPoolConfig(copy_size_mb=...)"
                    )
                    for reason in copier.skipped:
                        log.warning("copying %s into %s left out %s", copy_of, workspace, reason)
                except BaseException:
                    _close_quietly(member)  # the copy went into its workspace: never handed out again
                    raise
            with self._cond:
                self._served += 1
            return member

    def _take(self, deadline: float) -> MicroVMSession:
        with self._cond:
            self._waiting += 1
            try:
                while True:
                    if self._closed:
                        raise SandboxFailedError(
                            "this MicroVMBackend is closed: its pool hands out no more sessions"
                        )
                    if self._ready:
                        return self._ready.popleft()
                    if self._failures:
                        raise self._failures.popleft()
                    self._fill_locked()
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise SandboxFailedError(
                            f"no booted microVM was ready within {self.settings.acquire_timeout_seconds:g} s "
                            f"({self._creating} booting, at most {self.settings.boot_concurrency} at once): "
                            "the machine is slow or overloaded; nothing ran. Retry, or raise "
                            "MicroVMPoolConfig(acquire_timeout_seconds=...)"
                        )
                    self._cond.wait(left)
            finally:
                self._waiting -= 1

    def _discard(self, members: list[MicroVMSession]) -> None:
        if not members:
            return
        with self._cond:
            self._replaced += len(members)
            self._fill_locked()
        for member in members:
            _close_quietly(member)

    # -- refill --------------------------------------------------------------------------------------
    def _fill_locked(self) -> None:
        """Start boots until ready + booting covers the size and the waiting acquirers (lock held)."""
        want = self.settings.size + self._waiting
        while (
            not self._closed
            and self._creating < self.settings.boot_concurrency
            and len(self._ready) + self._creating < want
        ):
            self._creating += 1
            threading.Thread(target=self._create_one, name="adk-sandbox-vm-pool-boot", daemon=True).start()

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

    def _create_one(self) -> None:
        session: MicroVMSession | None = None
        try:
            session = self._new_member()
            with self._cond:
                if self._closed:
                    raise SandboxFailedError("the pool closed")
                self._booting.add(session)
            session.start()
        except Exception as exc:
            if session is not None:
                _close_quietly(session)
            with self._cond:
                if session is not None:
                    self._booting.discard(session)
                self._creating -= 1
                if not self._closed:
                    log.warning("the microVM pool could not boot a VM: %s", exc)
                    self._failed += 1
                    if len(self._failures) < self._waiting:  # one per waiting acquirer; none: retried later
                        self._failures.append(exc)
                self._cond.notify_all()
            return
        with self._cond:
            self._booting.discard(session)
            self._creating -= 1
            if not self._closed:
                self._ready.append(session)
                self._created += 1
                self._failures.clear()
                self._fill_locked()
                self._cond.notify_all()
                return
            self._cond.notify_all()
        _close_quietly(session)  # booted after the pool closed

    def _tend(self) -> None:
        """Replace ready members whose QEMU is gone, until the pool closes."""
        while not self._stop.wait(TEND_SECONDS):
            with self._cond:
                dead = [member for member in self._ready if not member.alive()]
                for member in dead:
                    self._ready.remove(member)
            if dead:
                log.info("microVM pool: %d ready member(s) stopped; replaced", len(dead))
            self._discard(dead)

    # -- close ---------------------------------------------------------------------------------------
    def close(self, timeout: float = 60.0) -> None:
        """Stop refilling; kill every VM of the pool (ready and booting), remove its directory. Idempotent.

        Sessions already handed out are their owner's (``MicroVMBackend.close`` closes them first).
        """
        atexit.unregister(self.close)
        with self._cond:
            self._closed = True
            members = [*self._ready, *self._booting]
            self._ready.clear()
            self._cond.notify_all()
        self._stop.set()
        for member in members:
            _close_quietly(member)  # a booting VM is killed, its boot fails at once
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._creating and time.monotonic() < deadline:
                self._cond.wait(max(deadline - time.monotonic(), 0.001))
        with contextlib.suppress(FileNotFoundError):
            try:
                os.rmdir(self.root)  # empty once every member closed (each removes its directory)
            except OSError:
                log.warning("microVM pool directory %s left: sessions with workspaces in it are open",
                            self.root)  # fmt: skip


def _close_quietly(session: MicroVMSession) -> None:
    try:
        session.close()
    except ExecutorError as exc:
        log.warning("closing a microVM pool session failed: %s", exc)
