"""Many sessions at once (issue 11, benchmark 2): 16 threads, one session each, 100 commands each.

Run: PYTHONPATH=. .venv/bin/python bench/bench_parallel.py [--quick] [--runtimes runc,runsc]
Sessions start first (untimed, in parallel); then every thread runs its commands at once. Reports total
commands/s (target ≥ 300/s), p50/p99 per command, failures (must be 0) and this process's containers left
after every session and backend closed (must be 0, counted by the owner label as tests/conftest.py does).
The exec transport (one Docker exec per command) is the anchor, with fewer commands per session (it costs
~100x the CPU per command, so 1600 of them would take minutes on a small machine).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import docker
from _fixtures import containers_of_this_process, owned_workspace, runtime_name
from _timing import Row, Stats, parser, print_section

from executor import ExecRequest, Language
from executor.backends.docker import DockerBackend, DockerSession


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


def parallel(runtime: str | None, transport: str, sessions: int, commands: int) -> ParallelRun:
    """``sessions`` threads, one session each, ``commands`` ``echo`` s each, all released at once."""
    workspace = owned_workspace()
    backend = DockerBackend(runtime=runtime, transport=transport)
    opened: list[DockerSession] = [backend.session(workspace=workspace) for _ in range(sessions)]
    latencies: list[float] = []
    failures: list[BaseException | str] = []
    lock = threading.Lock()
    ready = threading.Barrier(sessions + 1)

    def worker(index: int, session: DockerSession) -> None:
        try:
            session.start()
        except BaseException:
            ready.abort()  # the run cannot be what it claims: stop every thread and the caller
            raise
        request = ExecRequest(language=Language.COMMAND, code=f"echo s{index}", timeout=120)
        ready.wait()
        mine = []
        for _ in range(commands):
            started = time.perf_counter()
            try:
                result = session.execute(request)
                if result.exit_code != 0 or result.stdout != f"s{index}\n":
                    with lock:
                        failures.append(f"exit {result.exit_code}: {result.stdout!r} {result.stderr!r}")
            except Exception as exc:  # counted and reported, the run goes on
                with lock:
                    failures.append(exc)
            mine.append((time.perf_counter() - started) * 1000)
        with lock:
            latencies.extend(mine)

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
        print(f"failure ({transport}): {failure!r}")
    return ParallelRun(sessions * commands, seconds, Stats(tuple(latencies)), len(failures), left)


def rows_for(runtime: str | None, sessions: int, commands: int, exec_commands: int) -> list[Row]:
    """Agent channel against the exec transport, same sessions, for one runtime."""
    ours = parallel(runtime, "agent", sessions, commands)
    anchor = parallel(runtime, "exec", sessions, exec_commands)
    rt = runtime_name(runtime)
    shape = f"{sessions} sessions x {commands}"
    anchor_name = f"exec transport, {sessions} x {exec_commands}"
    return [
        Row(
            f"{rt}: {shape} `echo`, total rate",
            f"{ours.rate:.0f} commands/s ({ours.seconds:.1f} s)",
            anchor_name,
            f"{anchor.rate:.1f} commands/s ({anchor.seconds:.1f} s)",
            ours.rate / anchor.rate,
            "≥ 300/s",
            ours.rate >= 300,
        ),
        Row.latency(f"{rt}: {shape}, per command", ours.latency, anchor_name, anchor.latency),
        Row(
            f"{rt}: {shape}, failures / containers left",
            f"{ours.failures} / {ours.left}",
            anchor_name,
            f"{anchor.failures} / {anchor.left}",
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
        rows += rows_for(runtime, 16, commands, 5 if options.quick else 15)
    print_section("16 sessions in parallel (benchmark 2)", rows)


if __name__ == "__main__":
    main()
