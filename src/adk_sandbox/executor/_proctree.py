"""The one place where a process tree is killed and waited for.

A host child is started as the leader of a new process group, so the group id is the leader's pid. The
group is killed while the leader is still a zombie (exited but not reaped): the pid cannot be reused by an
unrelated process in that window, so the kill can never hit a stranger's group.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
import time

__all__ = ["has_exited", "kill_process_group", "kill_session", "wait_for_exit_unreaped"]

_POLL_INTERVAL = 0.01


def kill_process_group(pgid: int) -> None:
    """SIGKILL every process in group ``pgid``; a group that is already gone is not an error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` this user may signal: its leader's group, then the rest.

    An interactive shell puts each job in a group of its own, all in its session; a process that left
    the session (``setsid``) is not found.
    """
    kill_process_group(sid)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue  # gone meanwhile
        # After the command's name (in parentheses, may hold anything): state, ppid, pgrp, session.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 3 and int(fields[3]) == sid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(name), signal.SIGKILL)


def wait_for_exit_unreaped(
    proc: subprocess.Popen[bytes], deadline: float, cancel: threading.Event | None = None
) -> bool:
    """Wait until ``proc`` exits, without reaping it, until ``deadline`` (``time.monotonic()``).

    Returns True if it exited, False if the deadline passed or ``cancel`` was set first. Leaving the
    process unreaped keeps its pid (= its process group id) reserved until :func:`kill_process_group` ran.
    """
    pidfd = _open_pidfd(proc.pid)
    try:
        while True:
            if cancel is not None and cancel.is_set():
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return has_exited(proc.pid)
            step = remaining if cancel is None else min(remaining, 0.05)
            if pidfd is not None:
                readable, _, _ = select.select([pidfd], [], [], step)
                if readable:
                    return True
            else:
                if has_exited(proc.pid):
                    return True
                time.sleep(min(step, _POLL_INTERVAL))
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _open_pidfd(pid: int) -> int | None:
    # pidfd (Linux >= 5.3) becomes readable when the process exits: an exact wakeup without polling.
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def has_exited(pid: int) -> bool:
    """Whether child ``pid`` ended, without reaping it (a child already reaped counts as ended)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None
