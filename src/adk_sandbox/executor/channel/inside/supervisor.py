# adk-sandbox supervisor (executor/channel/inside/supervisor.py)
import os
import signal
import sys
import time

# @CHECK-ONLY@
# For the checkers only (not shipped, see executor/channel/programs.py): what the prelude defines.
from collections.abc import Callable
from types import FrameType

from adk_sandbox.executor.channel.inside.prelude import (
    Procs,
    argv_of,
    below,
    kill_all,
    marker_of,
    parse_protected,
    scan,
    send,
)
from adk_sandbox.executor.channel.inside.setid_filter import SETID, install_setid_filter

# @END-CHECK-ONLY@
# @PRELUDE@
A = sys.argv
SELF = os.getpid()
MARK = b"ADK_SANDBOX_EXEC="
# The two modes that run a command (executor/channel/supervisor.py): "run" installs the set-id filter on
# it, "run-setid-allowed" (the host's explicit opt-in) does not. Both keep every other argument where
# "run" has it, so the killer and the sweeps find either supervisor by the same positions.
RUN_MODES = (b"run", b"run-setid-allowed")


def subreaper() -> "bool":
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # type: ignore[no-any-return]
    except Exception:
        return False


def supervisors(procs: "Procs") -> "dict[int, bytes]":
    found: "dict[int, bytes]" = {}
    for p, info in procs.items():
        if info[0] == 0 and p not in (1, SELF):
            argv = argv_of(p)
            if len(argv) > 7 and argv[5] == b"adk-sandbox" and argv[6] in RUN_MODES:
                found[p] = argv[7]
    return found


def escapees(
    procs: "Procs", mine: "bytes", protected: "set[tuple[int, bytes]]", strict: "bool"
) -> "set[int]":
    roots = [p for p, i in procs.items() if i[0] == 1 and (p, i[2]) not in protected]
    if roots and not strict:
        others = dict((p, m) for p, m in supervisors(procs).items() if m != mine)
        sessions = set(p for p, i in procs.items() if i[0] in others)
        markers = set(others.values())
        roots = [p for p in roots if procs[p][1] not in sessions and marker_of(p) not in markers]
    return set(roots) | below(roots, procs)


def reap() -> "bool":
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        return True
    return False


def run(filtered: "bool" = True) -> "None":
    marker, protected, timeout, n = A[3].encode(), parse_protected(A[4]), float(A[5]), int(A[6])
    env = dict(e.split("=", 1) for e in A[7 : 7 + n])
    env["ADK_SANDBOX_EXEC"] = A[3]
    argv = A[7 + n :]
    strict = subreaper()
    skip = (
        signal.SIGKILL,
        signal.SIGSTOP,
        signal.SIGCHLD,
        signal.SIGCONT,
        signal.SIGWINCH,
        signal.SIGURG,
        signal.SIGTSTP,
        signal.SIGTTIN,
        signal.SIGTTOU,
    )
    handled: "list[int]" = []

    def finish() -> "None":
        signal.pthread_sigmask(signal.SIG_BLOCK, handled)
        mine: "Callable[[Procs], set[int]]" = lambda procs: (
            below([SELF], procs) | escapees(procs, marker, protected, strict)
        )
        end = time.monotonic() + 5
        while True:
            kill_all(mine)
            if reap() or not strict or time.monotonic() > end:
                return
            time.sleep(0.001)

    def on_signal(sig: "int", frame: "FrameType | None") -> "None":
        finish()
        os._exit(137 if sig == signal.SIGALRM else 128 + sig)

    s: "int"
    for s in signal.valid_signals():
        if s not in skip:
            try:
                signal.signal(s, on_signal)
                handled.append(s)
            except (OSError, ValueError, RuntimeError):
                pass
    for s in (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU):  # a command must not stop its supervisor
        signal.signal(s, signal.SIG_IGN)
    child = os.fork()
    if child == 0:
        try:
            for s in handled + [signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU]:
                try:
                    signal.signal(s, signal.SIG_DFL)  # Python ignores SIGPIPE and SIGXFSZ: not the command
                except (OSError, ValueError, RuntimeError):
                    pass
            os.setsid()
            if filtered:
                if SETID is None:
                    raise OSError(95, "no set-id seccomp filter for this architecture")
                install_setid_filter(SETID)  # before exec: the command can never lift it
            os.execvpe(argv[0], argv, env)
        except OSError as e:
            os.write(2, ("%s: %s\n" % (argv[0], e.strerror)).encode())
            os._exit(127 if e.errno == 2 else 126)
        finally:
            os._exit(126)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            break
    finish()
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status))


def kill() -> "None":
    marker, protected, strict = A[3].encode(), parse_protected(A[4]), A[5] == "strict"
    procs = scan()
    sups = [p for p, m in supervisors(procs).items() if m == marker]
    procs = kill_all(lambda procs: below(sups, procs) | escapees(procs, marker, protected, strict))
    for p in sups:
        if p in procs:
            send(p, procs[p][2], signal.SIGKILL)
    kill_all(lambda procs: escapees(procs, marker, protected, strict))


def survey() -> "None":
    procs = scan()
    mine = set([1]) | below([1], procs)
    sys.stdout.write(
        "%s %s\n"
        % (
            "strict" if subreaper() else "lenient",
            ",".join("%d:%s" % (p, procs[p][2].decode()) for p in sorted(mine) if p in procs),
        )
    )


MODES: "dict[str, Callable[[], None]]" = {
    "run": run,
    "run-setid-allowed": lambda: run(filtered=False),
    "kill": kill,
    "survey": survey,
}
MODES[A[2]]()
