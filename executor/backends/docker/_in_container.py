"""Python source shared by the programs that run inside a sandbox container.

The agent (:mod:`._agent`) and the exec transport's supervisor (:mod:`._supervisor`) are Python programs
that travel as ``python3 -I -S -c`` arguments, so they cannot import anything of this package inside the
container. What both need is written once here and spliced into each at the line ``# @PRELUDE@`` by
:func:`in_container_program`:

* the set-id seccomp filter (:mod:`._seccomp`): ``install_setid_filter`` and ``SETID``, the program for
  this machine's architecture (``None`` where there is none: commands then refuse to start);
* the process tools: reading ``/proc`` (``stat_of``, ``scan``: ppid, session, start time, state),
  ``send`` (a signal through a pidfd after re-checking the start time, so a reused pid is never hit),
  ``below`` (descendants by ppid), ``kill_all`` (SIGSTOP then SIGKILL in passes until nothing is left,
  so a fork bomb cannot refill what a kill frees), ``reap_any``, ``argv_of``, ``marker_of`` and
  ``parse_protected``.

Requirements of a program using it: ``os``, ``signal`` and ``time`` imported, and the globals ``SELF``
(its own pid, never signalled) and ``MARK`` (``b"ADK_SANDBOX_EXEC="``) defined. Kept compatible with
Python >= 3.6, standard library only.
"""

from __future__ import annotations

from adk_sandbox.executor.backends.docker._seccomp import INSTALL_FILTER_SOURCE, native_arch, setid_filter

__all__ = ["PRELUDE_LINE", "PROCESS_TOOLS_SOURCE", "in_container_program"]

#: The line of a program's source replaced by the shared prelude.
PRELUDE_LINE = "# @PRELUDE@"

PROCESS_TOOLS_SOURCE = r"""
def stat_of(pid):
    with open("/proc/%d/stat" % pid, "rb") as f:
        data = f.read()
    return data[data.rindex(b")") + 2:].split()

def scan():
    procs = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                f = stat_of(int(name))
                procs[int(name)] = (int(f[1]), int(f[3]), f[19], f[0])  # ppid, session, start, state
            except (OSError, ValueError, IndexError):
                pass
    return procs

def start_of(pid):
    try:
        return stat_of(pid)[19]
    except (OSError, ValueError, IndexError):
        return None

def send(pid, start, sig):
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

def below(roots, procs):
    kids = {}
    for p, info in procs.items():
        kids.setdefault(info[0], []).append(p)
    found, todo = set(), list(roots)
    while todo:
        for c in kids.get(todo.pop(), ()):
            if c not in found:
                found.add(c)
                todo.append(c)
    return found

def reap_any():
    out = []
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

def uid_of(pid):
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

def kill_all(targets, limit=5.0, on_reaped=None):
    # Stop first: a stopped process cannot fork, so a fork bomb cannot refill what a kill frees. Only
    # processes of this uid: no capability lets another user's be signalled (another user's agent and its
    # commands are that user's to kill), and retrying them would only spend the limit.
    stopped = set()
    end = time.monotonic() + limit
    while True:
        procs = scan()
        victims = [p for p in targets(procs)
                   if p != SELF and p in procs and procs[p][3] not in b"ZX" and uid_of(p) == MYUID]
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

def argv_of(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []

def marker_of(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            for entry in f.read().split(b"\0"):
                if entry.startswith(MARK):
                    return entry[len(MARK):]
    except OSError:
        pass
    return None

def parse_protected(text):
    return set((int(p), s.encode()) for p, _, s in (e.partition(":") for e in text.split(",") if e))

"""


def in_container_program(body: str) -> str:
    """``body`` with its :data:`PRELUDE_LINE` replaced by the set-id filter and the process tools."""
    if PRELUDE_LINE not in body:
        raise ValueError("an in-container program needs a prelude line")
    try:
        program = 'bytes.fromhex("' + setid_filter(native_arch()).hex() + '")'
    except OSError:  # an architecture without a filter: commands refuse to start (fail closed)
        program = "None"
    prelude = INSTALL_FILTER_SOURCE + "SETID = " + program + "\n" + PROCESS_TOOLS_SOURCE
    return body.replace(PRELUDE_LINE, prelude, 1)
