"""Per-call overhead of the MCP server: a call through the mcp SDK's stdio client against a direct call.

Run: PYTHONPATH=. .venv/bin/python bench/bench_adapter_mcp.py [--quick]
Ours: ``session.call_tool`` of a ``ClientSession`` connected to a real ``adk-sandbox mcp`` subprocess
(JSON-RPC over pipes, the server's ``call_tool``, the result as text and structuredContent). The anchor:
``DevToolset.run`` in this process on a workspace of its own ``DockerBackend`` session (same image,
same runtime). Both run on one event loop in a thread of their own, called in turn by
``_timing.interleaved``, so machine drift and the hop into the loop hit both alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from _timing import Row, interleaved, parser, print_section
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from adk_sandbox.devtools import DevToolset, Workspace
from adk_sandbox.executor.backends.docker import DockerBackend

REPO = Path(__file__).resolve().parents[1]
T = TypeVar("T")


class LoopThread:
    """An event loop in a thread: ``call(coro)`` runs a coroutine there and waits for its result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="bench-loop", daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop; its result (blocking)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        """Stop the loop and its thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


async def hold_session(root: Path, ready: Future[ClientSession], done: asyncio.Event) -> None:
    """Connect to ``adk-sandbox mcp`` for ``root`` and keep the session open until ``done``."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "adk_sandbox", "mcp", "--workspace", str(root)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    async with contextlib.AsyncExitStack() as stack:
        read, write = await stack.enter_async_context(stdio_client(params))
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        ready.set_result(session)
        await done.wait()


def checked(
    runner: LoopThread, call: Callable[[], Awaitable[Any]], ok: Callable[[Any], bool]
) -> Callable[[], None]:
    """A blocking function for ``interleaved`` that runs ``call`` on the loop and checks its result."""

    async def once() -> Any:
        return await call()

    def run() -> None:
        result = runner.call(once())
        if not ok(result):
            raise RuntimeError(f"unexpected result: {result!r}")

    return run


def main() -> None:
    """Measure read_file and ``bash true`` both ways, side by side, and print the table."""
    args = parser(__doc__).parse_args()
    repeat = 30 if args.quick else 200
    bash_repeat = 10 if args.quick else 60
    runner = LoopThread()
    with tempfile.TemporaryDirectory(prefix="bench-mcp-") as scratch, DockerBackend() as backend:
        ours_root, direct_root = Path(scratch, "mcp"), Path(scratch, "direct")
        for root in (ours_root, direct_root):
            root.mkdir()
            (root / "notes.txt").write_text("".join(f"line {i}\n" for i in range(200)))
        done = asyncio.Event()
        ready: Future[ClientSession] = Future()
        holder = asyncio.run_coroutine_threadsafe(hold_session(ours_root, ready, done), runner.loop)
        session = ready.result(timeout=120)
        with Workspace(direct_root, sandbox=backend) as workspace:
            toolset = DevToolset(workspace)
            read = {"path": "notes.txt"}
            true = {"command": "true"}

            def mcp_ok(result: Any) -> bool:
                return result.is_error is False

            def direct_read_ok(result: Any) -> bool:
                return "line 199" in result["content"]

            def direct_bash_ok(result: Any) -> bool:
                return result["exit_code"] == 0

            reads = interleaved(
                {
                    "mcp": checked(runner, lambda: session.call_tool("read_file", read), mcp_ok),
                    "direct": checked(runner, lambda: toolset.run("read_file", read), direct_read_ok),
                },
                repeat,
            )
            bashes = interleaved(
                {
                    "mcp": checked(runner, lambda: session.call_tool("bash", true), mcp_ok),
                    "direct": checked(runner, lambda: toolset.run("bash", true), direct_bash_ok),
                },
                bash_repeat,
            )
        runner.loop.call_soon_threadsafe(done.set)
        holder.result(timeout=60)
    runner.close()
    rows = [
        Row.latency("read_file (200 lines) via MCP stdio", reads["mcp"], "DevToolset.run", reads["direct"]),
        Row.latency("bash `true` via MCP stdio", bashes["mcp"], "DevToolset.run", bashes["direct"]),
    ]
    notes = [
        f"read_file: {repeat} calls each, interleaved; bash: {bash_repeat} calls each (runc, base image).",
        f"overhead per call (p50): read_file {reads['mcp'].p50 - reads['direct'].p50:+.2f} ms, "
        f"bash {bashes['mcp'].p50 - bashes['direct'].p50:+.2f} ms",
    ]
    print_section("Issue 12: MCP adapter (bench/bench_adapter_mcp.py)", rows, notes)


if __name__ == "__main__":
    main()
