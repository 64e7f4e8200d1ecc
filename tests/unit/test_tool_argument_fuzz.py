"""Any argument a model can send gives each tool's result or its documented error, never a dependency's
exception: the six workspace tools raise a ``ToolError`` (bash also an ``ExecutorError`` of its backend),
``sandbox_exec`` returns ``{"status": "error", "message": ...}``.

The workspace is a temporary directory; bash and sandbox_exec run on the host ProcessBackend, so hostile
commands really reach ``sh -c`` (the workspace caps every bash call at 2 seconds). The examples are
derandomized: CI runs the same commands every time. ``tool_fuzz_support`` holds the strategies and the
outcome checks, shared with the Docker run in tests/integration.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from pydantic import BaseModel

from adk_sandbox.devtools import DevToolset, InvalidArgumentsError, InvalidPathError, Workspace
from adk_sandbox.devtools.tools.bash import BashArgs
from adk_sandbox.devtools.tools.glob import GlobArgs
from adk_sandbox.executor import CodeTool, ProcessBackend, SandboxTool
from adk_sandbox.executor.testing import FakeBackend
from adk_sandbox.executor.tool_protocol import AgentTool, ProgressCallback, call_tool
from adk_sandbox.executor.types import ExecRequest, Language
from tests.unit.tool_fuzz_support import (
    BASH_CALLS,
    HUGE,
    SANDBOX_CALLS,
    WORKSPACE_CALLS,
    assert_sandbox_outcome,
    assert_workspace_outcome,
    seed_workspace,
)

FUZZ = settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def toolset(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevToolset]:
    """One workspace for every example (module scope: hypothesis re-runs the test body, not fixtures)."""
    root = tmp_path_factory.mktemp("fuzz-ws")
    with Workspace(root, bash_timeout=2) as ws:
        tools = DevToolset(ws)
        asyncio.run(seed_workspace(tools))
        yield tools


@pytest.fixture(scope="module")
def sandbox_tool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxTool]:
    """sandbox_exec on a host ProcessBackend working in a directory of its own."""
    with ProcessBackend(workdir=tmp_path_factory.mktemp("fuzz-sandbox")) as backend:
        yield SandboxTool(backend)


# -- the reported case ---------------------------------------------------------------------------------


def test_a_nul_byte_in_a_bash_command_is_the_tools_argument_error(tmp_path: Path) -> None:
    # Raised pydantic's ValidationError from ExecRequest before the command text was checked by BashArgs.
    async def call() -> None:
        with Workspace(tmp_path) as ws:
            await DevToolset(ws).run("bash", {"command": "echo a\x00b"})

    with pytest.raises(InvalidArgumentsError, match=r"'command'.*NUL byte \(\\x00\) at position 6") as info:
        asyncio.run(call())
    assert "a shell command cannot hold" in str(info.value)


# -- what is refused, what passes ------------------------------------------------------------------------


def test_odd_text_that_works_keeps_working(toolset: DevToolset) -> None:
    async def scenario() -> None:
        written = await toolset.run(
            "write_file", {"path": "nul.bin", "content": "a\x00b\x1b[0m\u2028\U0010ffff"}
        )
        assert written["bytes_written"] == len("a\x00b\x1b[0m\u2028".encode()) + 4
        assert (toolset.workspace.root / "nul.bin").read_bytes().startswith(b"a\x00b")
        edited = await toolset.run(
            "edit_file", {"path": "nul.bin", "old_string": "\x00", "new_string": "\x00\x00"}
        )
        assert edited["replacements"] == 1
        # A NUL in a regular expression searches for one: found past the 8 KiB a file is sniffed for binary.
        found = await toolset.run("grep", {"pattern": "\x00tail"})
        assert [match.split(":")[:2] for match in found["matches"]] == [["late-nul.txt", "1"]]
        shown = await toolset.run("bash", {"command": "printf '%s|' \x01 \x7f \u2028 \U0001f600"})
        assert shown["stdout"] == "\x01|\x7f|\u2028|\U0001f600|"
        # An infinite timeout is the workspace's ceiling, not an error.
        assert (await toolset.run("bash", {"command": "true", "timeout_secs": float("inf")}))[
            "exit_code"
        ] == 0

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("tool", "arguments", "error", "needle"),
    [
        ("bash", {"command": "echo \ud800"}, InvalidArgumentsError, "lone surrogate (U+D800 at position 5)"),
        ("bash", {"command": "true", "timeout_secs": float("nan")}, InvalidArgumentsError, "is NaN"),
        (
            "write_file",
            {"path": "x", "content": "\udfff"},
            InvalidArgumentsError,
            "'content': contains a lone",
        ),
        (
            "edit_file",
            {"path": "x", "old_string": "\ud800", "new_string": "y"},
            InvalidArgumentsError,
            "lone",
        ),
        ("glob", {"pattern": "a\x00*"}, InvalidArgumentsError, "which a file name cannot hold"),
        ("glob", {"pattern": "*" * 5000}, InvalidArgumentsError, "a glob pattern may be at most 4096"),
        (
            "grep",
            {"pattern": "x", "glob": "*.py\x00"},
            InvalidArgumentsError,
            "which a file name cannot hold",
        ),
        ("grep", {"pattern": "a" * 20000}, InvalidArgumentsError, "a regular expression may be at most"),
        ("grep", {"pattern": "\udc80"}, InvalidArgumentsError, "lone surrogate (U+DC80"),
        (
            "read_file",
            {"path": "a" * 9000},
            InvalidArgumentsError,
            "9000 characters long; a path may be at most 4095 bytes",
        ),
        (
            "read_file",
            {"path": "a/" * 2500},
            InvalidPathError,
            "path is too long (5000 bytes; the limit is 4095)",
        ),
        # Paths keep the workspace's own refusal, whichever tool names them.
        ("read_file", {"path": "a\x00b"}, InvalidPathError, "NUL byte"),
        ("glob", {"pattern": "*", "path": "\ud800"}, InvalidPathError, "lone surrogate"),
    ],
)
def test_odd_text_that_cannot_work_is_refused_in_words_for_the_model(
    toolset: DevToolset, tool: str, arguments: dict[str, Any], error: type[Exception], needle: str
) -> None:
    with pytest.raises(error) as info:
        asyncio.run(toolset.run(tool, arguments))
    assert needle in str(info.value)
    assert "unable to parse raw data" not in str(info.value)  # pydantic-core's words for a surrogate


def test_sandbox_exec_refuses_what_no_program_can_be_handed(sandbox_tool: SandboxTool) -> None:
    nul = sandbox_tool.run_sync({"language": "command", "code": "echo a\x00b"})
    assert nul["status"] == "error"
    assert "'code': contains a NUL byte" in nul["message"] and "ValidationError" not in nul["message"]
    lone = sandbox_tool.run_sync({"language": "command", "code": "cat", "stdin": "\ud800"})
    assert lone["status"] == "error" and "'stdin': contains a lone surrogate" in lone["message"]
    # Standard input is bytes: a NUL passes through.
    piped = sandbox_tool.run_sync({"language": "command", "code": "cat", "stdin": "a\x00b"})
    assert (piped["status"], piped["stdout"]) == ("success", "a\x00b")


def test_adapters_get_the_error_payload_through_call_tool(toolset: DevToolset) -> None:
    bash = next(tool for tool in toolset.tools if tool.name == "bash")
    outcome = asyncio.run(call_tool(bash, {"command": "echo a\x00b"}))
    assert not outcome.ok
    assert outcome.payload["status"] == "error" and "NUL byte" in outcome.message


def test_the_checks_leave_the_json_schemas_alone() -> None:
    # A validator placed before a constraint turns pydantic's exclusiveMinimum into a raw "gt" keyword,
    # which the Gemini schema conversion of the ADK adapter refuses.
    timeout = BashArgs.model_json_schema()["properties"]["timeout_secs"]["anyOf"][0]
    assert timeout == {"exclusiveMinimum": 0, "type": "number"}
    assert GlobArgs.model_json_schema()["properties"]["pattern"] == {
        "description": GlobArgs.model_fields["pattern"].description,
        "minLength": 1,
        "title": "Pattern",
        "type": "string",
    }


@pytest.mark.parametrize(
    "arguments",
    [
        {"code": "fn run(input: Value) -> Value { input } // \ud800"},
        {"code": "fn run(input: Value) -> Value { input }", "input": ["ok", "\udc00"]},
        {"code": "fn run(input: Value) -> Value { input }", "input": {"key\ud800": 1}},
    ],
)
def test_code_exec_refuses_lone_surrogates_in_code_and_input(arguments: dict[str, Any]) -> None:
    # json.dumps would escape them and serde_json refuse the escape: the input would arrive as null.
    backend = FakeBackend()
    result = CodeTool(backend).run_sync(arguments)
    assert result["status"] == "error" and "lone surrogate" in result["message"]
    assert backend.requests == []


# -- the last line of defence ----------------------------------------------------------------------------


class _Args(BaseModel):
    value: str = ""


class _Raising(AgentTool):
    """A tool whose layer below raises ``error``, as a dependency would."""

    name = "raising"
    description = "raises"
    args_model = _Args

    def __init__(self, error: BaseException, *, errors_are_results: bool = False) -> None:
        self.error = error
        self.errors_are_results = errors_are_results  # type: ignore[misc]

    async def _run(self, arguments: Any, on_progress: ProgressCallback | None) -> dict[str, Any]:
        raise self.error


def _validation_error() -> Exception:
    try:
        ExecRequest(language=Language.COMMAND, code="a\x00b", timeout=1)
    except Exception as exc:
        return exc
    raise AssertionError("ExecRequest took a NUL byte")


@pytest.mark.parametrize(
    ("error", "needle"),
    [
        (_validation_error(), "cannot be used: code: code contains a NUL byte"),
        (UnicodeEncodeError("utf-8", "x\ud800", 1, 2, "surrogates not allowed"), "U+D800 (a lone surrogate)"),
        (ValueError("embedded null byte"), "cannot be used: embedded null byte"),
    ],
)  # fmt: skip
def test_a_value_error_from_below_becomes_an_argument_error_logged_and_chained(
    error: Exception, needle: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING), pytest.raises(InvalidArgumentsError) as info:
        asyncio.run(_Raising(error).run({}))
    assert needle in str(info.value)
    assert info.value.__cause__ is error
    assert any(record.exc_info and record.exc_info[1] is error for record in caplog.records)
    as_result = asyncio.run(_Raising(error, errors_are_results=True).run({}))
    assert as_result == {"status": "error", "message": str(info.value)}


@pytest.mark.parametrize("error", [KeyError("bug"), TypeError("bug"), RuntimeError("bug")])
def test_other_exceptions_still_surface(error: Exception) -> None:
    with pytest.raises(type(error)):
        asyncio.run(_Raising(error).run({}))
    # Adapters still never abort: call_tool reports it (and logs the traceback).
    outcome = asyncio.run(call_tool(_Raising(error), {}))
    assert not outcome.ok and type(error).__name__ in outcome.message


# -- huge strings: explicit, not generated ----------------------------------------------------------------

_HUGE_FIELDS = [
    ("bash", "command", {}),
    ("read_file", "path", {}),
    ("write_file", "path", {"content": "x"}),
    ("write_file", "content", {"path": "huge.txt"}),
    ("edit_file", "path", {"old_string": "a", "new_string": "b"}),
    ("edit_file", "old_string", {"path": "a.txt", "new_string": "b"}),
    ("edit_file", "new_string", {"path": "a.txt", "old_string": "alpha"}),
    ("glob", "pattern", {}),
    ("glob", "path", {"pattern": "*"}),
    ("grep", "pattern", {}),
    ("grep", "path", {"pattern": "x"}),
    ("grep", "glob", {"pattern": "x"}),
]


@pytest.mark.parametrize(
    ("tool", "field", "rest"), _HUGE_FIELDS, ids=[f"{t}.{f}" for t, f, _ in _HUGE_FIELDS]
)
@pytest.mark.parametrize("shape", ["plain", "nul at the end", "surrogate at the end"])
def test_ten_megabytes_in_any_field(
    toolset: DevToolset, tool: str, field: str, rest: dict[str, Any], shape: str
) -> None:
    tail = {"plain": "", "nul at the end": "\x00", "surrogate at the end": "\ud800"}[shape]
    asyncio.run(toolset.run("read_file", {"path": "a.txt"}))  # so that edit_file gets past "read it first"
    assert_workspace_outcome(tool, asyncio.run(_outcome(toolset, tool, {**rest, field: HUGE + tail})))


def test_ten_megabytes_for_sandbox_exec(sandbox_tool: SandboxTool) -> None:
    for field in ("code", "stdin"):
        for tail in ("", "\x00", "\ud800"):
            arguments = {"language": "command", "code": "true", "timeout_secs": 1, field: HUGE + tail}
            assert_sandbox_outcome(sandbox_tool.run_sync(arguments))
    assert_sandbox_outcome(sandbox_tool.run_sync(json.dumps({"language": "command", "code": "#" + HUGE})))


async def _outcome(toolset: DevToolset, tool: str, arguments: Any) -> dict[str, Any] | BaseException:
    """The result, or the exception the call raised (checked by the caller, not re-raised)."""
    try:
        return await toolset.run(tool, arguments)
    except Exception as exc:
        return exc


# -- fuzzing -----------------------------------------------------------------------------------------------


@FUZZ
@given(WORKSPACE_CALLS)
def test_any_arguments_to_a_file_tool_give_its_result_or_its_error(
    toolset: DevToolset, call: tuple[str, Any]
) -> None:
    tool, arguments = call
    outcome = asyncio.run(_outcome(toolset, tool, arguments))
    event(f"{tool}: {type(outcome).__name__}")  # the spread of outcomes, in --hypothesis-show-statistics
    assert_workspace_outcome(tool, outcome)


@FUZZ
@given(BASH_CALLS)
def test_any_arguments_to_bash_give_its_result_or_its_error(toolset: DevToolset, arguments: Any) -> None:
    outcome = asyncio.run(_outcome(toolset, "bash", arguments))
    event(f"bash: {type(outcome).__name__}")
    assert_workspace_outcome("bash", outcome)


@FUZZ
@given(SANDBOX_CALLS)
def test_any_arguments_to_sandbox_exec_give_a_status(sandbox_tool: SandboxTool, arguments: Any) -> None:
    result = asyncio.run(sandbox_tool.run(arguments))
    event(f"sandbox_exec: {result.get('status')}")
    assert_sandbox_outcome(result)
