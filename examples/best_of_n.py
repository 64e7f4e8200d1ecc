"""Best of n from one prepared state: prepare a repository once, fork eight, patch each, keep the best.

Run: .venv/bin/python examples/best_of_n.py [--n 8] [--runtime runsc]

A small repository with a failing test is copied into a session (``copy_of``) at ``/work/repo`` inside,
"prepared" there once (a build step writes a cache into ``/tmp`` and HOME, as an install would), and
snapshotted. Eight sessions start from the snapshot, from a warm pool whose members' workspaces are at that
same path (``PoolConfig(path=...)``). Each applies a different candidate patch and runs the tests; the best
(most tests passing, then fastest) is kept: its files are copied out before the sessions close. The rest
are discarded, the snapshot removed; the last line says how many containers of this process are left (0).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker

from adk_sandbox.executor import ExecRequest, Language
from adk_sandbox.executor._owner import OWNER_PID, PROJECT_LABEL
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession, PoolConfig

REPO = "/work/repo"
SOURCE = """def mean(values):
    return sum(values) / len(values)
"""
TESTS = """import unittest
from stats import mean


class MeanTest(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2, 3]), 2)

    def test_empty(self):
        self.assertEqual(mean([]), 0)

    def test_generator(self):
        self.assertEqual(mean(x for x in [2, 4]), 3)


if __name__ == "__main__":
    unittest.main()
"""
#: Candidate patches, as a model might propose them: each replaces stats.py.
CANDIDATES = [
    "def mean(values):\n    return sum(values) / len(values)\n",
    "def mean(values):\n    return sum(values) / max(len(values), 1)\n",
    "def mean(values):\n    values = list(values)\n    return sum(values) / len(values)\n",
    "def mean(values):\n    values = list(values)\n    return sum(values) / len(values) if values else 0\n",
    "def mean(values):\n    return 0\n",
    "def mean(values):\n    values = list(values)\n    return sum(values) // max(len(values), 1)\n",
    "def mean(values):\n    values = list(values)\n    if not values:\n        return 0\n"
    "    return sum(values) / len(values)\n",
    "def mean(values):\n    raise NotImplementedError\n",
]


def run(session: DockerSession, code: str, timeout: float = 60) -> tuple[int | None, str]:
    """Run a shell command in ``session``: its exit code and output."""
    result = session.execute(ExecRequest(language=Language.COMMAND, code=code, timeout=timeout))
    return result.exit_code, result.stdout + result.stderr


def try_candidate(session: DockerSession, index: int) -> tuple[int, float, int]:
    """Apply candidate ``index`` in ``session`` and run the tests: (tests passed, seconds, index)."""
    patch = CANDIDATES[index % len(CANDIDATES)]
    Path(session.workspace or "", "stats.py").write_text(patch)  # the host copy: pushed before the command
    started = time.monotonic()
    _, output = run(session, "python3 -m unittest -v test_stats 2>&1 | tail -n +1; cat /tmp/prepared")
    passed = output.count("... ok")
    return passed, time.monotonic() - started, index


def containers_of_this_process(client: docker.DockerClient) -> int:
    """How many of this project's containers name this process as their owner (running or not)."""
    selector = [PROJECT_LABEL, f"{OWNER_PID}={os.getpid()}"]
    return len(client.containers.list(all=True, sparse=True, filters={"label": selector}))


def main() -> None:
    """Prepare once, fork ``--n``, keep the best (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--runtime", default=None)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="best-of-n-"))
    source = scratch / "repo"
    source.mkdir()
    (source / "stats.py").write_text(SOURCE)
    (source / "test_stats.py").write_text(TESTS)
    kept = scratch / "best"
    backend = DockerBackend(runtime=args.runtime, pool=PoolConfig(size=args.n, workspace="mirror", path=REPO))
    try:
        with backend.session(copy_of=source) as parent:
            # The preparation every candidate shares: done once.
            run(
                parent,
                "python3 -m compileall -q . && echo deps-installed > /tmp/prepared && echo x > ~/.cache-ok",
            )
            snapshot = parent.snapshot(name="prepared")
            print(
                f"snapshot {snapshot.id}: {snapshot.size_bytes} bytes, workspace copied by {snapshot.method}"
            )
        pool = backend.pool
        if pool is not None:
            pool.wait_ready(120)  # a steady state: every fork below is a warm member
        started = time.monotonic()
        with ThreadPoolExecutor(args.n) as threads:
            forks = list(threads.map(lambda _: backend.session(snapshot=snapshot), range(args.n)))
        served = pool.stats().served if pool is not None else 0
        print(f"{args.n} forks in {(time.monotonic() - started) * 1000:.0f} ms ({served} served by the pool)")
        try:
            with ThreadPoolExecutor(args.n) as threads:
                results = list(threads.map(try_candidate, forks, range(args.n)))
            for passed, seconds, index in results:
                print(f"  candidate {index}: {passed}/3 tests pass ({seconds * 1000:.0f} ms)")
            best = max(results, key=lambda r: (r[0], -r[1]))
            shutil.copytree(forks[best[2]].workspace or "", kept, symlinks=True)
            print(f"kept candidate {best[2]} ({best[0]}/3) in {kept}")
        finally:
            for fork in forks:
                fork.close()
        backend.remove_snapshot(snapshot)
    finally:
        backend.close()
    client = docker.from_env()
    try:
        print(f"containers of this process left: {containers_of_this_process(client)}")
    finally:
        client.close()


if __name__ == "__main__":
    main()
