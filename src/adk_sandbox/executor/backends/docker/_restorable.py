"""What CRIU 4.1 would dump but could not restore: refused before a runc checkpoint (docs/pause.md, "runc").

Read from the host's ``/proc`` (the kernel's own records, nothing the sandbox writes), for the process tree
of a runc container: CRIU brings back a session or a process group only with its leader, except for
children of the container's first process (it adds a stand-in leader for them), and a stand-in group
leader shares its files with the process it is made for, which then cannot restore a named Unix socket
(CRIU issue 2687, fixed after 4.1). A checkpoint that would not restore is refused with nothing done,
instead of a pause whose resume loses every process.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

__all__ = ["criu_refusal"]


@dataclass(frozen=True)
class _Process:
    pid: int
    name: str
    parent: int
    group: int
    session: int


def _process(pid: int) -> _Process | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    # The name is in parentheses and may hold anything, spaces and ")" included: split after the last ")".
    name, _, rest = stat[stat.index("(") + 1 :].rpartition(")")
    fields = rest.split()
    return _Process(pid, name, int(fields[1]), int(fields[2]), int(fields[3]))


def _tree(root: int) -> dict[int, _Process]:
    processes = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = _process(int(entry))
            if found is not None:
                processes[found.pid] = found
    tree, frontier = {}, [root]
    while frontier:
        pid = frontier.pop()
        if pid in processes and pid not in tree:
            tree[pid] = processes[pid]
            frontier += [p.pid for p in processes.values() if p.parent == pid]
    return tree


def _inside_pid(pid: int) -> str:
    """The pid as the sandbox sees it (the last NSpid), for the message."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return line.split()[-1]
    return "?"


def _named_unix_sockets(root: int, pid: int) -> bool:
    """Whether process ``pid`` holds a Unix socket bound to a path (its network namespace's table)."""
    named = set()
    with contextlib.suppress(OSError), open(f"/proc/{root}/net/unix", encoding="utf-8") as f:
        next(f, None)
        for line in f:
            fields = line.split()
            if len(fields) >= 8 and not fields[7].startswith("@"):
                named.add(fields[6])
    held = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    held.add(target[8:-1])
    return bool(named & held)


def _has_leader(tree: dict[int, _Process], root: int, process: _Process) -> bool:
    """Whether CRIU finds the leader of ``process``'s session: itself, an ancestor, or a stand-in for one.

    A stand-in is made for a child of the first process in a session of its own, so it serves every
    descendant of that child in the same session; the first process's session comes with it.
    """
    if process.session in (process.pid, tree[root].session):
        return True
    ancestor = tree.get(process.parent)
    while ancestor is not None:
        if ancestor.pid == process.session or (
            ancestor.parent == root and ancestor.session == process.session
        ):
            return True
        ancestor = tree.get(ancestor.parent)
    return False


def criu_refusal(root: int) -> str | None:
    """Why CRIU could not restore the process tree of host pid ``root`` (a container's first process).

    None when it could, as far as the tree now shows: a program changing its session during the
    checkpoint can still make the restore fail, which then loses the sandbox's own processes only.
    """
    tree = _tree(root)
    if root not in tree:
        return None  # it stopped meanwhile: the engine says so
    for process in tree.values():
        if process.pid == root:
            continue
        # CRIU stands in for a missing session leader of the first process's children.
        if process.parent != root and not _has_leader(tree, root, process):
            return (
                f"the program {process.name!r} (pid {_inside_pid(process.pid)} inside) is in a session "
                "whose leader has ended (it or a parent called setsid and that process exited), which "
                "runc's checkpoint (CRIU) cannot restore"
            )
        if process.group not in tree and _named_unix_sockets(root, process.pid):
            return (
                f"the program {process.name!r} (pid {_inside_pid(process.pid)} inside) holds a Unix socket "
                "bound to a path in a process group whose leader has ended, which runc's checkpoint "
                "(CRIU 4.1) cannot restore"
            )
    return None
