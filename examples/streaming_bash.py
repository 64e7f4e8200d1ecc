"""Watch a bash command's output arrive line by line while it runs.

Run: .venv/bin/python examples/streaming_bash.py [WORKSPACE_DIR]

Each line is printed with the time it arrived: they come one second apart, as the command prints them,
not all at once at the end. The final result dict follows.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time

from adk_sandbox.devtools import DevToolset, Workspace

COMMAND = 'for i in 1 2 3 4 5; do echo "step $i in $(pwd)"; sleep 1; done; echo "done" >&2'


async def main(root: str) -> None:
    """Run the command in a workspace at ``root``, printing each output line as it arrives."""
    started = time.monotonic()

    def on_progress(stream: str, chunk: str) -> None:
        print(f"[{time.monotonic() - started:5.2f}s {stream}] {chunk}", end="", flush=True)

    with Workspace(root) as ws:
        result = await DevToolset(ws).run("bash", {"command": COMMAND}, on_progress=on_progress)
    print("\nresult:", {key: result[key] for key in ("exit_code", "timed_out", "duration_ms", "isolation")})


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as scratch:
        asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else scratch))
