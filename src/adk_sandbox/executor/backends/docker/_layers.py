"""Forks by layer: a pool member's state directories are mount points the host mounts a fork's overlays on.

Serves ``PoolConfig(forkable=True, fork_by="layer")``: per state directory a shared bind of a host directory
below :data:`RUN_ROOT` with a base tmpfs, a fork's overlay mounted on it and checked in the init's
``mountinfo``; :func:`check_supported` and :func:`reap_layers`. Depth: docs/snapshots.md, "Forks by layer".
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import re
import secrets
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adk_sandbox.executor import _owner
from adk_sandbox.executor._mountinfo import read_mountinfo, top_mounts
from adk_sandbox.executor.backends.docker._spec import GVISOR_RUNTIME
from adk_sandbox.executor.errors import PolicyNotEnforceableError, SandboxFailedError
from adk_sandbox.executor.workspace.copies import _boot_tag

if TYPE_CHECKING:
    from adk_sandbox.executor.snapshots.model import Snapshot

__all__ = [
    "RUN_ROOT",
    "MemberLayers",
    "check_supported",
    "reap_layers",
]

log = logging.getLogger(__name__)

#: Where members' mount points live: root's, mode 0700 (not below /dev/shm: nothing of it is the sandbox's).
RUN_ROOT = "/run/adk-sandbox-layers"

_MS_RDONLY, _MS_NOSUID, _MS_NODEV = 1, 2, 4
_MS_BIND, _MS_PRIVATE, _MS_SHARED = 4096, 1 << 18, 1 << 20
_MNT_DETACH = 2
#: A member directory's name: its owner (boot, pid namespace, pid, start time), then random.
_MEMBER_NAME = re.compile(r"member-([0-9a-f]{8})-(\d+)-(\d+)-(\d+)-[0-9a-f]+")
#: Characters an overlay's option string cannot carry in a path.
_UNSAFE_IN_OPTIONS = re.compile(r"[,:\\\s=]")

_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc  # noqa: PLW0603 - loaded once
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    """``mount(2)``; ``OSError`` with the kernel's errno."""
    result = _lib().mount(
        source.encode(),
        target.encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount {fstype or 'bind'} on {target}: {os.strerror(code)}")


def _umount(target: str) -> bool:
    """Detach the top mount at ``target`` (lazily: a busy one goes once unused); False when none was there."""
    if _lib().umount2(target.encode(), ctypes.c_int(_MNT_DETACH)) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOENT):  # not a mount point (any more), or gone
        return False
    raise OSError(code, f"umount {target}: {os.strerror(code)}")


def check_supported(*, local: bool, runtime: str | None) -> None:
    """Refuse (``PolicyNotEnforceableError``) a layered pool this host cannot give its protections.

    Root on a local engine's machine (the mounts are the host's), overlayfs, and runc: whether gVisor's
    gofer sees mounts made after its start is not tested, so it is refused rather than assumed.
    """
    problems = []
    if os.geteuid() != 0:
        problems.append("this process is not root (the fork's mounts are made on the host)")
    if not local:
        problems.append("the engine is not on this machine (its containers cannot see this host's mounts)")
    if runtime == GVISOR_RUNTIME:
        problems.append("the runtime is gVisor (whether it sees mounts made after its start is untested)")
    try:
        with open("/proc/filesystems", encoding="utf-8") as handle:
            overlay = any(line.split()[-1:] == ["overlay"] for line in handle)
    except OSError:
        overlay = False
    if not overlay:
        problems.append("the kernel has no overlay filesystem")
    if problems:
        raise PolicyNotEnforceableError(
            "PoolConfig(fork_by='layer') mounts each fork's layers on the host and into its running "
            f"container, which needs root on a local engine, overlayfs and runc: {'; '.join(problems)}. "
            "Nothing was started; use fork_by='copy'"
        )


def _member_dir() -> str:
    """A fresh 0700 directory below :data:`RUN_ROOT` whose name says who owns it."""
    os.makedirs(RUN_ROOT, mode=0o700, exist_ok=True)
    info = os.lstat(RUN_ROOT)
    if not os.path.isdir(RUN_ROOT) or os.path.islink(RUN_ROOT) or info.st_uid != 0 or info.st_mode & 0o077:
        raise PolicyNotEnforceableError(
            f"{RUN_ROOT} is not a directory of root's with mode 0700; the forks' mount points cannot go "
            "there. Remove it (it is remade) or use fork_by='copy'"
        )
    pid = os.getpid()
    owner = f"{_boot_tag()}-{_owner.pid_namespace()}-{pid}-{_owner.start_time(pid)}"
    path = os.path.join(RUN_ROOT, f"member-{owner}-{secrets.token_hex(6)}")
    os.mkdir(path, 0o700)
    return path


@dataclass
class MemberLayers:
    """One pool member's propagating mount points, and the fork's layers mounted on them (if any)."""

    root: str
    """The member's run directory (0700)."""
    workspace: str
    """The workspace's path inside (the pool's ``path``)."""
    sizes: dict[str, int]
    """Each state directory (path inside) -> its cap in MiB."""
    owner: tuple[int, int]
    """The command user (uid, gid): owns the roots of the directories, as a tmpfs volume's are today."""
    points: dict[str, str] = field(default_factory=dict)
    """Path inside -> ``D``, its host mount point (bound into the container)."""
    forked: bool = False

    @classmethod
    def create(cls, workspace: str, sizes: dict[str, int], owner: tuple[int, int]) -> MemberLayers:
        """Make the mount points, each a shared bind of itself with its base tmpfs on it (none on failure)."""
        layers = cls(_member_dir(), workspace, dict(sizes), owner)
        try:
            for index, path in enumerate(sizes):
                point = os.path.join(layers.root, f"d{index}")
                os.mkdir(point, 0o700)
                layers.points[path] = point
                _mount(point, point, None, _MS_BIND)
                # Private first: a bind made under a shared parent (/run on a systemd host) joins the parent's
                # peer group, and every mount on D would then appear wherever /run is shared. Then shared
                # again, in a peer group of its own, which the container's rslave bind follows.
                _mount("none", point, None, _MS_PRIVATE)
                _mount("none", point, None, _MS_SHARED)
                _mount("adk-sandbox-base", point, "tmpfs", _MS_NOSUID | _MS_NODEV, layers._tmpfs_data(path))
        except BaseException:
            layers.release()
            raise
        return layers

    def _mode(self, path: str) -> int:
        return 0o755 if path == self.workspace else 0o1777

    def _tmpfs_data(self, path: str) -> str:
        uid, gid = self.owner
        return f"size={self.sizes[path]}m,mode={self._mode(path):o},uid={uid},gid={gid}"

    @property
    def binds(self) -> tuple[tuple[str, str], ...]:
        """(host mount point, path inside) of each directory, for the container's rslave binds."""
        return tuple((point, path) for path, point in self.points.items())

    @property
    def state_dirs(self) -> dict[str, str]:
        """The host directories of ``/tmp``, HOME and the extra tmpfs (the workspace's is the session's)."""
        return {path: point for path, point in self.points.items() if path != self.workspace}

    def check(self, inspect: Mapping[str, Any]) -> None:
        """Refuse unless the container (``inspect``: its init's pid, its mounts) sees each directory as here.

        Its binds must be ``rslave`` (else a fork's mount would not reach it), and each directory's top
        mount in its mountinfo the overlay (forked) or the base tmpfs of the right size (not yet).
        """
        problems = []
        pid = int(inspect["State"]["Pid"])
        mounts = inspect.get("Mounts") or []
        propagation = {str(m.get("Source")): str(m.get("Propagation") or "") for m in mounts}
        for point in self.points.values():
            if propagation.get(point) != "rslave":
                problems.append(f"{point} is not bound with bind-propagation=rslave")
        try:
            tops = top_mounts(read_mountinfo(pid))
        except OSError as exc:
            raise SandboxFailedError(f"could not read the sandbox's mounts ({exc.strerror})") from exc
        for path in self.points:
            top = tops.get(path)
            fstype, options, supers = (
                (top.fstype, top.options, top.super_options) if top else ("", frozenset(), ())
            )
            want = "overlay" if self.forked else "tmpfs"
            if fstype != want:
                problems.append(f"{path} is a {fstype or 'missing'} mount inside, not the {want} made here")
            elif not {"nosuid", "nodev"} <= options:
                problems.append(f"{path} is not mounted nosuid,nodev inside")
            elif want == "tmpfs" and f"size={self.sizes[path] * 1024}k" not in supers:
                problems.append(f"{path} is not the {self.sizes[path]} MiB tmpfs mounted here")
        if problems:
            raise PolicyNotEnforceableError(
                "the sandbox does not see its layered directories as mounted on the host: "
                + "; ".join(problems)
                + ". Refused, nothing of the fork is left mounted; use fork_by='copy'"
            )

    def fork(self, snapshot: Snapshot, inspect: Mapping[str, Any]) -> None:
        """Mount the snapshot's copies as the lower layers of this member's directories, then check them.

        Per directory: a tmpfs of its cap (``nosuid,nodev``) holding ``upper/`` (the root's mode and owner
        as today) and ``work/``, then the overlay (``nosuid,nodev``) on ``D``. Refused (nothing left
        mounted) when the running container does not show them (:meth:`check`).
        """
        lowers = {path: snapshot.tree(index) for index, path in enumerate(snapshot.tmpfs)}
        lowers[self.workspace] = snapshot.workspace_dir
        if set(lowers) != set(self.points):
            raise SandboxFailedError(f"snapshot {snapshot.id} holds other directories than this member's")
        try:
            self.forked = True
            for index, (path, point) in enumerate(self.points.items()):
                lower = lowers[path]
                if _UNSAFE_IN_OPTIONS.search(lower) or not os.path.isdir(lower):
                    raise SandboxFailedError(f"snapshot {snapshot.id}'s copy of {path} cannot be a layer")
                holder = os.path.join(self.root, f"u{index}")
                os.mkdir(holder, 0o700)
                cap = f"size={self.sizes[path]}m,mode=0700"
                _mount("adk-sandbox-upper", holder, "tmpfs", _MS_NOSUID | _MS_NODEV, cap)
                upper, work = os.path.join(holder, "upper"), os.path.join(holder, "work")
                os.mkdir(upper)
                os.mkdir(work, 0o700)
                os.chown(upper, *self.owner)
                os.chmod(upper, self._mode(path))
                data = f"lowerdir={lower},upperdir={upper},workdir={work}"
                _mount("adk-sandbox-fork", point, "overlay", _MS_NOSUID | _MS_NODEV, data)
            self.check(inspect)
        except BaseException:
            self.unfork()
            raise

    def unfork(self) -> None:
        """Unmount the fork's overlays and their tmpfs (lazily when busy); the base tmpfs stays."""
        if not self.forked:
            return
        self.forked = False
        for index, point in enumerate(self.points.values()):
            holder = os.path.join(self.root, f"u{index}")
            if not os.path.isdir(holder):
                continue
            _unmount_all(point, keep=2)  # the overlay (keep the base tmpfs and the bind)
            with contextlib.suppress(OSError):
                _umount(holder)
                os.rmdir(holder)

    def release(self) -> None:
        """Unmount everything of the member and remove its run directory (idempotent)."""
        with contextlib.suppress(OSError):
            self.unfork()
        _release_dir(self.root)


def _unmount_all(point: str, keep: int = 0) -> None:
    """Unmount the mounts stacked at ``point`` (top first) until ``keep`` of them are left."""
    try:
        stack = [m for m in read_mountinfo() if m.point == point]
    except OSError:
        stack = []
    for _ in range(max(len(stack) - keep, 0)):
        if not _umount(point):
            break


def _release_dir(root: str) -> None:
    """Detach every mount at or below ``root`` (deepest and newest first), then remove the directory."""
    try:
        points = [m.point for m in read_mountinfo()]
    except OSError:
        points = []
    below = [p for p in points if p == root or p.startswith(root + "/")]
    for point in sorted(below, key=lambda p: (p.count("/"), below.index(p)), reverse=True):
        try:
            _umount(point)
        except OSError as exc:
            log.warning("could not unmount %s: %s", point, exc)
    shutil.rmtree(root, ignore_errors=True)
    if os.path.lexists(root):
        log.warning("the layered member directory %s could not be removed", root)


def reap_layers(root: str = RUN_ROOT) -> list[str]:
    """Unmount and remove the run directories of members whose owner is gone; the paths removed.

    Same rule as :func:`~adk_sandbox.executor.workspace.copies.reap_copies`: made in this boot and pid
    namespace by a process that no longer runs (its pid gone or started at another time), or in an earlier
    boot. Only root makes (and reaps) them.
    """
    if os.geteuid() != 0:
        return []
    try:
        names = os.listdir(root)
    except OSError:
        return []
    boot, namespace = _boot_tag(), str(_owner.pid_namespace())
    removed = []
    for name in names:
        match = _MEMBER_NAME.fullmatch(name)
        if match is None:
            continue
        owner_boot, owner_ns, pid, start = match.groups()
        if owner_boot == boot and (owner_ns != namespace or _owner.start_time(int(pid)) == start):
            continue
        path = os.path.join(root, name)
        _release_dir(path)
        removed.append(path)
    return removed
