"""Pause and resume in place (``session.pause(keep_memory=True)``), runc and gVisor (issue 36's first step).

Run: PYTHONPATH=. .venv/bin/python bench/bench_pause.py [--quick] [--runtimes runc,runsc]
Prints a Markdown table for BENCHMARKS.md, for each runtime, with a session whose background program
holds 200 MB of touched memory:

* ``session.resume()`` of a paused session, and the first command after it (what a caller waits for),
  against a command of the same session that was never paused (the anchor: what resuming adds);
* ``session.pause(keep_memory=True)``.

The issue's target for resume is p50 ≤ 300 ms; a frozen session keeps its memory (the host's memory of a
paused session, ≤ 1 MiB, needs the checkpoint to disk, not built yet: docs/pause.md).
"""

from __future__ import annotations

import time

from _timing import Row, Stats, parser, print_section

from adk_sandbox.executor import ExecRequest
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from adk_sandbox.executor.types import ResourceLimits

HOLDER = (
    "import time\nblock = bytearray(200 * 1024 * 1024)\n"
    "for i in range(0, len(block), 4096):\n    block[i] = 1\ntime.sleep(100000)\n"
)
TRUE = ExecRequest(argv=("true",), timeout=30)


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def measure(runtime: str | None, rounds: int) -> list[Row]:
    name = runtime or "runc"
    limits = ResourceLimits(memory_mb=512)
    with DockerBackend(runtime=runtime, limits=limits) as backend, backend.session() as session:
        held = session.execute(
            ExecRequest(
                argv=("sh", "-c", 'python3 -c "$HOLDER" >/dev/null 2>&1 &'),
                env={"HOLDER": HOLDER},
                timeout=60,
                background=True,
            )
        )
        assert held.exit_code == 0, held
        time.sleep(3)  # the 200 MB touched
        pauses, resumes, firsts, plain = [], [], [], []
        for _ in range(rounds):
            started = time.perf_counter()
            session.pause(keep_memory=True)
            pauses.append(_ms(started))
            time.sleep(0.05)
            started = time.perf_counter()
            session.resume()
            resumes.append(_ms(started))
            started = time.perf_counter()
            session.execute(TRUE)
            firsts.append(_ms(started))
            started = time.perf_counter()
            session.execute(TRUE)
            plain.append(_ms(started))
        _check_alive(session)
    anchor = "a command of the same session, never paused"
    return [
        Row(
            f"{name}: `resume()` of a session holding 200 MB",
            f"p50 {Stats(tuple(resumes)).p50:.1f} / p99 {Stats(tuple(resumes)).p99:.1f} ms",
            "",
            "",
            None,
            "p50 ≤ 300 ms",
            Stats(tuple(resumes)).p50 <= 300,
        ),
        Row.latency(
            f"{name}: the first command after `resume()`", Stats(tuple(firsts)), anchor, Stats(tuple(plain))
        ),
        Row(
            f"{name}: `pause(keep_memory=True)`",
            f"p50 {Stats(tuple(pauses)).p50:.1f} / p99 {Stats(tuple(pauses)).p99:.1f} ms",
            "",
            "",
        ),
    ]


def _check_alive(session: DockerSession) -> None:
    result = session.execute(
        ExecRequest(argv=("sh", "-c", "pgrep -f 'bytearray' >/dev/null && echo up"), timeout=30)
    )
    assert result.stdout.strip() == "up", "the program holding the memory did not survive the pauses"


def main() -> None:
    args = parser(__doc__)
    args.add_argument("--runtimes", default="runc,runsc", help="comma-separated: runc, runsc")
    options = args.parse_args()
    rounds = 10 if options.quick else 50
    rows: list[Row] = []
    for runtime in filter(None, options.runtimes.split(",")):
        rows += measure(None if runtime == "runc" else runtime, rounds)
    print_section("Pause and resume in place (issue 36)", rows, ["ratio: our p50 / the anchor's p50"])


if __name__ == "__main__":
    main()
