"""Warm commands in one Docker session, for an A/B of two checkouts (e.g. before and after a restructure).

Run in each checkout, alternating, and compare the medians:
  PYTHONPATH=. .venv/bin/python bench/ab_warm_commands.py [--commands 1000] [--rounds 5]
Works with this checkout's import root (``adk_sandbox``) and with the older top-level ``executor`` one, so
the same file measures a revision from before the import root moved (copy it there).
Prints one line per round (ms per ``true`` over the agent channel) and their median. ``--profile task``
measures the task profile (root, a writable root layer; from the checkouts that have it) and
``--starts N`` also times N session starts (create, verify, first command).
"""

from __future__ import annotations

import argparse
import statistics
import time

try:
    from adk_sandbox.executor import ExecRequest
    from adk_sandbox.executor.backends.docker import DockerBackend
except ImportError:  # a checkout from before the adk_sandbox import root
    from executor import ExecRequest  # type: ignore[import-not-found,no-redef]
    from executor.backends.docker import DockerBackend  # type: ignore[import-not-found,no-redef]


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--commands", type=int, default=1000)
    args.add_argument("--rounds", type=int, default=5)
    args.add_argument("--profile", choices=["hardened", "task"], default=None)
    args.add_argument("--starts", type=int, default=0)
    options = args.parse_args()
    request = ExecRequest(argv=["true"], timeout=10)
    per_command = []
    backend = DockerBackend(profile=options.profile) if options.profile else DockerBackend()
    if options.starts:
        starts = []
        for _ in range(options.starts):
            started = time.perf_counter()
            with backend.session() as session:
                session.execute(request)
            starts.append((time.perf_counter() - started) * 1000)
        print(f"session start + first command: median {statistics.median(starts):.0f} ms")
    with backend, backend.session() as session:
        for _ in range(50):  # warm: the agent is started, caches are hot
            session.execute(request)
        for round_number in range(options.rounds):
            started = time.perf_counter()
            for _ in range(options.commands):
                session.execute(request)
            per_command.append((time.perf_counter() - started) / options.commands * 1000)
            print(f"round {round_number + 1}: {per_command[-1]:.3f} ms per `true`")
    print(f"median: {statistics.median(per_command):.3f} ms per `true`")


if __name__ == "__main__":
    main()
