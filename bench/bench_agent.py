"""The agent channel against its anchors, side by side in one run (issue 11).

Run: PYTHONPATH=. .venv/bin/python bench/bench_agent.py [--repeat N] [--runtime runsc]
Prints a Markdown table (medians, ratios) for BENCHMARKS.md:
* ``true`` in a warm session over the agent channel vs host ``subprocess.run(["sh", "-c", "true"])``;
* the same vs the exec transport (``DockerBackend(transport="exec")``), one Docker exec per command;
* 200 MB with a 4 KiB cap through each channel (the agent discards at the source).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable

from executor import ExecRequest, Language
from executor.backends.docker import DockerBackend

FLOOD_BYTES = 200_000_000


def interleaved_ms(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Medians of each function, run in turn so machine drift hits all alike."""
    for fn in fns.values():
        fn()  # warm-up
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            started = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - started) * 1000)
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--runtime", default=None, help="e.g. runsc")
    args = parser.parse_args()
    workspace = tempfile.mkdtemp()
    agent_backend = DockerBackend(runtime=args.runtime)
    exec_backend = DockerBackend(runtime=args.runtime, transport="exec")
    true = ExecRequest(language=Language.COMMAND, code="true", timeout=30)
    flood = ExecRequest(
        language=Language.COMMAND, code=f"head -c {FLOOD_BYTES} /dev/zero", timeout=120, max_output_bytes=4096
    )
    try:
        with (
            agent_backend.session(workspace=workspace) as agent,
            exec_backend.session(workspace=workspace) as exe,
        ):
            medians = interleaved_ms(
                {
                    "host": lambda: subprocess.run(["sh", "-c", "true"], check=True),
                    "agent": lambda: agent.execute(true),
                    "exec": lambda: exe.execute(true),
                },
                args.repeat,
            )
            floods = interleaved_ms(
                {"agent": lambda: agent.execute(flood), "exec": lambda: exe.execute(flood)}, 3
            )
    finally:
        agent_backend.close()
        exec_backend.close()
    print(f"runtime: {args.runtime or 'runc (default)'}, repeat {args.repeat}\n")
    print("| what | median ms | anchor | anchor median ms | ratio |")
    print("|---|---|---|---|---|")
    rows = [
        ("session `true`, agent channel", medians["agent"], 'host `subprocess.run(["sh","-c","true"])`',
         medians["host"]),
        ("session `true`, agent channel", medians["agent"], "session `true`, exec transport",
         medians["exec"]),
        ("session `true`, exec transport", medians["exec"], 'host `subprocess.run(["sh","-c","true"])`',
         medians["host"]),
        ("200 MB, 4 KiB kept, agent channel", floods["agent"], "200 MB, 4 KiB kept, exec transport",
         floods["exec"]),
    ]  # fmt: skip
    for name, ours, anchor, theirs in rows:
        print(f"| {name} | {ours:.2f} | {anchor} | {theirs:.2f} | {ours / theirs:.2f}x |")
    print(f"\n200 MB through the agent channel: {FLOOD_BYTES / floods['agent'] / 1e6:.2f} GB/s effective")


if __name__ == "__main__":
    main()
