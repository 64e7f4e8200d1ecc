"""The warm pool (issue 14), side by side with cold starts in one run.

Run: .venv/bin/python bench/bench_pool.py [--repeat N] [--runs N] [--runtime runsc] [--quick]
Rows (each pooled measurement interleaved with its cold anchor, sample by sample or block by block):
* session acquire from a full warm pool (``DockerBackend(pool=4).session()``) against a cold
  ``session()`` + ``start()`` (create, start, verify, agent up) of a backend without a pool;
* acquire + first ``true`` against cold start + first ``true``;
* a copy of a 2,000-file workspace (8 KiB files, 16 MB) from a pool of copies
  (``DockerBackend(pool=PoolConfig(size=2, workspace="mirror")).session(copy_of=tree)``: the host copy
  into the member's directory, the push, then the first ``true``) against a cold mirrored session on the
  same tree (``DockerBackend(workspace_transport="mirror").session(workspace=tree)``: create, start,
  verify, push, first ``true``), and against a cold ``session(copy_of=tree)`` of a backend without a pool;
* ``--runs`` throw-away ``SandboxTool`` calls (a tool per call, closed after it: a fresh container each)
  through a pool of 4 against the same calls on a backend without a pool; total time until the last
  result, the time the backend's close then took (the pool's queued removals drained), and the
  containers of this process left after the close.

Sessions are closed outside the timed part on both sides; between pooled samples the pool is let refill,
so a sample is an acquire from a full pool (the steady state the pool exists for: a drained pool serves
at the rate it can create, the last row shows what that gives).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import docker
from _fixtures import TRUE, containers_of_this_process, owned_workspace, runtime_name
from _timing import Row, Stats, parser, print_section
from bench_mirror import make_tree

from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession, PoolConfig
from adk_sandbox.executor.tools import SandboxTool

POOL_SIZE = 4
TREE_FILES = 2000


def side_by_side(
    warm: Callable[[], DockerSession], cold: Callable[[], DockerSession], pool: DockerBackend, repeat: int
) -> tuple[Stats, Stats]:
    """Milliseconds of ``warm`` and ``cold`` (each returns the session it opened, closed untimed)."""
    samples: dict[str, list[float]] = {"warm": [], "cold": []}
    assert pool.pool is not None
    for i in range(repeat + 1):  # the first round is the warm-up
        order = [("warm", warm), ("cold", cold)] if i % 2 else [("cold", cold), ("warm", warm)]
        for name, fn in order:
            if name == "warm":
                assert pool.pool.wait_ready(120)
            started = time.perf_counter()
            session = fn()
            elapsed = (time.perf_counter() - started) * 1000
            session.close()
            if i:
                samples[name].append(elapsed)
    return Stats(tuple(samples["warm"])), Stats(tuple(samples["cold"]))


def copies_side_by_side(runtime: str | None, repeat: int) -> tuple[list[Row], list[str]]:
    """A 2,000-file workspace: a pooled copy against cold mirrored starts of the same tree, interleaved."""
    tree = Path(owned_workspace("adk-bench-pool-tree-"))
    make_tree(tree, TREE_FILES)
    copies = DockerBackend(runtime=runtime, pool=PoolConfig(size=2, workspace="mirror"))
    mirrored = DockerBackend(runtime=runtime, workspace_transport="mirror")
    try:

        def first(session: DockerSession) -> DockerSession:
            assert session.execute(TRUE).exit_code == 0
            return session

        samples: dict[str, list[float]] = {"pool": [], "mirror": [], "copy": []}
        fns: dict[str, Callable[[], DockerSession]] = {
            "pool": lambda: first(copies.session(copy_of=tree)),
            "mirror": lambda: first(mirrored.session(workspace=tree)),
            "copy": lambda: first(mirrored.session(copy_of=tree)),
        }
        order = list(fns)
        assert copies.pool is not None
        for i in range(repeat + 1):  # the first round is the warm-up
            for name in order[i % 3 :] + order[: i % 3]:
                if name == "pool":
                    assert copies.pool.wait_ready(120)
                started = time.perf_counter()
                session = fns[name]()
                elapsed = (time.perf_counter() - started) * 1000
                session.close()
                if i:
                    samples[name].append(elapsed)
        stats = copies.pool.stats()
    finally:
        copies.close()
        mirrored.close()
        shutil.rmtree(tree)
    pool, mirror, copy = (Stats(tuple(samples[name])) for name in ("pool", "mirror", "copy"))
    rt = runtime_name(runtime)
    rows = [
        Row.latency(
            f"{rt}: `session(copy_of=)` of a {TREE_FILES}-file tree from a pool of copies + first `true`",
            pool,
            "cold mirrored `session(workspace=)` of it + first `true`",
            mirror,
        ),
        Row.latency(
            f"{rt}: the same from the pool of copies",
            pool,
            "cold `session(copy_of=)` (no pool) + first `true`",
            copy,
        ),
    ]
    notes = [
        f"the {TREE_FILES}-file tree: 8 KiB files of random bytes in directories of 100 (16 MB); the pool "
        f"of copies refilled before each pooled sample; its counters after: {stats}",
    ]
    return rows, notes


def throwaway_runs(backend: DockerBackend, runs: int) -> float:
    """Seconds for ``runs`` one-call ``SandboxTool`` s (each opens a session, runs ``true``, closes)."""
    started = time.perf_counter()
    for _ in range(runs):
        with SandboxTool(backend) as tool:
            result = tool.run_sync({"language": "command", "code": "true", "timeout_secs": 30})
            assert result["status"] == "success", result
    return time.perf_counter() - started


def throwaway_side_by_side(
    pooled: DockerBackend, cold: DockerBackend, runs: int
) -> tuple[dict[str, float], int]:
    """Seconds of ``runs`` throw-away runs on each, in alternating blocks so drift hits both alike."""
    block = max(1, min(50, runs // 4))
    totals = {"pool": 0.0, "cold": 0.0}
    done = 0
    assert pooled.pool is not None
    while done < runs:
        n = min(block, runs - done)
        pooled.pool.wait_ready(120)
        totals["pool"] += throwaway_runs(pooled, n)
        totals["cold"] += throwaway_runs(cold, n)
        done += n
    return totals, block


def main() -> None:
    """Print the issue 14 warm-pool table."""
    args = parser(__doc__)
    args.add_argument("--repeat", type=int, default=40)
    args.add_argument("--runs", type=int, default=500, help="throw-away SandboxTool calls per side")
    args.add_argument("--runtime", default=None, help="e.g. runsc")
    options = args.parse_args()
    repeat = 5 if options.quick else options.repeat
    runs = 20 if options.quick else options.runs
    client = docker.from_env()
    rt = runtime_name(options.runtime)

    pooled = DockerBackend(runtime=options.runtime, pool=POOL_SIZE)
    cold = DockerBackend(runtime=options.runtime)
    try:

        def warm_acquire() -> DockerSession:
            return pooled.session()

        def cold_start() -> DockerSession:
            session = cold.session()
            session.start()
            return session

        split: dict[str, list[float]] = {"acquire": [], "first": []}

        def warm_first() -> DockerSession:
            started = time.perf_counter()
            session = pooled.session()
            acquired = time.perf_counter()
            assert session.execute(TRUE).exit_code == 0
            split["acquire"].append((acquired - started) * 1000)
            split["first"].append((time.perf_counter() - acquired) * 1000)
            return session

        def cold_first() -> DockerSession:
            session = cold.session()
            assert session.execute(TRUE).exit_code == 0
            return session

        acquire = side_by_side(warm_acquire, cold_start, pooled, repeat)
        first = side_by_side(warm_first, cold_first, pooled, repeat)
        rows = [
            Row.latency(
                f"{rt}: session acquire, pool of {POOL_SIZE}", acquire[0], "cold create + start", acquire[1]
            ),
            Row.latency(f"{rt}: acquire + first `true`", first[0], "cold start + first `true`", first[1]),
        ]
        target_notes = [
            f"targets: acquire p50 ≤ 10 ms: {acquire[0].p50:.2f} ms "
            f"({'met' if acquire[0].p50 <= 10 else 'NOT met'}); acquire + first command p50 ≤ 15 ms: "
            f"{first[0].p50:.2f} ms ({'met' if first[0].p50 <= 15 else 'NOT met'})",
            f"acquire + first `true` split: acquire p50 {Stats(tuple(split['acquire'])).p50:.2f} ms, the "
            f"first `true` after it p50 {Stats(tuple(split['first'])).p50:.2f} ms (while the refill runs)",
        ]
        copy_rows, copy_notes = copies_side_by_side(options.runtime, repeat)
        rows += copy_rows
        target_notes += copy_notes
        totals, block = throwaway_side_by_side(pooled, cold, runs)
        assert pooled.pool is not None
        stats = pooled.pool.stats()
    finally:
        closing = time.perf_counter()
        pooled.close()
        close_seconds = time.perf_counter() - closing
        cold.close()
    left = containers_of_this_process(client)
    rows.append(
        Row(
            f"{rt}: {runs} throw-away `SandboxTool` runs, pool of {POOL_SIZE}",
            f"{totals['pool']:.1f} s ({totals['pool'] / runs * 1000:.0f} ms/run)",
            "the same without a pool",
            f"{totals['cold']:.1f} s ({totals['cold'] / runs * 1000:.0f} ms/run)",
            totals["pool"] / totals["cold"],
        )
    )
    notes = [
        *target_notes,
        f"pool counters after the runs: {stats}; the pooled backend's close (drain) took "
        f"{close_seconds:.2f} s",
        f"containers of this process left after both closes: {len(left)}",
        f"throw-away runs in blocks of {block}, pool first, the pool refilled before each block; one "
        "caller, one call at a time",
    ]
    print_section(f"Issue 14: warm pool (bench/bench_pool.py, {rt}, repeat {repeat})", rows, notes)


if __name__ == "__main__":
    main()
