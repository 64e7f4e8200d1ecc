"""Every benchmark issue 11 asks for, in one go, as one Markdown table (plus notes) for BENCHMARKS.md.

Run: PYTHONPATH=. .venv/bin/python bench/run_issue11.py [--quick] [--no-gvisor] [--only 1,2,...]

1. warm ``true``: agent channel (≤ 2x host ``sh -c true``) and the bash tool (≤ 2.5x), runc and gVisor;
2. 16 sessions x 100 commands in parallel (≥ 300 commands/s, 0 failures, 0 containers left), runc and
   gVisor, against the runtime's in-sandbox floor (the same 16 containers each starting 100 processes
   from a loop inside: the most commands/s any channel could reach there);
3. 200 MB with a 4 KiB cap (≥ 1 GB/s, host RSS growth < 20 MB), runc;
4. session start + first command vs raw docker-py create + start + first exec (≤ 1.1x), runc and gVisor
   (step by step, and against the start-up probe before step 6: ``bench/split_start.py``);
5. the warm Rust pipeline in a Docker session (p50 ≤ 0.35 s) vs the same pipeline on the host;
6. CPU per command on the agent channel, against host ``sh -c true`` (runc).
Every row is measured side by side with its anchor; the load average is printed before each benchmark.
Benchmark 2 runs last by default: its 32 busy sessions lift the load average for minutes after it ends.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import replace

import bench_agent
import bench_docker
import bench_parallel
import bench_rust
from _timing import Row, load_note, markdown, parser


def main() -> None:
    args = parser(__doc__)
    args.add_argument("--no-gvisor", action="store_true", help="runc only")
    # 2 runs last: 32 containers' worth of busy threads raise the load average for a minute or more after.
    args.add_argument("--only", default="1,3,4,5,6,2", help="comma-separated benchmark numbers, run in order")
    options = args.parse_args()
    quick = options.quick
    runtimes: list[str | None] = [None] if options.no_gvisor else [None, "runsc"]
    notes: list[str] = []

    def cpu() -> list[Row]:
        rows, more = bench_agent.cpu_per_command(40 if quick else 200)
        notes.extend(more)
        return rows

    benchmarks: dict[str, Callable[[], list[Row]]] = {
        "1": lambda: [r for rt in runtimes for r in bench_agent.warm_true(rt, 15 if quick else 50)],
        "2": lambda: [r for rt in runtimes for r in bench_parallel.rows_for(rt, 16, 25 if quick else 100)],
        "3": lambda: bench_agent.flood(None, 3 if quick else 7),
        "4": lambda: [r for rt in runtimes for r in bench_docker.start_first_command(rt, 4 if quick else 10)],
        "5": lambda: bench_rust.warm_rows(5 if quick else 10),
        "6": cpu,
    }
    rows: list[Row] = []
    for number in options.only.split(","):
        started = time.perf_counter()
        note = load_note()
        print(f"benchmark {number} at {note}", file=sys.stderr, flush=True)
        try:
            got = [replace(row, what=f"{number}. {row.what}") for row in benchmarks[number]()]
        except Exception as exc:  # one broken benchmark must not lose the others' numbers
            traceback.print_exc()
            notes.append(f"benchmark {number} FAILED: {exc!r}")
            continue
        notes.append(f"benchmark {number}: {time.perf_counter() - started:.0f} s, started at {note}")
        print(markdown(got), file=sys.stderr, flush=True)
        rows += got
    print(f"## Issue 11 benchmarks ({'quick' if quick else 'full'} run), ended {load_note()}\n")
    print(markdown(sorted(rows, key=lambda row: row.what.split(".")[0])))
    print()
    for line in notes:
        print(f"* {line}")


if __name__ == "__main__":
    main()
