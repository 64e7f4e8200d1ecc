"""The one sync-to-async bridge on real processes: a cancelled ``sandbox_exec``, ``code_exec`` or ``bash``
has killed its command when ``CancelledError`` reaches the caller, and long commands never delay a file
tool. Checked the moment the cancel returns, with no grace period: that is the property.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

from adk_sandbox.devtools import DevToolset, Workspace
from adk_sandbox.executor import CodeTool, ProcessBackend, SandboxTool
from adk_sandbox.executor.rust import host_rust
from tests.conftest import kill_all, live_processes_with_args, require, unique_sleep_seconds

CONCURRENT = 20  # more than the loop's default executor has workers here (min(32, cpus + 4))


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (a killed child not yet reaped by its new parent)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False


async def _cancel_when(task: asyncio.Task[Any], started: Any, what: str) -> None:
    deadline = time.monotonic() + 60
    while not started():
        assert not task.done(), f"{what} ended before it was cancelled: {task.result()}"
        assert time.monotonic() < deadline, f"{what} did not start"
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_a_cancelled_sandbox_exec_has_killed_its_processes_when_the_cancel_returns() -> None:
    marker = unique_sleep_seconds()
    tool = SandboxTool(ProcessBackend())
    left: list[int] = []

    async def main() -> None:
        task = asyncio.create_task(
            tool.run({"language": "command", "code": f"sleep {marker} & sleep {marker}", "timeout_secs": 300})
        )
        await _cancel_when(task, lambda: len(live_processes_with_args("sleep", marker)) == 2, "sandbox_exec")
        left.extend(live_processes_with_args("sleep", marker))  # at once, before anything else runs

    try:
        asyncio.run(main())
        assert left == []
    finally:
        kill_all(live_processes_with_args("sleep", marker))


def test_a_cancelled_bash_has_killed_its_processes_when_the_cancel_returns(tmp_path: Path) -> None:
    marker = unique_sleep_seconds()
    left: list[int] = []

    async def main() -> None:
        with Workspace(tmp_path) as ws:
            task = asyncio.create_task(
                DevToolset(ws).run("bash", {"command": f"sleep {marker} & sleep {marker}"})
            )
            await _cancel_when(task, lambda: len(live_processes_with_args("sleep", marker)) == 2, "bash")
            left.extend(live_processes_with_args("sleep", marker))

    try:
        asyncio.run(main())
        assert left == []
    finally:
        kill_all(live_processes_with_args("sleep", marker))


def test_a_cancelled_code_exec_has_killed_its_program_when_the_cancel_returns(tmp_path: Path) -> None:
    host = host_rust()
    require(host is not None and host.deps_available, "rustc and serde_json for it are not on the host")
    pid_file = tmp_path / "pid"
    code = (
        "fn run(input: Value) -> Value {\n"
        '    std::fs::write(input["pid_file"].as_str().unwrap(), std::process::id().to_string()).unwrap();\n'
        "    std::thread::sleep(std::time::Duration::from_secs(300));\n"
        "    input\n"
        "}\n"
    )
    pid: list[int] = []

    def running() -> bool:
        if not pid and pid_file.exists() and pid_file.read_text():
            pid.append(int(pid_file.read_text()))
        return bool(pid)

    async def main() -> bool:
        with CodeTool(ProcessBackend()) as tool:
            task = asyncio.create_task(
                tool.run({"code": code, "input": {"pid_file": str(pid_file)}, "timeout_secs": 300})
            )
            await _cancel_when(task, running, "code_exec")
            return _alive(pid[0])

    try:
        assert asyncio.run(main()) is False
    finally:
        if pid and _alive(pid[0]):
            kill_all(pid)


@pytest.mark.parametrize("tool", ["bash", "sandbox_exec"])
def test_many_long_commands_do_not_delay_a_file_tool(tmp_path: Path, tool: str) -> None:
    (tmp_path / "f.txt").write_text("quick\n")
    marker = unique_sleep_seconds()

    async def main() -> float:
        with Workspace(tmp_path, bash_timeout=4) as ws:
            toolset = DevToolset(ws)
            sandbox = SandboxTool(ProcessBackend())
            if tool == "bash":
                calls = [toolset.run("bash", {"command": f"sleep {marker}"}) for _ in range(CONCURRENT)]
            else:
                args = {"language": "command", "code": f"sleep {marker}", "timeout_secs": 4}
                calls = [sandbox.run(args) for _ in range(CONCURRENT)]
            commands = [asyncio.ensure_future(call) for call in calls]
            # All of them start at once (each has a thread); the old default-executor bridge ran six.
            deadline = time.monotonic() + 2
            while len(live_processes_with_args("sleep", marker)) < CONCURRENT and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            started = time.monotonic()
            result = await toolset.run("read_file", {"path": "f.txt"})
            elapsed = time.monotonic() - started
            assert "quick" in result["content"]
            await asyncio.gather(*commands)
            return elapsed

    try:
        assert asyncio.run(main()) < 1.0
    finally:
        kill_all(live_processes_with_args("sleep", marker))


def test_default_executor_size_is_below_the_concurrency_used() -> None:
    """The starvation tests mean something only if CONCURRENT exceeds the default executor's workers."""
    assert min(32, (os.cpu_count() or 1) + 4) < CONCURRENT
