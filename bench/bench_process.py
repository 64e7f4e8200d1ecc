"""ProcessBackend and bubblewrap overheads, measured side by side with their anchors in one run.

Run: .venv/bin/python bench/bench_process.py [--repeat N]
Prints a Markdown table (medians, ratios to the anchor) for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable

from _timing import timed

from adk_sandbox.executor import (
    ExecRequest,
    Language,
    ProcessBackend,
    SandboxPolicy,
    bwrap_arguments,
    get_enforcer,
)

FLOOD_BYTES = 200_000_000


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    """Median ms after one untimed call (toolchain probes, page cache)."""
    return timed(fn, repeat).p50


def raw_pipe_drain() -> None:
    # Anchor for the output path: a bare loop of os.read over a host pipe, keeping nothing.
    proc = subprocess.Popen(["head", "-c", str(FLOOD_BYTES), "/dev/zero"], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    while os.read(fd, 65536):
        pass
    proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    repeat = args.repeat

    host = ProcessBackend()
    enforcer = get_enforcer()
    sandboxed = ProcessBackend.with_sandbox(enforcer, SandboxPolicy(allow_process_spawn=True))
    true_request = ExecRequest(language=Language.COMMAND, code="true", timeout=30)
    flood_request = ExecRequest(
        language=Language.COMMAND, code=f"head -c {FLOOD_BYTES} /dev/zero", timeout=120, max_output_bytes=4096
    )
    bwrap = shutil.which("bwrap") or "bwrap"
    scratch = tempfile.mkdtemp()
    raw_bwrap_argv = [
        bwrap,
        *bwrap_arguments(SandboxPolicy(allow_process_spawn=True), workdir=scratch, scratch_dir=scratch),
        "--",
        "/bin/sh",
        "-c",
        "true",
    ]

    rows: list[tuple[str, float, str, float]] = []
    anchor = median_ms(lambda: subprocess.run(["/bin/sh", "-c", "true"], check=True), repeat)
    rows.append(
        (
            "ProcessBackend `true`",
            median_ms(lambda: host.execute(true_request), repeat),
            "host `subprocess.run(['sh','-c','true'])`",
            anchor,
        )
    )
    raw = median_ms(lambda: subprocess.run(raw_bwrap_argv, check=True, env={}), repeat)
    rows.append(
        (
            "ProcessBackend+bwrap `true`",
            median_ms(lambda: sandboxed.execute(true_request), repeat),
            "raw `bwrap <same args> sh -c true`",
            raw,
        )
    )
    flood_repeat = max(3, repeat // 10)
    rows.append(
        (
            f"ProcessBackend {FLOOD_BYTES // 10**6} MB flood, 4 KiB cap",
            median_ms(lambda: host.execute(flood_request), flood_repeat),
            "bare os.read loop over a host pipe",
            median_ms(raw_pipe_drain, flood_repeat),
        )
    )
    shutil.rmtree(scratch)

    print(f"repeat={repeat}, {os.cpu_count()} cpus, {time.strftime('%Y-%m-%d')}\n")
    print("| what | median ms | anchor | anchor median ms | ratio |")
    print("|---|---|---|---|---|")
    for name, ms, anchor_name, anchor_ms in rows:
        print(f"| {name} | {ms:.2f} | {anchor_name} | {anchor_ms:.2f} | {ms / anchor_ms:.2f}x |")
    flood_ms = rows[2][1]
    print(f"\nflood throughput through ProcessBackend: {FLOOD_BYTES / 1e6 / (flood_ms / 1000):.0f} MB/s")


if __name__ == "__main__":
    main()
