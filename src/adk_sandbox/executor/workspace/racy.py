"""When a host file's stat can be trusted: the mirror's "racy" window (git's term), one place.

A file whose ctime is within the window of a scan (:func:`scan_clock_ns`) is *racy* (:func:`racy`):
its content is compared at the next scan. :func:`window_ns` is :data:`LOCAL_RACY_NS` on a local file
system of this kernel, else :data:`RACY_NS`. See docs/docker/workspace-transport.md, "Racy entries".
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
#: The same on a local file system of this kernel: margin over one tick (a scan reads the same coarse
#: clock, so 0 would do).
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
