"""``adk-sandbox mcp`` driven by the mcp SDK's own stdio client, as an MCP host runs it: a real subprocess
speaking MCP over its stdin/stdout, tools running in a real Docker container."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import docker
import pytest

from adk_sandbox.devtools import DevToolset, Workspace
from adk_sandbox.executor.terminal_tool import TerminalArgs, TerminalTool
from adk_sandbox.executor.tools import CodeTool, SandboxTool
from tests.conftest import (
    IN_CI,
    containers_mounting,
    live_processes_with_args,
    require,
    unique_sleep_seconds,
    wait_until_gone,
)

try:
    import mcp_types as types
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client
except ImportError as exc:  # the extra is missing: in CI that is a failure, never a skip
    if IN_CI:
        raise
    pytest.skip(f"the mcp extra is not installed: {exc}", allow_module_level=True)

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]
REPO = Path(__file__).resolve().parents[2]
WRITABLE_TOOLS = ["read_file", "glob", "grep", "write_file", "edit_file", "bash", "sandbox_exec", "terminal"]


def server_parameters(workspace: Path, *flags: str) -> StdioServerParameters:
    """The server as a host starts it; PYTHONPATH so this checkout's code is what runs."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "adk_sandbox", "mcp", "--workspace", str(workspace), *flags],
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


@contextlib.asynccontextmanager
async def connected(workspace: Path, *flags: str) -> AsyncIterator[ClientSession]:
    async with contextlib.AsyncExitStack() as stack:
        read, write = await stack.enter_async_context(stdio_client(server_parameters(workspace, *flags)))
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        yield session


def payload_of(result: types.CallToolResult) -> dict[str, Any]:
    """The result's JSON, checked to be the same as text content and as structuredContent."""
    assert len(result.content) == 1
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    payload: dict[str, Any] = json.loads(block.text)
    assert result.structured_content == payload
    return payload


def ok(result: types.CallToolResult) -> dict[str, Any]:
    payload = payload_of(result)
    assert result.is_error is False, payload
    return payload


def refused(result: types.CallToolResult) -> str:
    payload = payload_of(result)
    assert result.is_error is True, payload
    assert payload["status"] == "error"
    return str(payload["message"])


@pytest.fixture
def engine() -> docker.DockerClient:
    client = docker.from_env()
    yield client
    client.close()


def test_tools_are_listed_with_their_schemas_unchanged(owned_workspace: Path) -> None:
    # The schemas the project's tools declare, computed here without any server.
    with Workspace(owned_workspace) as ws, SandboxTool(ws.bash_backend()[0]) as sandbox:
        expected = {tool.name: tool.parameters for tool in (*DevToolset(ws).tools, sandbox)}
    expected[TerminalTool.name] = TerminalArgs.model_json_schema()

    async def main() -> list[types.Tool]:
        async with connected(owned_workspace) as session:
            return (await session.list_tools()).tools

    tools = asyncio.run(main())
    assert [tool.name for tool in tools] == WRITABLE_TOOLS
    for tool in tools:
        assert tool.input_schema == expected[tool.name], tool.name
        assert tool.input_schema["additionalProperties"] is False, tool.name
        assert tool.description


def test_each_tool_runs_in_the_workspace_and_the_container_goes_with_the_client(
    owned_workspace: Path, engine: docker.DockerClient
) -> None:
    (owned_workspace / "notes.txt").write_text("alpha\nbeta\n")

    async def main() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with connected(owned_workspace) as session:
            seen["containers while serving"] = len(containers_mounting(engine, owned_workspace))
            seen["read"] = ok(await session.call_tool("read_file", {"path": "notes.txt"}))
            seen["write"] = ok(
                await session.call_tool("write_file", {"path": "src/a.py", "content": "x = 1\n"})
            )
            seen["read a"] = ok(await session.call_tool("read_file", {"path": "src/a.py"}))
            edit = {"path": "src/a.py", "old_string": "x = 1", "new_string": "x = 2"}
            seen["edit"] = ok(await session.call_tool("edit_file", edit))
            seen["glob"] = ok(await session.call_tool("glob", {"pattern": "**/*.py"}))
            seen["grep"] = ok(await session.call_tool("grep", {"pattern": "beta"}))
            seen["bash"] = ok(await session.call_tool("bash", {"command": "cat src/a.py; id -u; hostname"}))
            code = "cat src/a.py && echo made > from_sandbox.txt"
            seen["sandbox"] = ok(
                await session.call_tool("sandbox_exec", {"language": "command", "code": code})
            )
            seen["missing"] = refused(await session.call_tool("read_file", {"path": "nope.txt"}))
            seen["unknown tool"] = refused(await session.call_tool("rm_rf", {}))
        return seen

    seen = asyncio.run(main())
    assert seen["containers while serving"] == 1
    assert "alpha" in seen["read"]["content"] and "x = 1" in seen["read a"]["content"]
    assert (owned_workspace / "src" / "a.py").read_text() == "x = 2\n"
    assert "src/a.py" in json.dumps(seen["glob"])
    assert "notes.txt" in json.dumps(seen["grep"]) and "beta" in json.dumps(seen["grep"])
    # bash ran in the container, as the workspace's owner, in the workspace.
    assert seen["bash"]["stdout"].splitlines()[:2] == ["x = 2", "1000"]
    assert seen["bash"]["stdout"].splitlines()[2] == "sandbox"
    assert seen["bash"]["isolation"] == "container"
    # sandbox_exec shares bash's container: the workspace is its working directory.
    assert (seen["sandbox"]["status"], seen["sandbox"]["stdout"]) == ("success", "x = 2\n")
    assert (owned_workspace / "from_sandbox.txt").read_text() == "made\n"
    assert "nope.txt" in seen["missing"]
    assert "unknown tool 'rm_rf'" in seen["unknown tool"] and "bash" in seen["unknown tool"]
    # Closing stdin ended the server, and the server removed its container (no reaper involved).
    assert containers_mounting(engine, owned_workspace) == []


def test_the_terminal_tool_drives_a_repl_and_ctrl_c(owned_workspace: Path) -> None:
    """``terminal``: a REPL answered call by call, Ctrl-C, a bad id, the bound, close; all through MCP."""

    async def main() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with connected(owned_workspace) as session:
            opened = ok(await session.call_tool("terminal", {"action": "open"}))
            number = opened["terminal"]
            seen["open"] = opened
            send = {"action": "send", "terminal": number}
            seen["python"] = ok(await session.call_tool("terminal", {**send, "keys": "python3 -i\n"}))
            seen["answer"] = ok(await session.call_tool("terminal", {**send, "keys": "6 * 7\n"}))
            seen["sleep"] = ok(
                await session.call_tool(
                    "terminal", {**send, "keys": "import time; time.sleep(60)\n", "wait_secs": 0.5}
                )
            )
            seen["ctrl-c"] = ok(await session.call_tool("terminal", {**send, "keys": "\u0003"}))
            ok(await session.call_tool("terminal", {**send, "keys": "exit()\n"}))  # python reads ahead
            seen["exit"] = ok(await session.call_tool("terminal", {**send, "keys": "exit 3\n"}))
            for _ in range(20):  # the shell's end comes a moment after the last output it printed
                if not seen["exit"]["running"]:
                    break
                read = {"action": "read", "terminal": number, "wait_secs": 0.5}
                seen["exit"] = ok(await session.call_tool("terminal", read))
            seen["bad id"] = refused(await session.call_tool("terminal", {"action": "read", "terminal": 99}))
            others = [
                ok(await session.call_tool("terminal", {"action": "open", "wait_secs": 0})) for _ in range(3)
            ]
            seen["over"] = refused(await session.call_tool("terminal", {"action": "open"}))
            for other in others:
                ok(await session.call_tool("terminal", {"action": "close", "terminal": other["terminal"]}))
            seen["unknown arg"] = refused(await session.call_tool("terminal", {"action": "open", "rows": 3}))
        return seen

    seen = asyncio.run(main())
    assert "$" in seen["open"]["output"] and "\x1b" not in seen["open"]["output"]
    assert ">>>" in seen["python"]["output"]
    assert "42" in seen["answer"]["output"]
    assert "KeyboardInterrupt" in seen["ctrl-c"]["output"]
    assert seen["exit"]["running"] is False and seen["exit"]["exit_code"] == 3
    assert "no terminal 99" in seen["bad id"]
    assert "close one first" in seen["over"]
    assert "rows" in seen["unknown arg"]


def test_bash_output_arrives_as_progress_notifications_while_it_runs(owned_workspace: Path) -> None:
    command = "for i in 1 2 3; do echo line$i; sleep 0.6; done; echo oops >&2"
    notes: list[tuple[float, str | None, float]] = []

    async def on_progress(progress: float, _total: float | None, message: str | None) -> None:
        notes.append((progress, message, time.monotonic()))

    async def main() -> tuple[dict[str, Any], float, dict[str, Any]]:
        async with connected(owned_workspace) as session:
            result = await session.call_tool("bash", {"command": command}, progress_callback=on_progress)
            finished = time.monotonic()
            # Without a progressToken (no callback) the same call sends none and returns the same output.
            quiet = ok(await session.call_tool("bash", {"command": command}))
            return ok(result), finished, quiet

    result, finished, quiet = asyncio.run(main())
    assert result["stdout"] == "line1\nline2\nline3\n" and result["stderr"] == "oops\n"
    streamed = "".join(message or "" for _, message, _ in notes)
    assert sorted(streamed.splitlines()) == ["line1", "line2", "line3", "oops"]
    progress = [value for value, _, _ in notes]
    assert progress == sorted(set(progress)) and progress[0] > 0  # strictly increasing
    # The first line was seen while the command still ran (it sleeps 1.8 s after printing it).
    assert notes[0][2] < finished - 1.0
    assert len(notes) == len(progress)
    assert (quiet["stdout"], quiet["stderr"]) == (result["stdout"], result["stderr"])


def test_an_unknown_argument_is_refused_and_nothing_runs(owned_workspace: Path) -> None:
    async def main() -> tuple[str, str, str]:
        async with connected(owned_workspace) as session:
            write = await session.call_tool("write_file", {"path": "x.txt", "content": "hi", "mode": "0777"})
            bash = await session.call_tool("bash", {"command": "touch ran.txt", "sudo": True})
            missing = await session.call_tool("bash", {})
            return refused(write), refused(bash), refused(missing)

    write, bash, missing = asyncio.run(main())
    # The project's own wording (parse_arguments), naming the argument and the accepted ones.
    assert "invalid arguments for write_file: unknown argument 'mode'" in write
    assert "accepted arguments: path, content" in write
    assert "unknown argument 'sudo'" in bash
    assert "missing required argument 'command'" in missing
    assert not (owned_workspace / "x.txt").exists()
    assert not (owned_workspace / "ran.txt").exists()


def test_a_cancelled_call_kills_its_command_and_the_server_serves_on(owned_workspace: Path) -> None:
    seconds = unique_sleep_seconds()

    async def main() -> tuple[list[int], list[int], dict[str, Any]]:
        async with connected(owned_workspace) as session:
            running: list[int] = []
            # Leaving the scope cancels the request: the client sends notifications/cancelled.
            with anyio.move_on_after(10):
                async with anyio.create_task_group() as group:
                    group.start_soon(session.call_tool, "bash", {"command": f"sleep {seconds}"})
                    while not running:
                        await anyio.sleep(0.05)
                        running = live_processes_with_args("sleep", seconds)
                    group.cancel_scope.cancel()
            left = wait_until_gone("sleep", seconds, timeout=10)
            after = ok(await session.call_tool("bash", {"command": "echo still here"}))
            return running, left, after

    running, left, after = asyncio.run(main())
    assert running, "the command never started"
    assert left == []
    assert after["stdout"] == "still here\n"


def test_a_read_only_server_lists_three_tools_and_starts_no_container(
    owned_workspace: Path, engine: docker.DockerClient
) -> None:
    (owned_workspace / "a.txt").write_text("keep\n")

    async def main() -> tuple[list[types.Tool], dict[str, Any], str, str, int]:
        async with connected(owned_workspace, "--read-only") as session:
            tools = (await session.list_tools()).tools
            read = ok(await session.call_tool("read_file", {"path": "a.txt"}))
            write = refused(await session.call_tool("write_file", {"path": "a.txt", "content": "gone"}))
            bash = refused(await session.call_tool("bash", {"command": "rm a.txt"}))
            return tools, read, write, bash, len(containers_mounting(engine, owned_workspace))

    tools, read, write, bash, containers = asyncio.run(main())
    assert [tool.name for tool in tools] == ["read_file", "glob", "grep"]
    assert all(tool.input_schema["additionalProperties"] is False for tool in tools)
    assert "keep" in read["content"]
    assert "unknown tool 'write_file'" in write and "unknown tool 'bash'" in bash
    assert (owned_workspace / "a.txt").read_text() == "keep\n"
    assert containers == 0


def test_sigterm_ends_the_server_and_removes_its_container(
    owned_workspace: Path, engine: docker.DockerClient
) -> None:
    async def main() -> tuple[list[int], int, list[int], BaseException | None]:
        async with connected(owned_workspace) as session:
            ok(await session.call_tool("bash", {"command": "true"}))
            server = live_processes_with_args("mcp", "--workspace", str(owned_workspace))
            assert len(server) == 1
            before = len(containers_mounting(engine, owned_workspace))
            # The host still holds stdin open: only the signal can end the server.
            os.kill(server[0], signal.SIGTERM)
            deadline = time.monotonic() + 10
            while live_processes_with_args("mcp", "--workspace", str(owned_workspace)):
                assert time.monotonic() < deadline, "the server did not exit after SIGTERM"
                await asyncio.sleep(0.05)
            left = containers_mounting(engine, owned_workspace)
            error: BaseException | None = None
            try:
                await session.call_tool("read_file", {"path": "x"}, read_timeout_seconds=5)
            except Exception as exc:  # the connection is gone
                error = exc
            return server, before, left, error

    _server, before, left, error = asyncio.run(main())
    assert before == 1
    assert left == []
    assert error is not None


def test_runtime_runsc_runs_the_commands_in_gvisor(
    owned_workspace: Path, engine: docker.DockerClient
) -> None:
    require("runsc" in engine.info().get("Runtimes", {}), "gVisor's runsc is not registered")

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        async with connected(owned_workspace, "--runtime", "runsc") as session:
            bash = ok(await session.call_tool("bash", {"command": "dmesg | head -n 1"}))
            program = {"language": "python", "code": "print(6 * 7)"}
            return bash, ok(await session.call_tool("sandbox_exec", program))

    bash, program = asyncio.run(main())
    assert bash["isolation"] == "gvisor" and "gVisor" in bash["stdout"]
    assert (program["isolation"], program["stdout"]) == ("gvisor", "42\n")
    assert containers_mounting(engine, owned_workspace) == []


def test_the_sandbox_options_of_run_reach_the_container(
    owned_workspace: Path, engine: docker.DockerClient
) -> None:
    """--tmpfs, --memory, --cpus and --engine, as `adk-sandbox run` spells them: the container has them."""
    flags = (
        "--tmpfs",
        "/var/tmp:8",
        "--memory",
        "384",
        "--cpus",
        "0.5",
        "--engine",
        "unix:///var/run/docker.sock",
    )

    async def main() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        async with connected(owned_workspace, *flags) as session:
            bash = ok(
                await session.call_tool("bash", {"command": "echo kept > /var/tmp/f && cat /var/tmp/f"})
            )
            return bash, [
                engine.api.inspect_container(c) for c in containers_mounting(engine, owned_workspace)
            ]

    bash, inspected = asyncio.run(main())
    assert (bash["exit_code"], bash["stdout"]) == (0, "kept\n"), bash
    [host] = [found["HostConfig"] for found in inspected]
    assert host["Tmpfs"]["/var/tmp"].endswith("size=8m,mode=1777")
    assert (host["Memory"], host["NanoCpus"]) == (384 * 1024 * 1024, 500_000_000)
    assert containers_mounting(engine, owned_workspace) == []


def test_bad_sandbox_options_are_refused_before_anything_starts(owned_workspace: Path) -> None:
    for flags, says in (
        (("--tmpfs", "/var/tmp"), "is not PATH:MB"),
        (("--engine", "ftp://nowhere"), "engine"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "adk_sandbox", "mcp", "--workspace", str(owned_workspace), *flags],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdin=subprocess.DEVNULL,
            check=False,
        )
        assert done.returncode == 2 and says in done.stderr, (flags, done.stderr)


@pytest.mark.slow
def test_code_exec_is_served_on_request(owned_workspace: Path, engine: docker.DockerClient) -> None:
    from adk_sandbox.executor.backends.docker.images import RUST_IMAGE  # noqa: PLC0415

    images = {tag for image in engine.images.list() for tag in image.tags}
    require(RUST_IMAGE in images, f"{RUST_IMAGE} is missing: run `adk-sandbox images build`")
    code = 'fn run(input: Value) -> Value { serde_json::json!({"got": input}) }'

    async def main() -> tuple[list[types.Tool], dict[str, Any]]:
        async with connected(owned_workspace, "--code-exec") as session:
            tools = (await session.list_tools()).tools
            return tools, ok(await session.call_tool("code_exec", {"code": code, "input": [1, 2]}))

    tools, result = asyncio.run(main())
    assert [tool.name for tool in tools] == [*WRITABLE_TOOLS, "code_exec"]
    schema = next(tool.input_schema for tool in tools if tool.name == "code_exec")
    assert schema == CodeTool.args_model.model_json_schema()
    assert schema["additionalProperties"] is False
    assert (result["status"], result["output"]) == ("success", {"got": [1, 2]}), result
    assert containers_mounting(engine, owned_workspace) == []
