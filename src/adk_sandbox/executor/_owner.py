"""Who owns a sandbox: this process's identity (boot, start time, host, pid namespace) and the owner labels.

:func:`owner_labels` labels what may outlive its owner (a container, a Pod) and :func:`leak_reason` is
the one rule every engine's reaper applies to the sandboxes it lists by :data:`PROJECT_LABEL`; a pid
alone is not enough, so start time, boot id, host and pid namespace go with it.
See docs/docker/engines.md, "Reaping across hosts".
"""

from __future__ import annotations

import functools
import os
import socket
import time
from collections.abc import Mapping

__all__ = [
    "EXPIRES",
    "LABEL_PREFIX",
    "OWNER_BOOT",
    "OWNER_HOST",
    "OWNER_PID",
    "OWNER_PIDNS",
    "OWNER_START",
    "PROJECT_LABEL",
    "SESSION",
    "boot_id",
    "host",
    "leak_reason",
    "owner_labels",
    "pid_namespace",
    "start_time",
]

LABEL_PREFIX = "io.adk-sandbox."
#: Every sandbox this project creates carries this label; cleanup selects by it, never by name.
PROJECT_LABEL = LABEL_PREFIX + "project"

OWNER_PID = LABEL_PREFIX + "owner-pid"
OWNER_START = LABEL_PREFIX + "owner-start"
OWNER_BOOT = LABEL_PREFIX + "owner-boot"
EXPIRES = LABEL_PREFIX + "expires"
SESSION = LABEL_PREFIX + "session"
OWNER_HOST = LABEL_PREFIX + "owner-host"
OWNER_PIDNS = LABEL_PREFIX + "owner-pidns"


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


def owner_labels(session_id: str, lifetime_seconds: int) -> dict[str, str]:
    """The labels that tie a new sandbox to this process and bound its life."""
    pid = os.getpid()
    return {
        PROJECT_LABEL: "adk-sandbox",
        SESSION: session_id,
        OWNER_PID: str(pid),
        OWNER_START: start_time(pid) or "",
        OWNER_BOOT: boot_id(),
        OWNER_HOST: host()[0],
        OWNER_PIDNS: host()[1],
        EXPIRES: str(int(time.time()) + lifetime_seconds),
    }


def leak_reason(labels: Mapping[str, str], now: float) -> str | None:
    """Why a sandbox with these labels is leaked, or None when its owner may still need it."""
    expires = labels.get(EXPIRES, "")
    if expires.isdigit() and int(expires) < now:
        return "its expiry time has passed"
    pid, start = labels.get(OWNER_PID, ""), labels.get(OWNER_START)
    if not pid.isdigit() or labels.get(OWNER_BOOT) != boot_id():
        return None  # not owned by a process of this machine's current boot: only expiry applies
    here, namespace = host()
    if labels.get(OWNER_HOST, here) != here or labels.get(OWNER_PIDNS, namespace) != namespace:
        return None  # another host (or container) sharing the engine: its pids are not ours to look up
    if int(pid) == os.getpid():
        return None
    if start_time(int(pid)) != start:
        return f"its owner process {pid} is gone"
    return None
