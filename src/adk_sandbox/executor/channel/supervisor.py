"""The in-container supervisor: runs one command and kills everything it leaves behind.

Docker's exec API cannot kill a command's process tree, and a process can hide from every marker a
killer could look for (a cleared environment, ``setsid``, ``PR_SET_DUMPABLE=0`` hiding
``/proc/PID/environ``, a double fork). What it cannot hide is its parentage. So each command runs under
:data:`SCRIPT` (the file ``inside/supervisor.py`` with the shared prelude of :mod:`.programs`), started
through the exec as ``python3 -I -S -c SCRIPT adk-sandbox run <marker> ...``
(``python3`` is the only thing a session image must provide; no file is installed in the image):

* ``run``: become a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``), so every orphan of the tree is
  re-parented to the supervisor instead of the container's init; fork the command into its own session
  with exactly the prepared environment and the set-id seccomp filter installed (:mod:`.setid`: gVisor
  does not apply the container's profile to exec'd processes); reap every child as it exits
  (re-parented orphans included, so zombies never fill the pids limit); when the command exits, SIGSTOP
  then SIGKILL every descendant (found through the ppid fields of ``/proc/*/stat``, readable even for
  non-dumpable processes) in passes until none is alive, reap until ``ECHILD`` and exit with the
  command's status (``128 + signal`` when signalled). Any catchable signal, and the command's own
  deadline (its timeout plus a second, a backstop for when the host cannot reach the daemon) do the same
  kill and exit.
* ``run-setid-allowed``: the same without the set-id filter, for a sandbox whose host asked for set-id
  modes to work (its workspace never reaches the host as a bind mount, and package managers install
  set-uid programs); only :func:`supervisor_argv` with ``setid_allowed=True`` asks for it. Every other
  argument is where ``run`` has it, so the killer and the sweeps find both alike.
* ``kill <marker>``: the host's killer on timeout or cancel. Finds *only* that command's supervisor (an
  exec root, ppid 0, whose argv carries the marker), kills its descendants, then the supervisor itself
  (which may have been stopped by the command it runs), then sweeps.
* ``survey``: run once per container before its first command; prints the container's own processes
  (PID 1 and what descends from it, e.g. the keeper) as ``pid:starttime``, which every sweep spares.

The **orphan sweep** closes the last hole: a command can SIGKILL its own supervisor (same uid), and then
its processes are re-parented to PID 1. Any process whose parent is PID 1 and that is not one of the
surveyed processes is such an escapee; it is killed with its descendants. Processes of other commands
are never touched: they descend from their own live supervisor (an exec root), never from PID 1.

Without ``PR_SET_CHILD_SUBREAPER`` (gVisor before 2023 answers ``EINVAL``), orphans of *every* command go
to PID 1. The sweep then spares the orphans it can attribute to another live command (its marker in
``ADK_SANDBOX_EXEC`` in the environment, or the session of that command's process) and kills the rest:
on such a kernel a neighbour's orphan that cleared its environment *and* called ``setsid`` is killed by
the next command that ends.

Signals are sent through a pidfd after re-checking the target's start time, so a pid reused by another
process between the scan of ``/proc`` and the signal is never hit.
"""

from __future__ import annotations

from adk_sandbox.executor.channel.programs import in_container_program, program_text

__all__ = [
    "ARGV0",
    "MARKER_VARIABLE",
    "RUN",
    "RUN_SETID_ALLOWED",
    "SCRIPT",
    "killer_argv",
    "parse_survey",
    "supervisor_argv",
    "survey_argv",
]

#: The command's environment carries this variable set to the command's marker (attribution of orphans on
#: kernels without child subreapers).
MARKER_VARIABLE = "ADK_SANDBOX_EXEC"

#: The first argument after the script: makes the supervisor recognisable in ``ps`` and in ``/proc``.
ARGV0 = "adk-sandbox"

#: The mode that runs a command under the set-id filter (the default).
RUN = "run"
#: The mode that runs a command without the set-id filter: the host's explicit opt-in, never a default.
RUN_SETID_ALLOWED = "run-setid-allowed"

#: Extra time the supervisor gives the command beyond its timeout before killing it by itself. The host's
#: killer normally comes first; this backstop only matters when the host cannot reach the daemon.
BACKSTOP_SECONDS = 1.0

#: The supervisor program, run as ``python3 -I -S -c SCRIPT adk-sandbox MODE ...`` (``sys.argv[0]`` is ``-c``,
#: then ARGV0, MODE, ...). Standard library only, no site: starts in a few milliseconds.
SCRIPT = in_container_program(program_text("supervisor.py"))
_PREFIX = ("python3", "-I", "-S", "-c", SCRIPT, ARGV0)


def supervisor_argv(
    marker: str,
    protected: str,
    timeout: float,
    env: dict[str, str],
    argv: tuple[str, ...],
    *,
    setid_allowed: bool = False,
) -> list[str]:
    """The exec argv that runs ``argv`` under a supervisor with exactly ``env`` (plus the marker).

    ``protected`` is a :func:`parse_survey` result; the supervisor kills the command by itself
    :data:`BACKSTOP_SECONDS` after ``timeout``. The command gets the set-id filter unless
    ``setid_allowed`` (mode :data:`RUN_SETID_ALLOWED` instead of :data:`RUN`: the only difference).
    """
    mode = RUN_SETID_ALLOWED if setid_allowed else RUN
    return [
        *_PREFIX, mode, marker, protected, f"{timeout + BACKSTOP_SECONDS:.3f}", str(len(env)),
        *(f"{name}={value}" for name, value in env.items()), *argv,
    ]  # fmt: skip


def killer_argv(marker: str, protected: str, *, strict: bool) -> list[str]:
    """The exec argv that kills the tree of the command run with ``marker`` (if any) and sweeps orphans."""
    return [*_PREFIX, "kill", marker, protected, "strict" if strict else "lenient"]


def survey_argv() -> list[str]:
    """The exec argv that lists the container's own processes (see :func:`parse_survey`)."""
    return [*_PREFIX, "survey"]


def parse_survey(stdout: str) -> tuple[bool, str] | None:
    """``(strict, protected)`` from a survey's output, or None if it is not one.

    ``strict``: the kernel supports child subreapers, so an orphan at PID 1 never belongs to a live
    command. ``protected``: the container's own processes as ``pid:starttime,...``.
    """
    words = stdout.split()
    if len(words) != 2 or words[0] not in ("strict", "lenient"):
        return None
    return words[0] == "strict", words[1]
