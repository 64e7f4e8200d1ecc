"""The task profile's root filesystem under gVisor in a snapshot: what changed, archived from inside.

:func:`archive_root` reads, over the session's channel as root, the paths changed since the container's
start (by ``ctime``) as one tar and the entry lists of the changed directories; :func:`restore_root`
replays them inside a new session's sandbox. On the host they are only bytes. Depth: docs/snapshots.md,
"What a snapshot holds" and "What is not carried yet, and why".
"""

from __future__ import annotations

import calendar
import os
import time
from typing import TYPE_CHECKING

from adk_sandbox.executor.backends.docker._inside import run_in_sandbox, write_private
from adk_sandbox.executor.errors import PolicyNotEnforceableError, SandboxFailedError

if TYPE_CHECKING:
    from adk_sandbox.executor.backends.docker._container import OpenedContainer
    from adk_sandbox.executor.backends.docker.session import DockerSession
    from adk_sandbox.executor.snapshots.model import Snapshot

__all__ = ["ROOT_ARCHIVE", "ROOT_DIRS", "archive_root", "restore_root"]

#: The archive of the changed paths, and the entry lists of the changed directories, in a snapshot.
ROOT_ARCHIVE = "root.tar"
ROOT_DIRS = "root.dirs"
#: Seconds before the container's start that still count as a change (the engine's clock and the
#: sandbox's are the same clock; this covers the start's own rounding).
_START_SLACK = 2
_NOTES = 20

# Prints each changed path of the root filesystem as "<type> <path>\0" (type: find's %y).
_CHANGED = "exec find / -xdev -newerct \"@$1\" ! -path / -printf '%y %p\\0'"
# For each directory named on stdin (NUL-separated), its entries' full paths, NUL-separated.
_ENTRIES = (
    "exec xargs -0 -r sh -c 'for d; do "
    'if [ -d "$d" ] && [ ! -L "$d" ]; then find "$d" -mindepth 1 -maxdepth 1 -print0; fi; done\' sh'
)
# Names on stdin are relative to / (no leading slash, so tar has nothing to strip and warn of).
_TAR_OUT = "exec tar -c -f - -C / --format=gnu --sparse --numeric-owner --no-recursion --null -T -"
_REMOVE = "exec xargs -0 -r rm -rf --one-file-system --"
_TAR_IN = "exec tar -x -f - -C / -p --same-owner --numeric-owner"


def archive_root(
    session: DockerSession, container: OpenedContainer, partial: str, room: int, setting: str
) -> tuple[int, list[str]]:
    """Write the root's changes into the partial snapshot: the bytes it takes, and what tar complained of."""
    inside = _Inside(session, container)
    since = _started(container) - _START_SLACK
    changed = inside.checked("list the changed paths", _CHANGED, None, room, str(since))
    mounts = inside.mount_points()
    paths: list[bytes] = []
    directories: list[bytes] = [b"/"]  # its own entry is not archived (the image's), its list is
    for record in changed.split(b"\0"):
        kind, _, path = record.partition(b" ")
        if not path.startswith(b"/") or _under(path, mounts):
            continue
        paths.append(path)
        if kind == b"d":
            directories.append(path)
    entries = inside.checked("list the changed directories", _ENTRIES, b"\0".join(directories), room)
    listing = b"\0".join(directories) + b"\0\0" + entries
    names = b"\0".join(path[1:] for path in paths)
    code, data, err, truncated = inside.run(_TAR_OUT, names, room + 1)
    if truncated or len(data) + len(listing) > room:
        raise PolicyNotEnforceableError(
            f"the snapshot would not fit its cap: the root filesystem's changes bring it past {setting}; "
            "nothing was taken and nothing is left of it. Take it with a larger max_mb, or free space first"
        )
    if code not in (0, 1, 2) or not data:  # 1: a file changed while read, 2: some could not be read
        raise SandboxFailedError(
            f"could not archive the root filesystem's changes in the sandbox (tar exit {code}: "
            f"{err.decode('utf-8', 'replace').strip()[:300]}); nothing was taken"
        )
    write_private(os.path.join(partial, ROOT_ARCHIVE), data)
    write_private(os.path.join(partial, ROOT_DIRS), listing)
    notes = [line for line in err.decode("utf-8", "replace").splitlines() if line.strip()][:_NOTES]
    return len(data) + len(listing), [f"/: {note}" for note in notes]


def restore_root(session: DockerSession, snapshot: Snapshot) -> list[str]:
    """Bring the started ``session``'s root to the snapshot's: remove what was removed, unpack the rest.

    Refused (:class:`SandboxFailedError`) when the container's image is not the one the snapshot was
    taken of: the lists and the archive describe changes to that image only.
    """
    container = session._opened()
    image = str(container.inspect.get("Image") or "")
    if snapshot.image_id and image != snapshot.image_id:
        raise SandboxFailedError(
            f"snapshot {snapshot.id} holds changes to image {snapshot.image_id[:19]}, and {snapshot.image} "
            f"is now {image[:19]}: the session was not started from it (pull or build the old image, or take "
            "a new snapshot)"
        )
    listing = _read(snapshot, ROOT_DIRS)
    directories, _, wanted = listing.partition(b"\0\0")
    room = 64 * 1024 * 1024
    inside = _Inside(session, container)
    present = inside.checked("list the restored directories", _ENTRIES, directories, room)
    keep = {name for name in wanted.split(b"\0") if name}
    mounts = inside.mount_points()
    gone = [name for name in present.split(b"\0") if name and name not in keep and not _under(name, mounts)]
    notes: list[str] = []
    if gone:
        code, _, err, _ = inside.run(_REMOVE, b"\0".join(gone), 64 * 1024)
        notes += _lines(err)
        if code not in (0, 1, 123):  # 123: some could not be removed (said in the notes)
            raise SandboxFailedError(f"could not remove the snapshot's removed files (exit {code})")
    code, _, err, _ = inside.run(_TAR_IN, _read(snapshot, ROOT_ARCHIVE), 64 * 1024)
    notes += _lines(err)
    if code not in (0, 2):
        raise SandboxFailedError(
            f"could not restore the root filesystem from snapshot {snapshot.id} (tar exit {code}: "
            f"{' '.join(notes)[:300]})"
        )
    return [f"/: {note}" for note in notes[:_NOTES]]


def _started(container: OpenedContainer) -> int:
    """When the container started, in whole seconds since the epoch (the engine's ``StartedAt``)."""
    stamp = str((container.inspect.get("State") or {}).get("StartedAt") or "")
    try:
        return calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        raise SandboxFailedError(f"the engine did not say when the container started ({stamp!r})") from None


class _Inside:
    """Commands in the session's sandbox as its command user (root: only the task profile gets here)."""

    def __init__(self, session: DockerSession, container: OpenedContainer) -> None:
        self.session = session
        self.container = container

    def run(
        self, script: str, stdin: bytes | None, max_output: int, *args: str
    ) -> tuple[int | None, bytes, bytes, bool]:
        """Exit code, stdout, stderr and whether stdout was cut at ``max_output``."""
        argv = ("/bin/sh", "-c", script, "adk-sandbox-root", *args)
        return run_in_sandbox(self.session, self.container, argv, stdin, max_output)

    def checked(self, what: str, script: str, stdin: bytes | None, room: int, *args: str) -> bytes:
        """The stdout of a command that must succeed within ``room`` bytes (else refused, nothing taken)."""
        code, out, err, truncated = self.run(script, stdin, room + 1, *args)
        if truncated:
            raise PolicyNotEnforceableError(
                f"could not {what} within the snapshot's cap; nothing was taken. Take it with a larger max_mb"
            )
        if code != 0:
            said = err.decode("utf-8", "replace").strip()[:300]
            raise SandboxFailedError(
                f"could not {what} in the sandbox (exit {code}: {said}); "
                "the task profile's root under gVisor needs GNU find, xargs and tar in the image"
            )
        return out

    def mount_points(self) -> tuple[bytes, ...]:
        """The sandbox's mount points other than ``/`` (its tmpfs, its workspace, the engine's files)."""
        info = self.checked("read the mounts", "exec cat /proc/self/mountinfo", None, 1024 * 1024)
        points = []
        for line in info.split(b"\n"):
            fields = line.split(b" ")
            if len(fields) > 4 and fields[4] != b"/":
                # mountinfo escapes a space, tab, newline and backslash in a path as octal.
                points.append(fields[4].decode("unicode_escape").encode("latin-1"))
        return tuple(points)


def _under(path: bytes, mounts: tuple[bytes, ...]) -> bool:
    return any(path == point or path.startswith(point + b"/") for point in mounts)


def _read(snapshot: Snapshot, name: str) -> bytes:
    try:
        fd = os.open(os.path.join(snapshot.path, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SandboxFailedError(f"snapshot {snapshot.id} lost its {name} (removed meanwhile?)") from None
    with os.fdopen(fd, "rb") as handle:
        return handle.read()


def _lines(err: bytes) -> list[str]:
    return [line for line in err.decode("utf-8", "replace").splitlines() if line.strip()]
