"""The host scan: the workspace's entries as a sync compares them, walked by descriptor from the held root.

An :class:`Entry` is one entry of a tree (kind, mode, size, times, inode, link target), on either side. A
scan lists the host tree with one ``lstat`` per entry (:func:`host_keys`); :func:`scan_host` turns that
into entries (links read from their literal directory, special files left out), and :func:`check_fits`
refuses a tree too large for the copy it is to fill, counting what a copy really costs: a sparse file's
allocated blocks, not its apparent size (docs/sparse.md). :func:`data_extents` lists where a file holds
data, for copies that keep its holes. The mirror's sync and the workspace copies both start from here.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from dataclasses import dataclass, field
from typing import Literal

from adk_sandbox.executor.errors import PolicyNotEnforceableError
from adk_sandbox.executor.workspace.beneath import EscapeError, RootDir

__all__ = ["Entry", "Kind", "check_fits", "data_extents", "host_keys", "scan_host"]


Kind = Literal["f", "d", "l", "o"]
#: A host entry's lstat as a scan compares it: st_mode, size, mtime, ctime, inode, device, st_blocks.
_Key = tuple[int, int, int, int, int, int, int]


@dataclass(frozen=True)
class Entry:
    """One entry of a tree as a sync compares it: kind, permission bits, size, mtime, link target.

    ``size``, ``mtime_ns``, ``ctime_ns`` and ``inode`` count for files only, ``target`` for links only
    (see :meth:`same`).
    """

    kind: Kind
    mode: int
    size: int = 0
    mtime_ns: int = 0
    target: str = ""
    inode: int = 0
    """0: not known (what a push predicts for the container). A file replaced by a rename is a change even
    with the same size and mtime."""
    ctime_ns: int = 0
    """0: not known. Every write, chmod, rename or ``touch -d`` sets it to the current time, and nothing
    unprivileged can set it back: an edit that keeps size and mtime (forged or within the clock's
    granularity) still changes it."""
    allocated: int | None = field(default=None, compare=False)
    """Bytes the file's blocks hold (``st_blocks * 512``); None: not known (a listing from the sandbox).
    Not compared: the same content may sit in other blocks on another file system."""

    @property
    def cost(self) -> int:
        """What a copy that keeps holes spends on this file: its allocated bytes, at most its size.

        A sparse file counts its blocks, not its apparent size; a small file's last partial block does not
        count past its size; unknown allocation counts the size (docs/sparse.md).
        """
        if self.kind != "f":
            return 0
        return self.size if self.allocated is None else min(self.size, self.allocated)

    def same(self, other: Entry | None) -> bool:
        """Whether ``other`` is this entry unchanged, as far as a sync cares (unknown fields match)."""
        if other is None or other.kind != self.kind:
            return False
        if self.kind == "l":
            return other.target == self.target
        if self.kind == "d":
            return other.mode == self.mode
        if (other.mode, other.size, other.mtime_ns) != (self.mode, self.size, self.mtime_ns):
            return False
        if self.inode and other.inode and self.inode != other.inode:
            return False
        return not (self.ctime_ns and other.ctime_ns and self.ctime_ns != other.ctime_ns)


def host_keys(root: int) -> dict[str, _Key]:
    """The lstat of every entry below the open directory ``root`` (files, directories, links, special files).

    The one walk of a host scan: one ``lstat`` per entry (a change inside a file moves no directory's
    times, so no directory can be skipped), nothing read. Walked by descriptor: each directory is opened
    from its parent with ``O_NOFOLLOW`` and must be the one its ``lstat`` saw (device and inode), so a
    directory swapped for a link during the walk is left out (the next scan sees the link), and no name
    from outside the workspace is ever listed.
    """
    found: dict[str, _Key] = {}

    def walk(directory: int, prefix: str) -> None:
        try:
            with os.scandir(directory) as listing:
                entries = list(listing)
        except OSError:
            return
        for item in entries:
            try:
                info = item.stat(follow_symlinks=False)
            except OSError:
                continue
            rel = prefix + item.name
            found[rel] = (
                info.st_mode, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev,
                info.st_blocks,
            )  # fmt: skip
            if stat.S_ISDIR(info.st_mode):
                try:
                    below = os.open(item.name, _DIRECTORY_FLAGS, dir_fd=directory)
                except OSError:
                    continue  # unreadable, or no longer a directory: listed as it was seen, not entered
                try:
                    opened = os.fstat(below)
                    if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
                        del found[rel]  # replaced between the lstat and the open: the next scan sees it
                        continue
                    walk(below, rel + "/")
                finally:
                    os.close(below)

    walk(root, "")
    return found


_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _host_entry(tree: RootDir, rel: str, key: _Key) -> Entry | None:
    """The entry a host scan's ``key`` of ``rel`` is (None: a special file, or a link not read as such)."""
    mode, size, mtime_ns, ctime_ns, inode, _, blocks = key
    if stat.S_ISDIR(mode):
        return Entry("d", stat.S_IMODE(mode) & 0o777, mtime_ns=mtime_ns)
    if stat.S_ISREG(mode):
        allocated = blocks * 512
        return Entry("f", mode & 0o777, size, mtime_ns, inode=inode, ctime_ns=ctime_ns, allocated=allocated)
    if stat.S_ISLNK(mode):
        target = _read_host_link(tree, rel)
        return Entry("l", 0o777, target=target) if target is not None else None
    return None


def scan_host(root: str) -> dict[str, Entry]:
    """The host tree below ``root`` (files, directories, links; special files left out), never following."""
    tree = RootDir(root)
    try:
        keys = host_keys(tree.fd)
        return {rel: entry for rel, key in keys.items() if (entry := _host_entry(tree, rel, key)) is not None}
    finally:
        tree.close()


def check_fits(
    root: str, host: dict[str, Entry], cap_bytes: int, setting: str = "DockerBackend(mirror_size_mb=...)"
) -> None:
    """Refuse a tree (``host``, scanned from ``root``) whose files would not fit a copy of ``cap_bytes``.

    ``setting`` is what raises the cap (named in the error). A file counts what a copy of it costs
    (:attr:`Entry.cost`): a sparse file its allocated blocks, since every copy keeps its holes and the
    sandbox's tmpfs is capped by allocated pages too.
    """
    total = sum(entry.cost for entry in host.values())
    if total > cap_bytes:
        raise PolicyNotEnforceableError(
            f"the workspace {root} holds {total // (1024 * 1024)} MiB of data (sparse files count their "
            f"allocated blocks), more than its copy in the sandbox may hold ({cap_bytes // (1024 * 1024)} "
            f"MiB); nothing ran. Create the backend with a larger {setting}"
        )


def data_extents(fd: int, start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
    """Where the open file ``fd`` holds data from ``start`` to ``end`` (default: its size): (offset, length).

    Asked of the file system (``SEEK_DATA``/``SEEK_HOLE``), so a hole is never read: a copy that writes
    only these ranges and then sets the size keeps the file sparse. A file system that cannot tell holes
    reports the whole file as data (the kernel's generic answer), and one that refuses the question gets
    the same answer here: nothing is ever left out. The file may change meanwhile; what a range says is
    what the file system said when asked.
    """
    if end is None:
        end = os.fstat(fd).st_size
    extents: list[tuple[int, int]] = []
    at = start
    while at < end:
        try:
            begin = os.lseek(fd, at, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                break  # only a hole (or nothing) from here to the end
            extents.append((at, end - at))  # cannot tell: all of it is data
            break
        if begin >= end:
            break
        try:
            stop = min(os.lseek(fd, begin, os.SEEK_HOLE), end)
        except OSError:
            stop = end
        if stop <= begin:  # shrank meanwhile
            break
        extents.append((begin, stop - begin))
        at = stop
    return extents


def _read_host_link(tree: RootDir, rel: str) -> str | None:
    """The target of the host link at ``rel``, its directory reached as written (no link followed)."""
    directory = posixpath.dirname(rel)
    try:
        fd = tree.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except (OSError, EscapeError):
        return None
    try:
        if tree.real_path(fd) != os.path.join(tree.path, directory).rstrip("/"):
            return None
        return os.readlink(posixpath.basename(rel), dir_fd=fd)
    except OSError:
        return None
    finally:
        os.close(fd)
