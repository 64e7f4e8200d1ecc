"""The snapshot's workspace copy: :func:`copy_tree`'s safety, by reflink where the host filesystem can.

:func:`copy_workspace` copies a hostile tree exactly as a workspace copy does (descriptors,
``O_NOFOLLOW``, caps), moving data by ``FICLONE``, else ``copy_file_range``, else read and write, over
data extents only; :class:`CopyReport` says which was used. See docs/sparse.md and docs/snapshots.md.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from dataclasses import dataclass, field

from adk_sandbox.executor.snapshots.model import CopyMethod
from adk_sandbox.executor.workspace.copies import _Copier, walk_copy
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
    """Copy the host tree ``source`` into the empty host directory ``dest`` (docs/sparse.md).

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

    _GREW = (
        "the workspace's files grew past the snapshot's cap while they were copied ({path}); nothing was "
        "kept. Raise {setting}"
    )

    def _size(self, fd_out: int, info: os.stat_result, copied: int) -> int:
        # A dense file copied whole has its own size: no fstat of the copy.
        dense = copied == info.st_size and info.st_blocks * 512 >= info.st_size
        return info.st_size if dense else os.fstat(fd_out).st_size

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
        return super()._data(fd_in, fd_out, info)
