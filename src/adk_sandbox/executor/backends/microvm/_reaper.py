"""Leak protection for microVMs: run directories (and any process of them) whose owner process is gone.

A VM's processes die with their owner by themselves (the lifeline and death signals of :mod:`._qemu`), but
its run directory (sockets, a paused VM's state) in the temporary folder stays when the owner is killed. Its
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
import tempfile
from pathlib import Path

from adk_sandbox.executor.workspace.copies import owner_tag, remove_leftovers

__all__ = ["GROUP_FILE", "reap_vms", "run_dir_prefix"]

#: The file of a run directory holding the process group of its VM (the wrapper's pid).
GROUP_FILE = "group"
_RUN_DIR = re.compile(r"adk-sandbox-vm-([0-9a-f]{8})-(\d+)-(\d+)-(\d+)-([0-9a-f]{12})-[^/]*")


def run_dir_prefix(session_id: str) -> str:
    """The ``mkdtemp`` prefix of a session's run directory: its owner (this process) and the session id."""
    return f"adk-sandbox-vm-{owner_tag()}-{session_id}-"


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
    return remove_leftovers(directory or tempfile.gettempdir(), _RUN_DIR, _kill_and_remove)


def _kill_and_remove(run_dir: str) -> None:
    for pid in _processes_of(run_dir):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(run_dir, ignore_errors=True)
