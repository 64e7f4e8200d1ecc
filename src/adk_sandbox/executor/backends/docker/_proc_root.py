"""A runc container's tmpfs directories read on the host, through ``/proc/<pid>/root``.

:func:`readable_runtime` says whether a container qualifies (local engine, runc, root, no user
namespace); :func:`open_tmpfs_dirs` opens each directory safely (``O_NOFOLLOW`` per component, size
checked with ``statvfs``) for the snapshot's copy. Depth: docs/snapshots.md, "Forks of any session".
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["RUNTIMES", "open_tmpfs_dirs", "readable_runtime"]

#: Runtimes whose containers' files are the host kernel's, so ``/proc/<pid>/root`` shows them.
RUNTIMES = frozenset({"runc", "io.containerd.runc.v2"})
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MIB = 1024 * 1024


def readable_runtime(inspect: Mapping[str, Any], *, local: bool) -> int | None:
    """The container's init pid when its tmpfs directories can be read on this host, else None."""
    if not local or os.geteuid() != 0:
        return None
    if str((inspect.get("HostConfig") or {}).get("Runtime") or "runc") not in RUNTIMES:
        return None
    pid = int((inspect.get("State") or {}).get("Pid") or 0)
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/uid_map", encoding="ascii") as handle:
            mapping = handle.read().split()
    except OSError:
        return None
    return pid if mapping == ["0", "0", "4294967295"] else None  # the host's own uids, unmapped


@contextlib.contextmanager
def open_tmpfs_dirs(pid: int, sizes: Mapping[str, int]) -> Iterator[dict[str, str]]:
    """``{path inside: /proc/self/fd/<n>}`` for each tmpfs directory of ``sizes`` (MiB), while open.

    Raises ``OSError`` when one cannot be opened, or is not a filesystem of its size (nothing is copied).
    """
    fds: list[int] = []
    try:
        proc = os.open(f"/proc/{pid}", _DIR)
        fds.append(proc)
        root = os.open("root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=proc)  # the magic link
        fds.append(root)
        found: dict[str, str] = {}
        for path, size_mb in sizes.items():
            current = root
            for part in [p for p in path.split("/") if p]:
                current = os.open(part, _DIR, dir_fd=current)
                fds.append(current)
            info = os.statvfs(current)
            if info.f_blocks * info.f_frsize != size_mb * MIB:
                raise OSError(f"{path} in the container is not its {size_mb} MiB tmpfs")
            found[path] = f"/proc/self/fd/{current}"
        yield found
    finally:
        for fd in fds:
            os.close(fd)
