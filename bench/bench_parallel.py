"""Many sessions at once (issue 11, benchmark 2): 16 threads, one session each, 100 commands each.

Run: PYTHONPATH=. .venv/bin/python bench/bench_parallel.py [--quick] [--runtimes runc,runsc]
Sessions start first (untimed, in parallel); then every thread runs its commands at once. Reports total
commands/s (target ≥ 300/s), p50/p99 per command, failures (must be 0) and this process's containers left
after every session and backend closed (must be 0, counted by the owner label as tests/conftest.py does).
The anchor (the exec transport, once measured alongside, was removed: docs/docker/agent-channel.md)
is the runtime's own floor (:func:`in_sandbox_floor`): the same 16 containers each starting 100 processes
from a loop inside, one command each, so the channel is out of the way: the most commands/s any channel
could reach there (gVisor: every process start goes through the sentry).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import docker
from _fixtures import containers_of_this_process, owned_workspace, runtime_name
from _timing import Row, Stats, parser, print_section

from adk_sandbox.executor import ExecRequest, Language
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession


@dataclass(frozen=True)
class ParallelRun:
    """The outcome of one parallel run."""

    commands: int
    seconds: float
    latency: Stats
    failures: int
    left: int

    @property
    def rate(self) -> float:
        """Commands per second over the whole run."""
        return self.commands / self.seconds


#: The in-sandbox floor's loop: what one session command costs the container's kernel (gVisor: the
#: sentry), without the channel. A session command is a fork (of the agent, or its spare shim), an
#: ``execve`` of ``/bin/sh -c -- 'echo sN'`` (the ``echo`` is sh's builtin), its exit and its parent's
#: wait; here ``sh`` forks and ``execve`` s the same ``sh -c -- 'echo sN'`` in a loop, with every
#: ``echo`` going to the same stdout. (The agent's shim also ``vfork`` s: a floor, not a copy.)
_FLOOR_LOOP = 'i=0; while [ "$i" -lt "$1" ]; do /bin/sh -c -- "echo $2" || exit 1; i=$((i + 1)); done'


def _in_parallel(
    runtime: str | None, sessions: int, work: Callable[[int, DockerSession], list[str]]
) -> tuple[float, list[str], int]:
    """Open ``sessions`` sessions, start them (untimed), then run ``work`` in each at once.

    Returns the seconds from the release to the last thread's end, what the threads counted as failures
    and this process's containers left after every session and the backend closed. ``work`` returns its
    failures (an exception in it counts as one).
    """
    workspace = owned_workspace()
    backend = DockerBackend(runtime=runtime)
    opened: list[DockerSession] = [backend.session(workspace=workspace) for _ in range(sessions)]
    failures: list[str] = []
    lock = threading.Lock()
    ready = threading.Barrier(sessions + 1)

    def worker(index: int, session: DockerSession) -> None:
        try:
            session.start()
        except BaseException:
            ready.abort()  # the run cannot be what it claims: stop every thread and the caller
            raise
        ready.wait()
        try:
            mine = work(index, session)
        except Exception as exc:  # counted and reported, the run goes on
            mine = [repr(exc)]
        with lock:
            failures.extend(mine)

    threads = [threading.Thread(target=worker, args=(i, s)) for i, s in enumerate(opened)]
    try:
        for thread in threads:
            thread.start()
        ready.wait(timeout=600)
        started = time.perf_counter()
        for thread in threads:
            thread.join()
        seconds = time.perf_counter() - started
    finally:
        for session in opened:
            session.close()
        backend.close()
    client = docker.from_env()
    left = len(containers_of_this_process(client))
    client.close()
    for failure in failures[:3]:
        print(f"failure: {failure}")
    return seconds, failures, left


def parallel(runtime: str | None, sessions: int, commands: int) -> ParallelRun:
    """``sessions`` threads, one session each, ``commands`` ``echo`` s each, all released at once."""
    latencies: list[float] = []
    lock = threading.Lock()

    def work(index: int, session: DockerSession) -> list[str]:
        request = ExecRequest(language=Language.COMMAND, code=f"echo s{index}", timeout=120)
        mine, failures = [], []
        for _ in range(commands):
            started = time.perf_counter()
            try:
                result = session.execute(request)
                if result.exit_code != 0 or result.stdout != f"s{index}\n":
                    failures.append(f"exit {result.exit_code}: {result.stdout!r} {result.stderr!r}")
            except Exception as exc:  # counted and reported, the run goes on
                failures.append(repr(exc))
            mine.append((time.perf_counter() - started) * 1000)
        with lock:
            latencies.extend(mine)
        return failures

    seconds, failures, left = _in_parallel(runtime, sessions, work)
    return ParallelRun(sessions * commands, seconds, Stats(tuple(latencies)), len(failures), left)


def in_sandbox_floor(runtime: str | None, sessions: int, commands: int) -> ParallelRun:
    """The runtime's own ceiling: each of ``sessions`` containers starts ``commands`` processes in a loop.

    The same containers as the benchmark's (sessions of the same backend, all released at once), but one
    command each: :data:`_FLOOR_LOOP`, so the channel's cost is paid once per container instead of once
    per process. ``rate`` is then the most commands per second this runtime can start on this machine
    with this parallelism; its latency is per container (the whole loop), not per command.
    """
    latencies: list[float] = []
    lock = threading.Lock()

    def work(index: int, session: DockerSession) -> list[str]:
        request = ExecRequest(
            argv=("/bin/sh", "-c", _FLOOR_LOOP, "adk-bench-floor", str(commands), f"s{index}"),
            timeout=600,
        )
        started = time.perf_counter()
        result = session.execute(request)
        with lock:
            latencies.append((time.perf_counter() - started) * 1000)
        if result.exit_code != 0 or result.stdout != f"s{index}\n" * commands:
            return [f"floor loop: exit {result.exit_code}, {result.stdout[-80:]!r} {result.stderr[-200:]!r}"]
        return []

    seconds, failures, left = _in_parallel(runtime, sessions, work)
    return ParallelRun(sessions * commands, seconds, Stats(tuple(latencies)), len(failures), left)


def rows_for(runtime: str | None, sessions: int, commands: int) -> list[Row]:
    """Agent channel against the in-sandbox floor, same sessions, for one runtime."""
    ours = parallel(runtime, sessions, commands)
    floor = in_sandbox_floor(runtime, sessions, commands)
    rt = runtime_name(runtime)
    shape = f"{sessions} sessions x {commands}"
    floor_name = f"in-sandbox floor: {sessions} containers, each `sh` starting {commands} `sh -c 'echo'`"
    return [
        Row(
            f"{rt}: {shape} `echo`, total rate",
            f"{ours.rate:.0f} commands/s ({ours.seconds:.1f} s)",
            floor_name,
            f"{floor.rate:.0f} processes/s ({floor.seconds:.1f} s, {floor.failures} failures)",
            ours.rate / floor.rate,
            "≥ 300/s",
            ours.rate >= 300,
        ),
        Row(
            f"{rt}: {shape}, per command",
            f"p50 {ours.latency.p50:.2f} / p99 {ours.latency.p99:.2f} ms",
            "",
            "",
        ),
        Row(
            f"{rt}: {shape}, failures / containers left",
            f"{ours.failures} / {ours.left}",
            "",
            "",
            None,
            "0 / 0",
            ours.failures == 0 and ours.left == 0,
        ),
    ]


def main() -> None:
    args = parser(__doc__)
    args.add_argument("--runtimes", default="runc,runsc", help="comma-separated: runc, runsc")
    options = args.parse_args()
    rows: list[Row] = []
    for name in options.runtimes.split(","):
        runtime = None if name == "runc" else name
        commands = 25 if options.quick else 100
        rows += rows_for(runtime, 16, commands)
    print_section("16 sessions in parallel (benchmark 2)", rows)


if __name__ == "__main__":
    main()
