"""The bash tool on real processes: streaming, timeouts, cancellation, environment, sandbox plumbing."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

from adk_sandbox.devtools import DevToolset, ToolError, Workspace
from adk_sandbox.executor import ProcessBackend, SandboxBackend
from tests.conftest import kill_all, live_processes_with_args, unique_sleep_seconds, wait_until_gone


def bash(ws: Workspace, command: str, **extra: Any) -> dict[str, Any]:
    return asyncio.run(DevToolset(ws).run("bash", {"command": command, **extra}))


def test_bash_runs_in_the_root_and_reports_isolation(tmp_path: Path) -> None:
    with Workspace(tmp_path) as ws:
        result = bash(ws, "pwd; echo err >&2; exit 3")
    assert result["command"] == "pwd; echo err >&2; exit 3"
    assert result["stdout"] == f"{ws.root}\n"
    assert result["stderr"] == "err\n"
    assert result["exit_code"] == 3
    assert result["timed_out"] is False and result["truncated"] is False
    assert result["isolation"] == "subprocess_only"
    assert isinstance(result["duration_ms"], int)


def test_streaming_arrives_while_the_command_runs(tmp_path: Path) -> None:
    arrivals: list[tuple[str, str, float]] = []

    async def main() -> dict[str, Any]:
        started = time.monotonic()

        def on_progress(stream: str, chunk: str) -> None:
            arrivals.append((stream, chunk, time.monotonic() - started))

        with Workspace(tmp_path) as ws:
            return await DevToolset(ws).run(
                "bash", {"command": "echo first; sleep 2; echo second"}, on_progress=on_progress
            )

    result = asyncio.run(main())
    assert [(s, c) for s, c, _ in arrivals] == [("stdout", "first\n"), ("stdout", "second\n")]
    assert arrivals[0][2] < 1.5, "the first line only arrived when the command ended"
    assert arrivals[1][2] >= 1.9
    assert result["stdout"] == "first\nsecond\n"


def test_async_progress_callbacks_are_awaited_in_order(tmp_path: Path) -> None:
    seen: list[str] = []

    async def on_progress(stream: str, chunk: str) -> None:
        await asyncio.sleep(0.01)
        seen.append(chunk)

    async def main() -> None:
        with Workspace(tmp_path) as ws:
            await DevToolset(ws).run("bash", {"command": "for i in 1 2 3 4 5; do echo $i; done"}, on_progress)

    asyncio.run(main())
    assert seen == ["1\n", "2\n", "3\n", "4\n", "5\n"]


def test_timeout_kills_background_children_and_keeps_output(tmp_path: Path) -> None:
    marker = unique_sleep_seconds()
    with Workspace(tmp_path, bash_timeout=1) as ws:
        started = time.monotonic()
        # The call asks for 60 s; the workspace's 1 s ceiling wins.
        result = bash(ws, f"echo before; sleep {marker} & sleep {marker}", timeout_secs=60)
    try:
        assert time.monotonic() - started < 10
        assert result["timed_out"] is True
        assert result["exit_code"] is None
        assert result["stdout"] == "before\n"
        assert wait_until_gone("sleep", marker) == []
    finally:
        kill_all(live_processes_with_args("sleep", marker))


def test_cancelling_the_task_kills_the_command_and_streams_the_output_so_far(tmp_path: Path) -> None:
    marker = unique_sleep_seconds()
    streamed: list[str] = []

    async def main() -> None:
        with Workspace(tmp_path) as ws:
            task = asyncio.create_task(
                DevToolset(ws).run(
                    "bash",
                    {"command": f"echo started; sleep {marker} & sleep {marker}; echo never"},
                    on_progress=lambda stream, chunk: streamed.append(chunk),
                )
            )
            deadline = time.monotonic() + 10
            while not live_processes_with_args("sleep", marker) or not streamed:
                assert time.monotonic() < deadline, "the command did not start"
                await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    try:
        started = time.monotonic()
        asyncio.run(main())
        assert time.monotonic() - started < 10
        assert streamed == ["started\n"]
        assert wait_until_gone("sleep", marker) == []
    finally:
        kill_all(live_processes_with_args("sleep", marker))


def test_output_is_capped_per_stream(tmp_path: Path) -> None:
    with Workspace(tmp_path, max_output_bytes=1000) as ws:
        result = bash(ws, "head -c 100000 /dev/zero | tr '\\0' x")
    assert len(result["stdout"]) == 1000
    assert result["truncated"] is True


def test_environment_is_the_allowlist_unless_inherited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ADK_TEST_SECRET", "hunter2")
    monkeypatch.setenv("LANG", "C.UTF-8")
    with Workspace(tmp_path) as ws:
        result = bash(ws, "env")
    assert "hunter2" not in result["stdout"]
    assert "LANG=C.UTF-8" in result["stdout"].splitlines()
    with Workspace(tmp_path, env_allowlist=[]) as ws:
        assert "LANG=" not in bash(ws, "env")["stdout"]
    with Workspace(tmp_path, inherit_env=True) as ws:
        assert "ADK_TEST_SECRET=hunter2" in bash(ws, "env")["stdout"].splitlines()


class RecordingSessionFactory:
    """A sandbox with ``session(workspace=...)``, the Docker backend's shape, giving real host sessions."""

    def __init__(self) -> None:
        self.sessions: list[tuple[Path, ClosingBackend]] = []

    def session(self, *, workspace: Path) -> SandboxBackend:
        backend = ClosingBackend(workdir=workspace)
        self.sessions.append((workspace, backend))
        return backend


class ClosingBackend(ProcessBackend):
    closed = False

    def close(self) -> None:
        self.closed = True


def test_a_session_sandbox_opens_one_session_reused_and_closed_with_the_workspace(tmp_path: Path) -> None:
    factory = RecordingSessionFactory()
    ws = Workspace(tmp_path, sandbox=factory)
    assert factory.sessions == []  # opened lazily, on the first bash call
    assert bash(ws, "pwd")["stdout"] == f"{ws.root}\n"
    bash(ws, "true")
    assert [root for root, _ in factory.sessions] == [ws.root]
    ws.close()
    assert factory.sessions[0][1].closed is True


def test_a_plain_backend_starts_commands_in_the_root_and_is_left_open(tmp_path: Path) -> None:
    backend = ClosingBackend()  # not bound to the root: its default cwd is a scratch directory
    awkward = tmp_path / "dir with 'quotes' and spaces"
    awkward.mkdir()
    with Workspace(awkward, sandbox=backend) as ws:
        result = bash(ws, "pwd")
        assert result["stdout"] == f"{ws.root}\n"
        assert result["command"] == "pwd"
    assert backend.closed is False  # the caller owns a backend it passed in


def test_a_closed_workspace_refuses_every_tool(tmp_path: Path) -> None:
    ws = Workspace(tmp_path)
    bash(ws, "true")
    ws.close()
    ws.close()  # idempotent
    for name, args in (("bash", {"command": "true"}), ("read_file", {"path": "x"})):
        with pytest.raises(ToolError, match="closed"):
            asyncio.run(DevToolset(ws).run(name, args))


def test_long_commands_do_not_starve_the_file_tools(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("quick\n")
    marker = unique_sleep_seconds()

    async def main() -> float:
        with Workspace(tmp_path, bash_timeout=3) as ws:
            toolset = DevToolset(ws)
            # More commands than the loop's default executor has workers (min(32, cpus + 4)).
            commands = [
                asyncio.create_task(toolset.run("bash", {"command": f"sleep {marker}"}))
                for _ in range((os.cpu_count() or 1) + 6)
            ]
            await asyncio.sleep(0.3)
            started = time.monotonic()
            await toolset.run("read_file", {"path": "f.txt"})
            elapsed = time.monotonic() - started
            await asyncio.gather(*commands)
            return elapsed

    try:
        assert asyncio.run(main()) < 1.0
    finally:
        kill_all(live_processes_with_args("sleep", marker))


def test_a_failing_progress_callback_stops_the_command_and_is_raised(tmp_path: Path) -> None:
    marker = unique_sleep_seconds()

    def on_progress(stream: str, chunk: str) -> None:
        raise RuntimeError("consumer broke")

    async def main() -> None:
        with Workspace(tmp_path) as ws:
            await DevToolset(ws).run("bash", {"command": f"echo hi; sleep {marker}"}, on_progress)

    try:
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="consumer broke"):
            asyncio.run(main())
        assert time.monotonic() - started < 10
        assert wait_until_gone("sleep", marker) == []
    finally:
        kill_all(live_processes_with_args("sleep", marker))
