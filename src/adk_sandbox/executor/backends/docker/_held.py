"""The host files a checkpointed session's processes hold, and whether its restore can still find them.

A restore reopens by path what the processes held of the container's bind mounts; one removed (or, on
runc, resized) meanwhile fails it. The list comes from inside the sandbox, so each path is looked up only
beneath its bind mount's source, as the file tools do. Depth: docs/pause.md, "Files of the host that paused
processes hold".
"""

from __future__ import annotations

import contextlib
import os
import stat
from typing import TYPE_CHECKING

from adk_sandbox.executor.errors import PolicyNotEnforceableError, SandboxFailedError
from adk_sandbox.executor.workspace.beneath import EscapeError, RootDir, climbs_out

if TYPE_CHECKING:
    from adk_sandbox.executor.backends.docker._container import OpenedContainer
    from adk_sandbox.executor.backends.docker.session import DockerSession

__all__ = ["HeldFile", "held_host_files", "held_sizes", "missing_held_files"]

#: A held file on the host: the source directory of its bind mount, and its path below that source.
HeldFile = tuple[str, str]

#: How the kernel (and gVisor) shows an open file's path once it was deleted.
_DELETED = " (deleted)"
#: Lists what every process of the command user has open, as its cwd and as its executable (one per line).
_HELD_SCRIPT = (
    'for l in /proc/[0-9]*/cwd /proc/[0-9]*/exe /proc/[0-9]*/fd/*; do readlink "$l"; done 2>/dev/null'
)
#: At most this many bytes of that list are read (the rest is not checked: a restore then names nothing).
_HELD_BYTES = 1 << 20


def held_host_files(session: DockerSession, container: OpenedContainer) -> dict[str, HeldFile]:
    """The host files the session's processes hold (open, as their cwd or executable): inside -> held.

    Only those of the container's bind mounts (the workspace, allowed paths): gVisor saves them by path and
    opens them again at a restore, which fails, naming nothing, when one was removed meanwhile (checked:
    a program's open file, its working directory, its executable). Everything else is in the checkpoint.
    The sandbox writes this list (a newline in a name forges a line; it may run its own shell): a line is
    only ever looked up beneath its bind mount's source.
    """
    from adk_sandbox.executor.backends.docker._inside import run_in_sandbox  # noqa: PLC0415 - imports session

    binds = sorted(
        (
            (str(m["Destination"]), str(m["Source"]))
            for m in container.inspect.get("Mounts") or ()
            if m.get("Type") == "bind"
        ),
        key=lambda bind: -len(bind[0]),
    )
    if not binds:
        return {}
    argv = ("/bin/sh", "-c", _HELD_SCRIPT)
    _, listed, _, _ = run_in_sandbox(session, container, argv, None, _HELD_BYTES)
    held: dict[str, HeldFile] = {}
    deleted: list[str] = []
    for line in listed.decode("utf-8", "surrogateescape").splitlines():
        for inside, source in binds:
            if line == inside or line.startswith(inside.rstrip("/") + "/"):
                if line.endswith(_DELETED):
                    deleted.append(line[: -len(_DELETED)])
                else:
                    held[line] = (source, line[len(inside) :].lstrip("/"))
                break
    if deleted:
        raise _deleted_open(", ".join(repr(path) for path in sorted(set(deleted))[:5]))
    return held


def _deleted_open(named: str) -> PolicyNotEnforceableError:
    # Checked before the checkpoint: runsc's failed checkpoint of such a file stops the container.
    return PolicyNotEnforceableError(
        f"a program of the session holds open a file of a host directory (the workspace or an allowed "
        f"path) that was deleted ({named}), which a checkpoint cannot keep; nothing was done, the "
        "session runs on. End that program (or let it close the file) first, or pause(keep_memory=True)"
    )


def _status(held: HeldFile) -> os.stat_result | None:
    """The held file's status on the host, or None when nothing is there.

    Looked up beneath its bind mount's source, following only symlinks that stay beneath it: a path that
    leads out (``..``, or a symlink the sandbox planted in the workspace) raises :class:`EscapeError`, so
    the host never looks at a file outside the mounts for the sandbox.
    """
    source, rel = held
    if climbs_out(rel):
        raise EscapeError(rel)
    try:
        root = RootDir(source)
    except OSError:
        return None
    try:
        fd = root.open(rel, os.O_PATH)
    except OSError:
        return None
    finally:
        root.close()
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def held_sizes(held: dict[str, HeldFile]) -> dict[str, int]:
    """The sizes of the held regular files (inside -> bytes), read once the checkpoint is taken.

    For runc: CRIU records each held file's size and refuses to restore one whose size changed (a log
    opened write-only for appending aside); gVisor opens the file as it is then. Read after the
    checkpoint, when nothing of the sandbox runs, so they are the sizes CRIU saw. A path leading out of
    its mount is no file of the mounts (a forged line): skipped.
    """
    sizes = {}
    for inside, file in held.items():
        with contextlib.suppress(EscapeError):
            status = _status(file)
            if status is not None and stat.S_ISREG(status.st_mode):
                sizes[inside] = status.st_size
    return sizes


def missing_held_files(held: dict[str, HeldFile], sizes: dict[str, int]) -> None:
    """Refuse a restore that would fail: a file the paused processes hold was removed, or resized (runc).

    ``sizes``: :func:`held_sizes` of the checkpoint (empty under gVisor, which opens a changed file). A path
    leading out of its mount is skipped: it names no file of the mounts, and the host does not look there.
    """
    changed, missing = [], []
    for inside, file in sorted(held.items()):
        try:
            status = _status(file)
        except EscapeError:
            continue
        if status is None:
            missing.append(inside)
        elif inside in sizes and status.st_size != sizes[inside]:
            changed.append(f"{inside!r}: {sizes[inside]} -> {status.st_size} bytes")
    if changed:
        raise SandboxFailedError(
            f"files of a host directory that the session's processes hold changed size while it was paused "
            f"({', '.join(changed[:5])}), and runc's restore (CRIU) refuses a held file whose size changed. "
            "Nothing was done and it stays paused: put them back as they were and call again, or close() "
            "the session (its processes are then lost, its workspace kept); runtime='runsc' restores the "
            "changed files"
        )
    if missing:
        shown = ", ".join(repr(path) for path in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise SandboxFailedError(
            f"the session's processes hold files of a host directory that were removed while it was paused "
            f"({shown}: open, a working directory or a program's executable); its checkpoint cannot be "
            "restored without them. Nothing was done and it stays paused: put them back and call again, or "
            "close() the session (its processes are then lost, its workspace kept)"
        )
