"""Leak protection for microVMs: run directories (and any process of them) whose owner process is gone.

A VM's processes die with their owner by themselves (the lifeline and death signals of :mod:`._qemu`), but
its run directory (sockets, console log) in the temporary directory stays when the owner is killed. Its
name says who made it, as the copies directories of :mod:`adk_sandbox.executor.workspace.copies` do: boot,
pid namespace, pid and start time of the owner. :func:`reap_vms` (run as a ``MicroVMBackend`` starts)
removes those of owners that are gone, after killing whatever of them still runs: processes whose command
line names the directory (the wrapper, QEMU, fsjail) and virtiofsd processes of the group recorded in it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import stat
import tempfile
from pathlib import Path

from adk_sandbox.executor import _owner

__all__ = ["GROUP_FILE", "reap_vms", "run_dir_prefix"]

#: The file of a run directory holding the process group of its VM (the wrapper's pid).
GROUP_FILE = "group"
_RUN_DIR = re.compile(r"adk-sandbox-vm-([0-9a-f]{8})-(\d+)-(\d+)-(\d+)-([0-9a-f]{12})-[^/]*")


def _boot_tag() -> str:
    boot = _owner.boot_id().replace("-", "")
    return boot[:8] if re.fullmatch(r"[0-9a-f]{8,}", boot) else "0" * 8


def run_dir_prefix(session_id: str) -> str:
    """The ``mkdtemp`` prefix of a session's run directory: its owner (this process) and the session id."""
    pid = os.getpid()
    return (
        f"adk-sandbox-vm-{_boot_tag()}-{_owner.pid_namespace()}-{pid}-{_owner.start_time(pid)}-{session_id}-"
    )


def _owner_gone(match: re.Match[str]) -> bool:
    boot, namespace, pid, start = match.group(1), match.group(2), match.group(3), match.group(4)
    if boot != _boot_tag():
        return True  # made in an earlier boot: nothing of it runs
    if namespace != str(_owner.pid_namespace()):
        return False  # another pid namespace's process: not one this process can look up
    return _owner.start_time(int(pid)) != start


def _processes_of(run_dir: str) -> list[int]:
    """Live processes naming ``run_dir`` on their command line, or virtiofsd in the VM's recorded group."""
    group = -1
    with contextlib.suppress(OSError, ValueError):
        group = int((Path(run_dir) / GROUP_FILE).read_text())
    needle = run_dir.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            fields = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] == b"Z":
            continue
        in_group = int(fields[2]) == group and b"virtiofsd" in cmdline.split(b"\0", 1)[0]
        if needle in cmdline or in_group:
            found.append(int(entry))
    return found


def reap_vms(directory: str | None = None) -> list[str]:
    """Remove the run directories (in ``directory``, default the temporary one) of gone owners; the paths.

    Only directories of this process's user named by :func:`run_dir_prefix`; whatever of them still runs
    is killed first.
    """
    where = directory or tempfile.gettempdir()
    removed: list[str] = []
    try:
        names = os.listdir(where)
    except OSError:
        return removed
    for name in names:
        match = _RUN_DIR.fullmatch(name)
        if match is None or not _owner_gone(match):
            continue
        path = os.path.join(where, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            continue  # not one of ours (the temporary directory is shared)
        for pid in _processes_of(path):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
