"""The snapshot's workspace copy: :func:`copy_tree`'s safety, by reflink where the host filesystem can.

A snapshot's workspace is a copy of a tree a sandbox wrote into: hostile input. It is copied exactly as a
workspace copy is (:func:`adk_sandbox.executor.workspace.copies.copy_tree`: every file and directory
opened by descriptor with ``O_NOFOLLOW`` on both sides, special files left out, set-id bits dropped, a
link kept only as a link and only when it resolves inside the copy and out of any ``.git``, refused
beyond the cap before anything is written), and the same again from the snapshot into each session made
from it. The difference is how a file's data travels: first ``FICLONE`` (a reflink: the copy shares the
blocks, copy-on-write; btrfs, XFS, bcachefs), else the kernel's ``copy_file_range``, else read and write,
either way only over the file's data extents, so a sparse file stays sparse (docs/sparse.md).
:class:`CopyReport` says which was used; its size counts the bytes of data, not the holes.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
from dataclasses import dataclass, field

from adk_sandbox.executor.errors import PolicyNotEnforceableError
from adk_sandbox.executor.snapshots.model import CopyMethod
from adk_sandbox.executor.workspace.copies import _Copier, _copy_data, walk_copy
from adk_sandbox.executor.workspace.scan import Entry

__all__ = ["CopyReport", "copy_workspace"]

log = logging.getLogger(__name__)

#: ``FICLONE`` (``_IOW(0x94, 9, int)``): make the destination share the source's blocks.
FICLONE = 0x40049409
#: What a filesystem (or a pair of them) that cannot clone answers.
_NO_CLONE = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EBADF}


@dataclass(frozen=True)
class CopyReport:
    """What :func:`copy_workspace` did: how, how many bytes of data, what it left out and why.

    ``size_bytes`` counts what the files hold, not their holes: a clone its allocated blocks (at most its
    apparent size), a copy the data extents it wrote.
    """

    method: CopyMethod
    size_bytes: int
    skipped: tuple[str, ...]


def copy_workspace(
    source: str, dest: str, cap_bytes: int, setting: str, *, twin: str | None = None
) -> CopyReport:
    """Copy the host tree ``source`` into the empty host directory ``dest`` (see the module docstring).

    ``setting`` names what raises ``cap_bytes`` in the error that refuses a larger tree (nothing is
    copied then). ``source`` is only read; ``dest`` must be this process's own fresh directory. ``twin``:
    another such directory that gets the same copy by the same walk (each file read once; :func:`walk_copy`).
    """

    def make(host: dict[str, Entry], owner: tuple[int, int], budget: int) -> _CloningCopier:
        return _CloningCopier(host, owner, budget)

    copier = walk_copy(source, dest, cap_bytes, make, setting, twin=twin)
    skipped = copier.skipped
    for reason in skipped:
        log.info("copying %s into %s left out %s", source, dest, reason)
    method: CopyMethod = "reflink" if copier.cloned and not copier.copied else "copy"
    return CopyReport(method, cap_bytes - copier.budget, tuple(skipped))


@dataclass
class _CloningCopier(_Copier):
    """:class:`_Copier` whose file data is cloned when the filesystems can (counted), else copied."""

    cloned: int = 0
    copied: int = 0
    _can_clone: bool = field(default=True)

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
                    raise PolicyNotEnforceableError(
                        f"the workspace's files grew past the snapshot's cap while they were copied "
                        f"({path}); "
                        f"nothing was kept. Raise {self.setting}"
                    )
                self.budget -= copied
                # The apparent size, which the twin gets too: a dense file copied whole has its own.
                dense = copied == info.st_size and info.st_blocks * 512 >= info.st_size
                size = info.st_size if dense else os.fstat(fd_out).st_size
                self._settle(fd_out, self.owner, entry)
            finally:
                os.close(fd_out)
            self._twin_file(name, entry, fd_in, size, dst)
        finally:
            os.close(fd_in)

    def _data(self, fd_in: int, fd_out: int, info: os.stat_result) -> int:
        """Clone ``fd_in`` into ``fd_out`` when it fits the budget and the filesystem can, else copy.

        ``info`` is ``fd_in``'s fstat. Returns what the copy holds (a clone's allocated bytes, a copy's
        data: holes count nothing either way).
        """
        cost = min(info.st_size, info.st_blocks * 512)  # what the source's blocks hold
        if self._can_clone and cost <= self.budget:
            try:
                fcntl.ioctl(fd_out, FICLONE, fd_in)
            except OSError as exc:
                if exc.errno not in _NO_CLONE:
                    raise
                self._can_clone = False  # one refusal says it for the whole tree: stop asking
            else:
                # The file may have grown between the fstat and the clone: what is counted is the clone's
                # (its blocks, at most its size: a clone keeps the source's holes).
                info = os.fstat(fd_out)
                cloned = min(info.st_size, info.st_blocks * 512)
                if cloned <= self.budget:
                    self.cloned += 1
                    return cloned
                return cloned  # over the budget: the caller refuses
        self.copied += 1
        return _copy_data(fd_in, fd_out, self.budget + 1, info)
