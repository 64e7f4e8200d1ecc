"""Per-call overhead of the google-adk tool wrapper (``AdkTool.run_async``) against ``DevToolset.run``.

Run: PYTHONPATH=. .venv/bin/python bench/bench_adapter_adk.py [--quick] [--docker]

Both sides run the same tool on the same workspace from one event loop, interleaved; the wrapper adds
copying the arguments, ``call_tool``'s error mapping and the payload. ``read_file`` of a small file and a
call refused for an unknown argument (the wrapper returns the error, ``DevToolset.run`` raises it) run on
the host; ``--docker`` adds ``bash 'true'`` in a Docker session (the wrapper's cost against an exec).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable, Coroutine
from typing import Any

from _timing import Row, interleaved, parser, print_section

from adk_sandbox.devtools import DevToolset, InvalidArgumentsError, Workspace
from adk_sandbox.devtools.adapters.adk import AdkTool, SandboxToolset
from adk_sandbox.executor.backends.docker import DockerBackend

Make = Callable[[], Coroutine[Any, Any, object]]


def on(loop: asyncio.AbstractEventLoop, make: Make) -> Callable[[], object]:
    return lambda: loop.run_until_complete(make())


async def refused(tools: DevToolset) -> None:
    try:
        await tools.run("read_file", {"path": "a.txt", "bogus": 1})
    except InvalidArgumentsError:
        return
    raise AssertionError("the unknown argument was accepted")


def rows_for(workspace: Workspace, loop: asyncio.AbstractEventLoop, repeat: int, docker: bool) -> list[Row]:
    direct = DevToolset(workspace)
    adk = {tool.name: tool for tool in loop.run_until_complete(SandboxToolset(workspace).get_tools())}
    read, bash = adk["read_file"], adk["bash"]
    assert isinstance(read, AdkTool) and isinstance(bash, AdkTool)
    context: Any = None  # unused by the wrapper
    cases: list[tuple[str, Callable[[], object], Callable[[], object]]] = [
        (
            "read_file (small file)",
            on(loop, lambda: read.run_async(args={"path": "a.txt"}, tool_context=context)),
            on(loop, lambda: direct.run("read_file", {"path": "a.txt"})),
        ),
        (
            "unknown argument (error result / raised)",
            on(loop, lambda: read.run_async(args={"path": "a.txt", "bogus": 1}, tool_context=context)),
            on(loop, lambda: refused(direct)),
        ),
    ]
    if docker:
        cases.append(
            (
                "bash `true` (Docker session)",
                on(loop, lambda: bash.run_async(args={"command": "true"}, tool_context=context)),
                on(loop, lambda: direct.run("bash", {"command": "true"})),
            )
        )
    rows = []
    for what, ours, theirs in cases:
        stats = interleaved({"adk": ours, "direct": theirs}, repeat if "bash" not in what else repeat // 10)
        rows.append(Row.latency(what, stats["adk"], "`DevToolset.run`", stats["direct"]))
    return rows


def main() -> None:
    args_parser = parser(__doc__)
    args_parser.add_argument("--docker", action="store_true", help="also bash in a Docker session")
    args = args_parser.parse_args()
    repeat = 100 if args.quick else 2000
    loop = asyncio.new_event_loop()
    with tempfile.TemporaryDirectory() as root:
        with open(f"{root}/a.txt", "w", encoding="utf-8") as handle:
            handle.write("hello\n" * 20)
        sandbox = DockerBackend() if args.docker else None
        try:
            with Workspace(root, sandbox=sandbox) as workspace:
                rows = rows_for(workspace, loop, repeat, args.docker)
        finally:
            if sandbox is not None:
                sandbox.close()
    loop.close()
    print_section(
        "google-adk tool wrapper against a direct DevToolset.run (issue 12)",
        rows,
        [f"{repeat} interleaved calls per host row ({repeat // 10} for bash), after one untimed call each."],
    )


if __name__ == "__main__":
    main()
