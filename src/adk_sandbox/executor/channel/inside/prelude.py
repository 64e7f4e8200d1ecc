# The process tools every in-sandbox program shares, spliced in at its prelude line (after
# setid_filter.py) by executor/channel/programs.py. Python >= 3.6, standard library only: annotations
# are strings, never evaluated.
# @CHECK-ONLY@
# For the checkers only (not shipped): what the program provides the prelude, and the type names.
import os
import signal
import time
from collections.abc import Callable, Iterable

SELF = os.getpid()  # the program's own pid, never signalled
MARK = b"ADK_SANDBOX_EXEC="  # the marker variable of a command's environment
Proc = tuple[int, int, bytes, bytes]  # ppid, session, start time, state
Procs = dict[int, Proc]
# @END-CHECK-ONLY@


def stat_of(pid: "int") -> "list[bytes]":
    with open("/proc/%d/stat" % pid, "rb") as f:
        data = f.read()
    return data[data.rindex(b")") + 2 :].split()


def scan() -> "Procs":
    procs: "Procs" = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                f = stat_of(int(name))
                procs[int(name)] = (int(f[1]), int(f[3]), f[19], f[0])  # ppid, session, start, state
            except (OSError, ValueError, IndexError):
                pass
    return procs


def start_of(pid: "int") -> "bytes | None":
    try:
        return stat_of(pid)[19]
    except (OSError, ValueError, IndexError):
        return None


def send(pid: "int", start: "bytes | None", sig: "int") -> "None":
    fd = None
    try:
        fd = os.pidfd_open(pid)
    except AttributeError:
        pass
    except OSError as e:
        if e.errno != 38:  # ENOSYS: no pidfd here, fall back to kill
            return
    try:
        if start_of(pid) != start:
            return
        if fd is None:
            os.kill(pid, sig)
        else:
            signal.pidfd_send_signal(fd, sig)
    except OSError:
        pass
    finally:
        if fd is not None:
            os.close(fd)


def below(roots: "Iterable[int]", procs: "Procs") -> "set[int]":
    kids: "dict[int, list[int]]" = {}
    for p, info in procs.items():
        kids.setdefault(info[0], []).append(p)
    found: "set[int]" = set()
    todo = list(roots)
    while todo:
        for c in kids.get(todo.pop(), ()):
            if c not in found:
                found.add(c)
                todo.append(c)
    return found


def reap_any() -> "list[tuple[int, int]]":
    out: "list[tuple[int, int]]" = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return out
        except InterruptedError:
            continue
        if not pid:
            return out
        out.append((pid, status))


def uid_of(pid: "int") -> "int | None":
    # The real uid (/proc/PID/status is readable for every process, non-dumpable ones included).
    try:
        with open("/proc/%d/status" % pid, "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


MYUID = os.getuid()


def kill_all(
    targets: "Callable[[Procs], Iterable[int]]",
    limit: "float" = 5.0,
    on_reaped: "Callable[[int, int], None] | None" = None,
) -> "Procs":
    # Stop first: a stopped process cannot fork, so a fork bomb cannot refill what a kill frees. Only
    # processes of this uid: no capability lets another user's be signalled (another user's agent and its
    # commands are that user's to kill), and retrying them would only spend the limit.
    stopped: "set[int]" = set()
    end = time.monotonic() + limit
    while True:
        procs = scan()
        victims = [
            p
            for p in targets(procs)
            if p != SELF and p in procs and procs[p][3] not in b"ZX" and uid_of(p) == MYUID
        ]
        if not victims or time.monotonic() > end:
            return procs
        fresh = [p for p in victims if p not in stopped]
        for p in fresh or victims:
            send(p, procs[p][2], signal.SIGSTOP if fresh else signal.SIGKILL)
        stopped.update(fresh)
        if not fresh:
            for pid, status in reap_any():
                if on_reaped is not None:
                    on_reaped(pid, status)
            time.sleep(0.001)


def argv_of(pid: "int") -> "list[bytes]":
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def marker_of(pid: "int") -> "bytes | None":
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            for entry in f.read().split(b"\0"):
                if entry.startswith(MARK):
                    return entry[len(MARK) :]
    except OSError:
        pass
    return None


def parse_protected(text: "str") -> "set[tuple[int, bytes]]":
    return set((int(p), s.encode()) for p, _, s in (e.partition(":") for e in text.split(",") if e))
