"""The one tool protocol: every tool is an AgentTool, one argument formatter, call_tool never raises."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from adk_sandbox.devtools import DevToolset, PathNotFoundError, Workspace
from adk_sandbox.devtools.errors import ToolError as DevtoolsToolError
from adk_sandbox.executor.errors import SandboxFailedError
from adk_sandbox.executor.testing import FakeBackend
from adk_sandbox.executor.tool_protocol import (
    AgentTool,
    InvalidArgumentsError,
    ProgressCallback,
    ToolError,
    UnknownToolError,
    call_tool,
    find_tool,
    parse_arguments,
)
from adk_sandbox.executor.tools import CodeTool, SandboxTool


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int = Field(ge=1)


class _Raising(AgentTool):
    name = "raising"
    description = "raises what it is given"
    args_model = _Args

    def __init__(self, error: BaseException | None = None, result: dict[str, Any] | None = None) -> None:
        self.error, self.result = error, result

    async def _run(self, arguments: Any, on_progress: ProgressCallback | None) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        return self.result or {"n": arguments.n}


def test_every_project_tool_is_an_agent_tool(tmp_path: Path) -> None:
    with Workspace(tmp_path) as ws:
        tools = [*DevToolset(ws).tools, CodeTool(FakeBackend()), SandboxTool(FakeBackend())]
    assert all(isinstance(tool, AgentTool) for tool in tools)
    assert [t.name for t in tools] == [
        "read_file", "glob", "grep", "write_file", "edit_file", "bash", "code_exec", "sandbox_exec",
    ]  # fmt: skip
    for tool in tools:
        assert tool.description
        assert tool.parameters["type"] == "object"
        assert tool.parameters["additionalProperties"] is False


def test_devtools_errors_are_the_protocol_errors() -> None:
    assert DevtoolsToolError is ToolError
    assert issubclass(PathNotFoundError, ToolError)


@pytest.mark.parametrize(
    ("arguments", "needle"),
    [
        ({}, "missing required argument 'n'"),
        ({"n": 0}, "argument 'n': Input should be greater than or equal to 1"),
        ({"n": 1, "m": 2}, "unknown argument 'm'"),
        ("[1]", "must be a JSON object, got list"),
        ("{", "are not valid JSON"),
        ("[" * 500, "nested more than 200 levels"),
        (7, "must be a JSON object, got int"),
    ],
)
def test_one_formatter_names_the_tool_the_field_and_the_reason(arguments: object, needle: str) -> None:
    with pytest.raises(InvalidArgumentsError) as info:
        parse_arguments("demo", _Args, arguments)
    assert "demo" in str(info.value) and needle in str(info.value)


def test_the_code_tools_and_the_file_tools_word_a_bad_argument_alike(tmp_path: Path) -> None:
    code = asyncio.run(SandboxTool(FakeBackend()).run({"language": "command", "code": "x", "oops": 1}))
    assert code["status"] == "error"
    assert "unknown argument 'oops'" in code["message"] and "(accepted arguments:" in code["message"]
    with Workspace(tmp_path) as ws, pytest.raises(InvalidArgumentsError) as info:
        asyncio.run(DevToolset(ws).run("read_file", {"path": "f", "oops": 1}))
    assert "unknown argument 'oops'" in str(info.value) and "(accepted arguments:" in str(info.value)


@pytest.mark.parametrize(
    ("tool", "message"),
    [
        (_Raising(PathNotFoundError("no file 'x'")), "no file 'x'"),
        (_Raising(SandboxFailedError("the container went away")), "the container went away"),
        (_Raising(RuntimeError("boom")), "RuntimeError: boom"),
        (_Raising(result={"status": "error", "message": "compile failed"}), "compile failed"),
    ],
)
def test_call_tool_turns_every_failure_into_an_error_outcome(tool: _Raising, message: str) -> None:
    outcome = asyncio.run(call_tool(tool, {"n": 1}))
    assert not outcome.ok
    assert outcome.payload == {"status": "error", "message": message}
    assert outcome.message == message


def test_call_tool_reports_bad_arguments_and_success() -> None:
    bad = asyncio.run(call_tool(_Raising(), {"n": "many"}))
    assert not bad.ok and "argument 'n'" in bad.message
    good = asyncio.run(call_tool(_Raising(), '{"n": 3}'))
    assert good.ok and good.payload == {"n": 3} and good.message == ""


def test_call_tool_logs_an_unexpected_error(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="adk_sandbox.executor.tool_protocol"):
        asyncio.run(call_tool(_Raising(KeyError("k")), {"n": 1}))
    assert "tool raising failed unexpectedly" in caplog.text


def test_call_tool_lets_cancellation_through() -> None:
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(call_tool(_Raising(asyncio.CancelledError()), {"n": 1}))


def test_a_file_tool_failure_is_an_outcome_not_an_exception(tmp_path: Path) -> None:
    with Workspace(tmp_path) as ws:
        read = find_tool(DevToolset(ws).tools, "read_file")
        outcome = asyncio.run(call_tool(read, {"path": "missing.txt"}))
    assert not outcome.ok and "missing.txt" in outcome.message


def test_find_tool_names_the_available_tools() -> None:
    with pytest.raises(UnknownToolError, match="unknown tool 'rm'; available tools: raising"):
        find_tool([_Raising()], "rm")


def test_a_write_tool_object_refuses_on_a_read_only_workspace(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("keep\n")
    with Workspace(tmp_path, writable=False, allow_bash=False) as ws:
        toolset = DevToolset(ws)
        assert [t.name for t in toolset.tools] == ["read_file", "glob", "grep"]
        write = toolset._every["write_file"]  # not listed, but the object itself refuses too
        outcome = asyncio.run(call_tool(write, {"path": "f.txt", "content": "gone\n"}))
    assert not outcome.ok and "read-only" in outcome.message
    assert (tmp_path / "f.txt").read_text() == "keep\n"
