"""When a host file's stat can be trusted: the mirror's "racy" window (git's term), one place.

A scan compares each host entry's lstat with the last one; a file edited twice within one tick of its file
system's clock can keep every stat field the first edit left, so a file whose ctime is too close to the
scan is *racy*: its content is compared at the next scan. How close is too close depends on whose clock
stamps the file:

* a local file system of this kernel (tmpfs, ext4, xfs, btrfs, ...) stamps with the kernel's coarse clock,
  ``CLOCK_REALTIME_COARSE``. A scan reads that same clock, so a later edit's ctime is never below the scan's
  time and a file older than the scan's tick cannot share a tick with a later edit: a window of 0 would do,
  :data:`LOCAL_RACY_NS` is margin (for a scan that falls back to the fine clock, and a clock that lags);
* anything else (NFS, CIFS, FUSE, 9p, vfat) may stamp with another machine's clock, maybe ahead or behind,
  or with a coarse one: :data:`RACY_NS`;
* a file whose ctime has no sub-second part may be on a file system counting whole seconds (ext4 with
  128-byte inodes): :data:`RACY_NS` whatever the window.

The file system is asked of the open workspace directory itself (``fstatfs``), not looked up by path, and
a tree with another device mounted inside it gets :data:`RACY_NS` for all of it (see
:meth:`adk_sandbox.executor.workspace.mirror.MirrorWorkspace`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import time
from collections.abc import Iterable

__all__ = [
    "LOCAL_FILESYSTEM_MAGIC",
    "LOCAL_RACY_NS",
    "RACY_NS",
    "is_local_filesystem",
    "racy",
    "scan_clock_ns",
    "window_ns",
]

#: A host file changed less than this before a scan is racy, on a file system whose clock is not ours.
RACY_NS = 2_000_000_000
#: The same on a local file system of this kernel (see the module docstring: margin over one tick).
LOCAL_RACY_NS = 50_000_000
#: ``statfs.f_type`` of the file systems that stamp with this kernel's clock at nanosecond granularity
#: (linux/magic.h). Any other type gets :data:`RACY_NS`.
LOCAL_FILESYSTEM_MAGIC = {
    0x01021994: "tmpfs",
    0x858458F6: "ramfs",
    0xEF53: "ext4",  # also ext2/ext3: whole-second inodes are caught by the sub-second rule
    0x58465342: "xfs",
    0x9123683E: "btrfs",
    0xF2F52010: "f2fs",
    0x794C7630: "overlay",
    0x2FC12FC1: "zfs",
    0xCA451A4E: "bcachefs",
}
#: Linux's ``CLOCK_REALTIME_COARSE`` (Python's ``time`` module has no name for it): the file systems' clock.
_CLOCK_REALTIME_COARSE = 5
_STATFS_BYTES = 256  # struct statfs is 120 bytes on 64-bit Linux; f_type is its first field (a long)


def scan_clock_ns() -> int:
    """Now, on the clock local file systems stamp with (the coarse real-time clock; else the fine one)."""
    try:
        return time.clock_gettime_ns(_CLOCK_REALTIME_COARSE)
    except OSError:  # pragma: no cover - every Linux since 2.6.32 has it
        return time.time_ns()


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _filesystem_magic(fd: int) -> int | None:
    buffer = ctypes.create_string_buffer(_STATFS_BYTES)
    if _libc().fstatfs(fd, buffer) != 0:
        return None
    return ctypes.c_long.from_buffer(buffer).value & 0xFFFFFFFF


def is_local_filesystem(fd: int) -> bool:
    """Whether the open directory ``fd`` is on one of :data:`LOCAL_FILESYSTEM_MAGIC` (False: unknown)."""
    return _filesystem_magic(fd) in LOCAL_FILESYSTEM_MAGIC


def window_ns(fd: int) -> int:
    """The racy window of the tree whose root directory is open as ``fd``."""
    return LOCAL_RACY_NS if is_local_filesystem(fd) else RACY_NS


def racy(files: Iterable[tuple[str, int]], scanned_ns: int, window: int) -> set[str]:
    """The names of ``files`` (name, ctime in ns) changed less than ``window`` before ``scanned_ns``.

    Or after it (a clock ahead). A ctime with no sub-second part gets :data:`RACY_NS` whatever the window.
    """
    since, coarse_since = scanned_ns - window, scanned_ns - RACY_NS
    return {
        name
        for name, ctime in files
        if ctime >= since or (ctime % 1_000_000_000 == 0 and ctime >= coarse_since)
    }
