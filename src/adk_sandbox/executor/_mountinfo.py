"""The kernel's mount table (``/proc/<pid>/mountinfo``), parsed once for every reader.

Used where a protection is checked from the host rather than assumed: a forkable session's tmpfs volumes
(``nosuid,nodev``, their size), a layered fork's overlays as its container sees them, and whether a
snapshot is still the lower layer of a running fork. The table is the kernel's account, never the
sandbox's.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MountEntry", "parse_mountinfo", "read_mountinfo", "top_mounts"]


@dataclass(frozen=True)
class MountEntry:
    """One line of ``mountinfo``."""

    mount_id: str
    parent: str
    point: str
    """Where it is mounted (octal escapes of spaces, tabs and backslashes undone)."""
    fstype: str
    options: frozenset[str]
    """The per-mount options (``nosuid``, ``nodev``, ``ro``...)."""
    super_options: tuple[str, ...]
    """The file system's own options (``size=...``, an overlay's ``lowerdir=...``), in order."""


def _unescape(path: str) -> str:
    return path.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def parse_mountinfo(text: str) -> list[MountEntry]:
    """Every mount of ``text`` (a ``mountinfo`` file's content), in the kernel's order (oldest first)."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields or len(fields) < 6:
            continue
        dash = fields.index("-")
        mounts.append(
            MountEntry(
                mount_id=fields[0],
                parent=fields[1],
                point=_unescape(fields[4]),
                fstype=fields[dash + 1] if len(fields) > dash + 1 else "",
                options=frozenset(fields[5].split(",")),
                super_options=tuple(fields[dash + 3].split(",")) if len(fields) > dash + 3 else (),
            )
        )
    return mounts


def read_mountinfo(pid: int | str = "self") -> list[MountEntry]:
    """The mounts of process ``pid``'s mount namespace; ``OSError`` when it cannot be read."""
    with open(f"/proc/{pid}/mountinfo", encoding="utf-8") as handle:
        return parse_mountinfo(handle.read())


def top_mounts(mounts: list[MountEntry]) -> dict[str, MountEntry]:
    """Per mount point, its top mount: the one no other mount at that point sits on (what a path reaches)."""
    by_point: dict[str, list[MountEntry]] = {}
    for mount in mounts:
        by_point.setdefault(mount.point, []).append(mount)
    tops = {}
    for point, stack in by_point.items():
        parents = {m.parent for m in stack}
        on_top = [m for m in stack if m.mount_id not in parents] or stack[-1:]
        tops[point] = on_top[-1]
    return tops
