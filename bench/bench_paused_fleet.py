"""Many idle sessions paused to disk at once: what each costs the host, and that they resume.

Run: PYTHONPATH=. .venv/bin/python bench/bench_paused_fleet.py [--count 1000] [--runtime runc|runsc]
[--threads 2] [--sample 50]

``--count`` sessions of ``DockerBackend(runtime=..., checkpoints=True)`` are started and paused to disk,
``--threads`` at a time. Then, all of them paused together:

* the host memory of their own processes (every process in a paused session's cgroup, or naming its
  container: gVisor's sandbox), which a checkpoint to disk should make nothing;
* what they cost the engine: the growth of dockerd's and containerd's resident memory (their records of
  each stopped container), and this process's (the session objects), with its open descriptors;
* the disk each takes: its checkpoint and its container's directory (the engine's record and logs);
* a random ``--sample`` of them resumed, each by a command that must answer, and the time each took.

The issue's target is 10,000 paused sessions on a 24 GiB machine, at most 4 MiB of disk each for an idle
one, each resumable; the figures per session say what a larger count would take.
"""

from __future__ import annotations

import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from _timing import Row, Stats, containers_rss_kib, daemon_pid, parser, pid_rss_kib, print_section, rss_kib

from adk_sandbox.executor import ExecRequest
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession

TRUE = ExecRequest(argv=("true",), timeout=60)


def _engine_kib() -> int:
    """The resident memory of dockerd and containerd together (KiB)."""
    return pid_rss_kib(daemon_pid("dockerd")) + pid_rss_kib(daemon_pid("containerd"))


def _disk_bytes(path: str) -> int:
    return sum(
        os.lstat(os.path.join(parent, name)).st_blocks * 512
        for parent, _, names in os.walk(path)
        for name in names
    )


def _paused(session: DockerSession) -> float:
    """Start ``session`` and pause it to disk; milliseconds for both."""
    started = time.perf_counter()
    session.start()
    session.pause()
    return (time.perf_counter() - started) * 1000


def _resumed(session: DockerSession) -> float | None:
    """Milliseconds until a command of the paused ``session`` answered (None: it did not)."""
    started = time.perf_counter()
    ok = session.execute(TRUE).exit_code == 0
    return (time.perf_counter() - started) * 1000 if ok else None


def measure(runtime: str, count: int, threads: int, sample: int) -> list[Row]:
    """The fleet's rows (see the module's docstring)."""
    with DockerBackend(runtime=runtime, checkpoints=True) as backend:
        root = backend._client.info()["DockerRootDir"]
        engine_before, own_before = _engine_kib(), rss_kib()
        fds_before = len(os.listdir("/proc/self/fd"))
        sessions = [backend.session() for _ in range(count)]
        try:
            started = time.perf_counter()
            made = []
            with ThreadPoolExecutor(threads) as pool:
                for done, ms in enumerate(pool.map(_paused, sessions), 1):
                    made.append(ms)
                    if done % 500 == 0:  # progress, on stderr: a long run can be followed (and cut short)
                        grown = (_engine_kib() - engine_before) / 1024
                        typical = Stats(tuple(made)).p50
                        print(
                            f"{done} paused, engine +{grown:.0f} MiB, p50 so far {typical:.0f} ms",
                            file=sys.stderr,
                            flush=True,
                        )
            making = time.perf_counter() - started
            assert all(session.paused for session in sessions)
            ids = {session.container_id for session in sessions}
            sandbox = containers_rss_kib(ids)
            engine_growth, own_growth = _engine_kib() - engine_before, rss_kib() - own_before
            fds = len(os.listdir("/proc/self/fd")) - fds_before
            directories = [os.path.join(root, "containers", container) for container in ids]
            checkpoints = sum(_disk_bytes(os.path.join(path, "checkpoints")) for path in directories)
            records = sum(_disk_bytes(path) for path in directories) - checkpoints
            chosen = random.sample(sessions, min(sample, count))
            times = [_resumed(session) for session in chosen]
        finally:
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(DockerSession.close, sessions))
    resumed = [ms for ms in times if ms is not None]
    return [
        Row(
            f"{count} idle sessions paused to disk together: their own processes' host memory",
            f"{sandbox} KiB in all",
            "",
            "",
            None,
            "≤ 1 MiB each",
            sandbox <= 1024 * count,
        ),
        Row(
            "the engine's memory (dockerd + containerd) for them",
            f"+{engine_growth / 1024:.0f} MiB, {engine_growth / count:.0f} KiB each",
            "",
            "",
        ),
        Row(
            "this process for them (the session objects)",
            f"+{own_growth / 1024:.0f} MiB, {own_growth / count:.0f} KiB each; {fds} more open descriptors",
            "",
            "",
        ),
        Row(
            "disk each: the checkpoint / the container's directory",
            f"{checkpoints / count / 2**20:.2f} / {records / count / 2**20:.2f} MiB",
            "",
            "",
            None,
            "≤ 4 MiB",
            (checkpoints + records) / count <= 4 * 2**20,
        ),
        Row(
            f"started and paused, {threads} at a time",
            f"p50 {Stats(tuple(made)).p50:.0f} ms each, {making / 60:.1f} min in all",
            "",
            "",
        ),
        Row(
            f"a random {len(chosen)} of them resumed by a command",
            f"{len(resumed)}/{len(chosen)}, p50 {Stats(tuple(resumed or [0.0])).p50:.0f} ms",
            "",
            "",
            None,
            "each resumable",
            len(resumed) == len(chosen),
        ),
    ]


def main() -> None:
    args = parser(__doc__)
    args.add_argument("--count", type=int, default=1000, help="how many sessions to pause")
    args.add_argument("--runtime", default="runc", choices=["runc", "runsc"])
    args.add_argument("--threads", type=int, default=2, help="sessions started and paused at once")
    args.add_argument("--sample", type=int, default=50, help="how many of them to resume")
    options = args.parse_args()
    count = 20 if options.quick else options.count
    rows = measure(options.runtime, count, options.threads, options.sample)
    print_section(f"Paused sessions at scale, {options.runtime} (issue 36)", rows)


if __name__ == "__main__":
    main()
