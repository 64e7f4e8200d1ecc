"""Workspace copies on the host (``session(copy_of=...)``): where they are made, how, and reaping them.

:func:`copy_tree` fills a fresh directory with what the mirror's push would send of a tree, by descriptor
on both sides (docs/DOCKER.md, "Warm pool"); :func:`copies_dir` says where (``/dev/shm`` when it is a
tmpfs). A copies directory's name says who made it (:func:`copy_prefix`, the owner as
:mod:`adk_sandbox.executor._owner` tells it), so :func:`reap_copies` removes the ones a killed owner left
and nothing else.
"""

from __future__ import annotations

import errno
import logging
import os
import posixpath
import re
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Literal, TypeVar

from adk_sandbox.executor import _owner
from adk_sandbox.executor.errors import PolicyNotEnforceableError
from adk_sandbox.executor.workspace.beneath import RootDir
from adk_sandbox.executor.workspace.pullback import _HostTree, _Refused
from adk_sandbox.executor.workspace.scan import Entry, check_fits, data_extents, scan_host

__all__ = ["NO_SPACE", "HostCopyFullError", "copies_dir", "copy_prefix", "copy_tree", "reap_copies"]

log = logging.getLogger(__name__)


#: What a write answers when its file system (or the user's quota there) is full.
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


class HostCopyFullError(PolicyNotEnforceableError):
    """A host copy ran out of space in its destination's file system (``ENOSPC``, ``EDQUOT``).

    Never a silent gap: a copy whose destination is full is refused, not continued without the files that
    did not fit. A :class:`PolicyNotEnforceableError`, so callers need nothing new; the snapshot store
    tells it apart to retry a snapshot on its disk tier (docs/snapshots.md, "Lifecycle").
    """


def copies_dir() -> str:
    """Where workspace copies (``session(copy_of=...)``) are made: ``/dev/shm`` when it is a writable tmpfs.

    Creating files dominates a copy, and costs a disk filesystem's journal far more than memory (measured
    here: 2,000 files of 8 KiB, 2.2 s on ext4 against 0.05 s on tmpfs); else the temporary directory.
    """
    try:
        with open("/proc/self/mounts", encoding="utf-8") as mounts:
            shm = any(line.split()[1:3] == ["/dev/shm", "tmpfs"] for line in mounts)
    except OSError:
        shm = False
    if shm and os.access("/dev/shm", os.W_OK | os.X_OK):
        return "/dev/shm"
    return tempfile.gettempdir()


#: A copies directory's name: kind, then its owner (boot id, pid namespace, pid, start time), then random.
_COPY_NAME = re.compile(r"adk-sandbox-(?:pool|copy)-([0-9a-f]{8})-(\d+)-(\d+)-(\d+)-[^/]*")


def copy_prefix(kind: Literal["pool", "copy"]) -> str:
    """The ``mkdtemp`` prefix of a copies directory this process makes: it names the owner, for the reaper.

    The owner is told as the container labels tell it (:mod:`adk_sandbox.executor._owner`): boot, pid
    namespace, pid and the process's start time, so :func:`reap_copies` removes what a killed owner left and
    nothing else.
    """
    return f"adk-sandbox-{kind}-{owner_tag()}-"


def owner_tag() -> str:
    """The owner part of the names of what this process leaves on disk: boot, pid namespace, pid, start."""
    pid = os.getpid()
    return f"{_boot_tag()}-{_owner.pid_namespace()}-{pid}-{_owner.start_time(pid)}"


def reap_copies(directory: str | None = None) -> list[str]:
    """Remove the copies directories (in ``directory``, default :func:`copies_dir`) of owners now gone.

    Named by :func:`copy_prefix` (see :func:`remove_leftovers`). ``DockerBackend()`` calls this as it reaps
    leaked containers: a killed owner's copies live in memory (``/dev/shm``). Returns the paths removed.
    """
    return remove_leftovers(directory or copies_dir(), _COPY_NAME)


def _remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)  # descriptor-based: a link inside is removed, not followed


def remove_leftovers(
    where: str, name: re.Pattern[str], remove: Callable[[str], None] = _remove_tree
) -> list[str]:
    """Remove the directories in ``where`` named by ``name`` whose owner is gone; the paths removed.

    ``name``'s groups 1-4 are its owner (:func:`owner_tag`). Gone: made in an earlier boot, or in this boot
    and pid namespace by a process that no longer runs (its pid gone or started at another time). Only
    directories of this process's user (``where`` is shared: anyone may make a name like it); each is
    removed by ``remove`` (default: the tree, links inside removed, not followed).
    """
    boot, namespace = _boot_tag(), str(_owner.pid_namespace())
    removed: list[str] = []
    try:
        entries = os.listdir(where)
    except OSError:
        return removed
    for entry in entries:
        match = name.fullmatch(entry)
        if match is None:
            continue
        owner_boot, owner_ns, pid, start = match.group(1, 2, 3, 4)
        if owner_boot == boot and (owner_ns != namespace or _owner.start_time(int(pid)) == start):
            continue  # its owner runs (or is one this process cannot see)
        path = os.path.join(where, entry)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            continue  # not one of ours
        remove(path)
        removed.append(path)
    return removed


def _boot_tag() -> str:
    return (
        _owner.boot_id().replace("-", "")[:8].ljust(8, "0")
        if re.fullmatch(r"[0-9a-f-]{8,}", _owner.boot_id())
        else "0" * 8
    )


def copy_tree(source: str, dest: str, cap_bytes: int) -> list[str]:
    """Copy the host tree ``source`` into the empty host directory ``dest``; what was left out, and why.

    Copies what the mirror's push would send (:func:`scan_host`; special files left out; refused beyond
    ``cap_bytes`` as :func:`check_fits` says). ``source`` is only read: every file and directory is opened by
    descriptor with ``O_NOFOLLOW`` on both sides, and links are made last, kept only when they resolve inside
    ``dest`` and out of any ``.git``. Modes and mtimes are kept; as root the copy is owned by ``dest``'s
    owner. Depth: docs/docker/pool.md, "Copies from the pool".
    """
    copier = walk_copy(source, dest, cap_bytes, _Copier)
    for reason in copier.skipped:
        log.warning("copying %s into %s left out %s", source, dest, reason)
    return copier.skipped


CopierT = TypeVar("CopierT", bound="_Copier")


def walk_copy(
    source: str,
    dest: str,
    cap_bytes: int,
    make: Callable[[dict[str, Entry], tuple[int, int], int], CopierT],
    setting: str | None = None,
    *,
    twin: str | None = None,
) -> CopierT:
    """:func:`copy_tree`'s walk with the copier ``make`` builds (how file data travels); the copier after.

    The one place the safety of a host copy lives (scan, cap, descriptor walk, links made last and checked
    again); a snapshot's copy (``executor/snapshots/copy.py``) differs only in its copier. ``setting`` names
    what raises the cap in a refusal (default: the mirror's). ``copier.skipped`` says what was left out.

    ``twin``, another empty directory of this process: the same copy made there too by the same walk
    (each file of ``source`` opened and read once, written into both; each copy owned by its own root's
    owner), so both hold the same tree; ``skipped`` is the same for both.
    """
    host = scan_host(source)
    if setting is None:
        check_fits(source, host, cap_bytes)
    else:
        check_fits(source, host, cap_bytes, setting)
    info = os.stat(dest)
    copier = make(host, (info.st_uid, info.st_gid), cap_bytes)
    if setting is not None:
        copier.setting = setting
    if twin is not None:
        twin_info = os.stat(twin)
        copier.twin_owner = (twin_info.st_uid, twin_info.st_gid)
    try:
        _walk(source, dest, host, copier, twin)
    except OSError as exc:
        if exc.errno not in NO_SPACE:
            raise
        raise HostCopyFullError(
            f"copying {source} into {dest if twin is None else dest + ' and ' + twin} ran out of space "
            f"there ({exc.strerror}); the copy was refused, not kept without the files that did not fit. "
            "Free space in that file system"
        ) from exc
    return copier


def _walk(source: str, dest: str, host: dict[str, Entry], copier: _Copier, twin: str | None = None) -> None:
    """The descriptor walk of :func:`walk_copy`, then the links (an ``ENOSPC`` is raised, never skipped)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    src = os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        dst = os.open(dest, flags)
        try:
            twin_fd = os.open(twin, flags) if twin is not None else None
            try:
                if twin_fd is not None:
                    copier.twins[dst] = twin_fd
                copier.directory("", src, dst)
            finally:
                copier.twins.pop(dst, None)
                if twin_fd is not None:
                    os.close(twin_fd)
        finally:
            os.close(dst)
    finally:
        os.close(src)
    links = sorted(path for path, entry in host.items() if entry.kind == "l" and path in copier.reached)
    for root in (dest,) if twin is None else (dest, twin):
        _make_links(root, host, links, copier.skipped if root == dest else [])


def _make_links(dest: str, host: dict[str, Entry], links: list[str], skipped: list[str]) -> None:
    """Make the scan's ``links`` in the copy ``dest``, kept only where they stay inside (notes: ``skipped``).

    A twin copy gets the same links by the same rules: its notes would repeat the first copy's.
    """
    info = os.stat(dest)
    tree_dir = RootDir(dest)
    try:
        tree = _HostTree(tree_dir, (info.st_uid, info.st_gid))
        made = []
        for path in links:
            try:
                tree.make_link(path, host[path].target)
                made.append(path)
            except (_Refused, OSError) as exc:
                if isinstance(exc, OSError) and exc.errno in NO_SPACE:
                    raise
                skipped.append(f"{path}: {exc}")
        for path in made:  # a link made later can change where an earlier one leads
            if not tree.link_stays_inside(path):
                tree.remove(path)
                skipped.append(f"{path}: a symbolic link that leads outside the workspace (or into .git)")
    finally:
        tree_dir.close()


@dataclass
class _Copier:
    """The descriptor walk of :func:`copy_tree` over one scan (directories and files; links after)."""

    host: dict[str, Entry]
    owner: tuple[int, int]
    budget: int
    skipped: list[str] = field(default_factory=list)
    reached: set[str] = field(default_factory=set)
    """Paths whose directory was copied (a link is made only there)."""
    _as_root: bool = field(default_factory=lambda: os.geteuid() == 0)
    _children: dict[str, list[str]] = field(default_factory=dict)
    twin_owner: tuple[int, int] = (0, 0)
    """The owner of the twin copy's root (:func:`walk_copy`'s ``twin``)."""
    twins: dict[int, int] = field(default_factory=dict)
    """A directory's descriptor in the first copy -> the same directory's in the twin copy (when one)."""
    setting: str = "DockerBackend(mirror_size_mb=...)"
    """What raises the cap, named when the files grow past it while they are copied (``walk_copy``'s)."""
    #: Said when a file grew past the cap while it was copied (``{path}``, ``{setting}``).
    _GREW: ClassVar[str] = (
        "the files of the workspace grew past the cap of its copy while it was copied ({path}); nothing "
        "ran. Create the backend with a larger {setting}"
    )

    def __post_init__(self) -> None:
        for path in sorted(self.host):
            self._children.setdefault(posixpath.dirname(path), []).append(path)

    def directory(self, rel: str, src: int, dst: int) -> None:
        """Copy what the scan found below ``rel`` (open on both sides), then give ``dst`` its mode."""
        for path in self._children.get(rel, []):
            self.reached.add(path)
            entry, name = self.host[path], posixpath.basename(path)
            try:
                if entry.kind == "d":
                    self._subdirectory(path, name, src, dst)
                elif entry.kind == "f":
                    self._file(path, name, entry, src, dst)
            except OSError as exc:
                if exc.errno in NO_SPACE:
                    raise  # the destination is full: the whole copy is refused, never left with gaps
                self.skipped.append(f"{path}: {exc.strerror or exc}")
        if rel:
            os.fchmod(dst, self.host[rel].mode & 0o777)
            twin = self.twins.get(dst)
            if twin is not None:
                os.fchmod(twin, self.host[rel].mode & 0o777)

    def _subdirectory(self, path: str, name: str, src: int, dst: int) -> None:
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        sub_src = os.open(name, flags, dir_fd=src)
        try:
            os.mkdir(name, 0o700, dir_fd=dst)
            sub_dst = os.open(name, flags, dir_fd=dst)
            twin = self.twins.get(dst)
            sub_twin = None
            try:
                if self._as_root:
                    os.fchown(sub_dst, *self.owner)
                if twin is not None:
                    os.mkdir(name, 0o700, dir_fd=twin)
                    sub_twin = os.open(name, flags, dir_fd=twin)
                    self.twins[sub_dst] = sub_twin
                    if self._as_root:
                        os.fchown(sub_twin, *self.twin_owner)
                self.directory(path, sub_src, sub_dst)
            finally:
                self.twins.pop(sub_dst, None)
                if sub_twin is not None:
                    os.close(sub_twin)
                os.close(sub_dst)
        finally:
            os.close(sub_src)

    def _twin_file(self, name: str, entry: Entry, fd_in: int, size: int, dst: int) -> None:
        """Write the first ``size`` bytes of ``fd_in`` (what the first copy got) into the twin copy, if any.

        Read from offset 0 whatever ``fd_in``'s position: the file is opened once for both copies, and a
        file that grew meanwhile gets the same length in both. Holes stay holes (:func:`_copy_range`).
        """
        twin = self.twins.get(dst)
        if twin is None:
            return
        out_flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd_out = os.open(name, out_flags, 0o600, dir_fd=twin)
        try:
            _copy_range(fd_in, fd_out, size)
            self._settle(fd_out, self.twin_owner, entry)
        finally:
            os.close(fd_out)

    def _settle(self, fd_out: int, owner: tuple[int, int], entry: Entry) -> None:
        """Give a copied file its owner (as root), its mode without set-id bits and its modification time."""
        if self._as_root:
            os.fchown(fd_out, *owner)
        os.fchmod(fd_out, entry.mode & 0o777)  # after fchown, and never a set-id bit
        os.utime(fd_out, ns=(entry.mtime_ns, entry.mtime_ns))

    def _file(self, path: str, name: str, entry: Entry, src: int, dst: int) -> None:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd_in = os.open(name, flags, dir_fd=src)  # NONBLOCK: a FIFO swapped in does not hang the copy
        try:
            info = os.fstat(fd_in)
            if not stat.S_ISREG(info.st_mode):
                self.skipped.append(f"{path}: no longer a regular file when it was copied")
                return
            out_flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd_out = os.open(name, out_flags, 0o600, dir_fd=dst)
            try:
                copied = self._data(fd_in, fd_out, info)
                if copied > self.budget:  # grew since the scan past what the copy may hold
                    raise PolicyNotEnforceableError(self._GREW.format(path=path, setting=self.setting))
                self.budget -= copied
                size = self._size(fd_out, info, copied)  # the apparent size: the twin gets the same
                self._settle(fd_out, self.owner, entry)
            finally:
                os.close(fd_out)
            self._twin_file(name, entry, fd_in, size, dst)
        finally:
            os.close(fd_in)

    def _data(self, fd_in: int, fd_out: int, info: os.stat_result) -> int:
        """Copy ``fd_in`` (``info``: its fstat) into ``fd_out``; what the copy holds (holes count nothing)."""
        return _copy_data(fd_in, fd_out, self.budget + 1, info)

    def _size(self, fd_out: int, info: os.stat_result, copied: int) -> int:
        """The apparent size of the copy ``fd_out`` of a file of ``info`` (``copied`` bytes of data)."""
        del info, copied
        return os.fstat(fd_out).st_size


def _copy_range(fd_in: int, fd_out: int, size: int) -> None:
    """Copy bytes ``0..size`` of ``fd_in`` to ``fd_out``, holes kept, then give ``fd_out`` that size.

    ``fd_in``'s position does not matter (every copy names its offsets). Only the data extents below
    ``size`` are copied (:func:`data_extents`); the rest of ``fd_out`` stays a hole, so a sparse file's
    twin costs its data, not its apparent size. A file that shrank since the first copy gives a shorter
    twin (never zeros where the first copy has data at the same size), and a mirror's adopt tells them apart.
    """
    info = os.fstat(fd_in)
    if _dense(info) and size <= info.st_size and _copy_extent(fd_in, fd_out, 0, size) == size:
        return  # no hole to keep: one range, as a plain copy (no extent queries, no truncate)
    for offset, length in data_extents(fd_in, 0, size):
        _copy_extent(fd_in, fd_out, offset, length)
    os.ftruncate(fd_out, min(size, os.fstat(fd_in).st_size))


def _copy_data(fd_in: int, fd_out: int, limit: int, info: os.stat_result | None = None) -> int:
    """Copy ``fd_in`` to ``fd_out`` (in the kernel when it can), holes kept, until ``limit`` bytes of data.

    ``info``: ``fd_in``'s fstat, when the caller has it. Returns the bytes of data copied (a hole counts
    nothing; past ``limit`` the copy stops and the caller
    refuses it). ``fd_out`` gets ``fd_in``'s apparent size, its holes left holes: ``copy_file_range`` or a
    write over a range writes every hole out on a tmpfs, so only the extents :func:`data_extents` lists are
    copied, each at its own offset, and the size is set last (``ftruncate``).
    """
    copied = 0
    info = info or os.fstat(fd_in)  # the caller's fstat of fd_in when it has one: one system call less
    size = info.st_size
    # A file whose blocks hold all of its size has no hole: one range, without the extent queries (three
    # more system calls per file, which a 2,000-file fork paid on its path).
    extents = [(0, size)] if _dense(info) else data_extents(fd_in, 0, size)
    for offset, length in extents:
        want = min(length, limit - copied)
        done = _copy_extent(fd_in, fd_out, offset, want)
        copied += done
        if copied >= limit or done < want:
            break  # at the limit (refused by the caller), or the file shrank meanwhile
    if copied == size and _dense(info):
        return copied  # written to its size: nothing to truncate
    # The apparent size (a trailing hole stays one), as of the copy's start; one that shrank meanwhile gives
    # a shorter copy, as a copy to EOF would.
    os.ftruncate(fd_out, min(size, os.fstat(fd_in).st_size))
    return copied


def _dense(info: os.stat_result) -> bool:
    """Whether the file's blocks hold at least its size: it has no hole worth keeping."""
    return info.st_blocks * 512 >= info.st_size


def _copy_extent(fd_in: int, fd_out: int, offset: int, length: int) -> int:
    """Copy ``length`` bytes at ``offset`` of ``fd_in`` to that offset of ``fd_out``; how many (EOF: fewer).

    In the kernel (``copy_file_range`` with both offsets: neither position moves) when it can, else
    ``pread``/``pwrite`` in chunks of 1 MiB.
    """
    done = 0
    while done < length:
        at = offset + done
        try:
            n = os.copy_file_range(fd_in, fd_out, min(length - done, 1 << 30), at, at)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            break
        if n == 0:
            return done
        done += n
    while done < length:  # the fallback (another filesystem without support)
        at = offset + done
        chunk = os.pread(fd_in, min(length - done, 1 << 20), at)
        if not chunk:
            break
        view = memoryview(chunk)
        while view:
            written = os.pwrite(fd_out, view, at)
            view, at = view[written:], at + written
        done += len(chunk)
    return done
