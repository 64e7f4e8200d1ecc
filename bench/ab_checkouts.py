"""Per-command cost, pool acquire and fork of two checkouts, alternated in one run (issue 33's "no change").

Run: .venv/bin/python bench/ab_checkouts.py OLD_SRC [--rounds N] [--quick]
where OLD_SRC is the ``src`` directory of another checkout (e.g. ``git worktree add /tmp/old REV`` then
``/tmp/old/src``). Each round runs one child process per checkout, old and new in turn (the order flips
every round), and each child measures, on the runc Docker backend:

* warm ``true`` in one session: the median ms per command over 3 blocks of 300;
* ``session()`` from a full warm pool of 4 (``DockerBackend(pool=4)``): the median of 15 acquires;
* ``fork()`` of a session copied into a pool by layer (changed before each fork, so each takes a new
  snapshot) + the fork's first ``true``: the median of 10.

The table gives each figure's median over the rounds for both checkouts and the ratio new/old.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NEW_SRC = HERE.parent / "src"


def measure(quick: bool) -> dict[str, float]:
    """The three figures of this interpreter's checkout (run in a child)."""
    from adk_sandbox.executor import ExecRequest  # noqa: PLC0415 - the checkout is chosen by PYTHONPATH
    from adk_sandbox.executor.backends.docker import DockerBackend, PoolConfig  # noqa: PLC0415

    true = ExecRequest(argv=["true"], timeout=10)
    touch = ExecRequest(argv=["sh", "-c", "date +%s%N > /work/repo/changed"], timeout=10)
    blocks, per_block, acquires, forks = (1, 50, 3, 3) if quick else (3, 300, 15, 10)
    figures: dict[str, float] = {}
    with DockerBackend() as backend, backend.session() as session:
        for _ in range(30):
            session.execute(true)
        costs = []
        for _ in range(blocks):
            started = time.perf_counter()
            for _ in range(per_block):
                session.execute(true)
            costs.append((time.perf_counter() - started) / per_block * 1000)
        figures["command_ms"] = statistics.median(costs)
    with DockerBackend(pool=4) as pooled:
        times = []
        for _ in range(acquires):
            assert pooled.pool is not None and pooled.pool.wait_ready(120)
            started = time.perf_counter()
            acquired = pooled.session()
            times.append((time.perf_counter() - started) * 1000)
            acquired.close()
        figures["acquire_ms"] = statistics.median(times)
    tree = Path(tempfile.mkdtemp(prefix="adk-bench-ab-", dir=Path.home() / ".cache"))
    (tree / "a.txt").write_text("a\n")
    pool = PoolConfig(size=4, workspace="mirror", path="/work/repo", forkable=True, fork_by="layer")
    try:
        with DockerBackend(pool=pool) as layered, layered.session(copy_of=str(tree)) as parent:
            parent.execute(true)
            times = []
            for _ in range(forks):
                assert layered.pool is not None and layered.pool.wait_ready(120)
                parent.execute(touch)  # a changed parent: each fork takes a new snapshot
                started = time.perf_counter()
                child = parent.fork()
                child.execute(true)
                times.append((time.perf_counter() - started) * 1000)
                child.close()
            figures["fork_ms"] = statistics.median(times)
    finally:
        subprocess.run(["rm", "-rf", str(tree)], check=False)
    return figures


def child(src: Path, quick: bool) -> dict[str, float]:
    """Run :func:`measure` in a fresh interpreter that imports the checkout at ``src``."""
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{HERE}"}
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", *(["--quick"] if quick else [])]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, cwd=src.parent)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    """Alternate the two checkouts and print the Markdown table."""
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("old_src", nargs="?", type=Path)
    args.add_argument("--rounds", type=int, default=3)
    args.add_argument("--quick", action="store_true")
    args.add_argument("--child", action="store_true")
    options = args.parse_args()
    if options.child:
        print(json.dumps(measure(options.quick)))
        return
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for round_number in range(options.rounds):
        order = [("old", options.old_src), ("new", NEW_SRC)]
        for name, src in order if round_number % 2 == 0 else reversed(order):
            runs[name].append(child(src, options.quick))
            print(f"round {round_number + 1} {name}: {runs[name][-1]}", file=sys.stderr)
    load = os.getloadavg()[0]
    print(f"load average {load:.2f}; medians over {options.rounds} rounds, old and new alternated\n")
    print("| figure | old | new | new/old |\n|---|---|---|---|")
    for key, label in [
        ("command_ms", "warm `true` per command"),
        ("acquire_ms", "pool acquire (`DockerBackend(pool=4).session()`)"),
        ("fork_ms", "pooled fork by layer + first `true`"),
    ]:
        old = statistics.median(run[key] for run in runs["old"])
        new = statistics.median(run[key] for run in runs["new"])
        print(f"| {label} | {old:.2f} ms | {new:.2f} ms | {new / old:.2f}x |")


if __name__ == "__main__":
    main()
