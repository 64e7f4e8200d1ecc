"""Who this process is, as the owner of what it leaves behind: boot, process start time, host, pid namespace.

Whatever outlives a session when its owner is killed (a container, a Pod, a workspace copy in ``/dev/shm``)
is named or labelled with its owner, so a later reaping can tell a dead owner from a live one: the pid alone
is not enough (pids are reused; a pid means something only on the same host, boot and pid namespace), so
the process's start time, the machine's boot id, the host name and the pid namespace go with it. The
Docker reaper (:mod:`adk_sandbox.executor.backends.docker._reaper`) labels containers with these, the
workspace copies (:mod:`adk_sandbox.executor.workspace.copies`) carry them in their names.
"""

from __future__ import annotations

import functools
import os
import socket

__all__ = ["boot_id", "host", "pid_namespace", "start_time"]


@functools.cache
def boot_id() -> str:
    """The machine's current boot (``/proc/sys/kernel/random/boot_id``; ``"unknown"`` without it)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()
    except OSError:  # pragma: no cover - every Linux has it
        return "unknown"


@functools.cache
def host() -> tuple[str, str]:
    """The host name and the pid namespace of this process: where an owner pid means something."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:  # pragma: no cover - every Linux has it
        namespace = "unknown"
    return socket.gethostname(), namespace


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return fields[19].decode()


def pid_namespace() -> int:
    """The pid namespace of this process as a number (the ``N`` of :func:`host`'s ``pid:[N]``; 0: unknown)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:  # pragma: no cover - every Linux has it
        return 0
