"""code_exec / sandbox_exec argument handling: bad input is a JSON error or a clamped value, never raised."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest

from adk_sandbox.executor import (
    CodeTool,
    ExecResult,
    InvalidRequestError,
    SandboxTool,
)
from adk_sandbox.executor.testing import FakeBackend
from adk_sandbox.executor.tools import CodeExecArgs


def _error_message(result: dict[str, Any]) -> str:
    assert result["status"] == "error", result
    assert json.dumps(result)  # JSON-ready
    return str(result["message"])


@pytest.mark.parametrize(
    ("arguments", "needle"),
    [
        ({"code": ""}, "code"),
        ({"code": "   \n"}, "code must not be empty"),
        ({"code": 42}, "code"),
        ({"code": ["fn run"]}, "code"),
        ({}, "code"),
        ({"code": "fn run(i: Value) -> Value { i }", "timeout_secs": "x"}, "timeout_secs"),
        ({"code": "fn run(i: Value) -> Value { i }", "timeout_secs": float("nan")}, "timeout_secs"),
        ({"code": "fn run(i: Value) -> Value { i }", "surprise": 1}, "surprise"),
        ("not json at all", "not valid JSON"),
        ('["a", "list"]', "JSON object"),
    ],
)
def test_code_exec_bad_arguments_are_json_errors(arguments: Any, needle: str) -> None:
    backend = FakeBackend()
    result = CodeTool(backend).run_sync(arguments)
    assert needle in _error_message(result)
    assert backend.requests == []


@pytest.mark.parametrize(
    ("given", "clamped"), [(-5, 1.0), (0, 1.0), (0.5, 1.0), (10**9, 300.0), (45, 45.0), ("12", 12.0)]
)
def test_timeout_secs_is_clamped(given: Any, clamped: float) -> None:
    assert CodeExecArgs.model_validate({"code": "x", "timeout_secs": given}).timeout_secs == clamped
    backend = FakeBackend()
    result = SandboxTool(backend).run_sync({"language": "command", "code": "true", "timeout_secs": given})
    assert result["status"] == "success"
    assert backend.requests[0].timeout == clamped


def test_timeout_secs_defaults_to_30() -> None:
    backend = FakeBackend()
    SandboxTool(backend).run_sync({"language": "command", "code": "true"})
    assert backend.requests[0].timeout == 30.0


@pytest.mark.parametrize(
    ("arguments", "needle"),
    [
        ({"language": "cobol", "code": "x"}, "language"),
        ({"language": "command", "code": ""}, "code"),
        ({"language": "command", "code": 7}, "code"),
        ({"language": "command", "code": "true", "stdin": 5}, "stdin"),
        ({"language": "command", "code": "true", "timeout_secs": "x"}, "timeout_secs"),
    ],
)
def test_sandbox_exec_bad_arguments_are_json_errors(arguments: dict[str, Any], needle: str) -> None:
    backend = FakeBackend()
    assert needle in _error_message(SandboxTool(backend).run_sync(arguments))
    assert backend.requests == []


def test_unknown_language_error_lists_the_known_ones() -> None:
    message = _error_message(SandboxTool(FakeBackend()).run_sync({"language": "cobol", "code": "x"}))
    assert "'command'" in message and "'wasm'" in message


def test_infrastructure_failures_become_error_results() -> None:
    broken = FakeBackend(error=InvalidRequestError("language 'typescript' is not supported"))
    result = SandboxTool(broken).run_sync({"language": "typescript", "code": "1"})
    assert _error_message(result) == "InvalidRequestError: language 'typescript' is not supported"
    crashing = FakeBackend(error=RuntimeError("daemon went away"))
    assert "daemon went away" in _error_message(
        CodeTool(crashing).run_sync({"code": "fn run(i: Value) -> Value { i }"})
    )


@pytest.mark.parametrize(
    ("result", "status"),
    [
        (ExecResult(stdout="", stderr="", exit_code=0, duration_ms=1), "success"),
        (ExecResult(stdout="", stderr="", exit_code=2, duration_ms=1), "runtime_error"),
        (ExecResult(stdout="", stderr="", exit_code=None, timed_out=True, duration_ms=1), "timeout"),
        (ExecResult(stdout="", stderr="", exit_code=None, oom_killed=True, duration_ms=1), "memory_exceeded"),
    ],
)
def test_sandbox_exec_statuses(result: ExecResult, status: str) -> None:
    shaped = SandboxTool(FakeBackend(result)).run_sync({"language": "command", "code": "x"})
    assert shaped["status"] == status
    assert shaped["isolation"] == "container"
    assert set(shaped) == {
        "status",
        "exit_code",
        "stdout",
        "stderr",
        "timed_out",
        "truncated",
        "duration_ms",
        "isolation",
    }


def test_tools_describe_themselves_with_json_schemas() -> None:
    code_tool, sandbox_tool = CodeTool(FakeBackend()), SandboxTool(FakeBackend())
    assert (code_tool.name, sandbox_tool.name) == ("code_exec", "sandbox_exec")
    assert "fn run" in code_tool.description and sandbox_tool.description
    code_schema, sandbox_schema = code_tool.parameters, sandbox_tool.parameters
    assert code_schema["required"] == ["code"] and set(code_schema["properties"]) == {
        "code",
        "input",
        "timeout_secs",
    }
    assert code_schema["properties"]["timeout_secs"]["default"] == 30.0
    assert code_schema["additionalProperties"] is False
    assert sandbox_schema["required"] == ["language", "code"]
    languages = sandbox_schema["$defs"]["Language"]["enum"]
    assert "command" in languages and "wasm" in languages
    json.dumps(code_schema)
    json.dumps(sandbox_schema)


def test_async_run_gives_the_same_result_off_the_event_loop() -> None:
    backend = FakeBackend(stdout="ok\n")
    tool = SandboxTool(backend)

    result = asyncio.run(tool.run({"language": "command", "code": "echo ok"}))
    assert result["status"] == "success" and result["stdout"] == "ok\n"
    assert backend.threads != [threading.get_ident()]  # the blocking call ran in a worker thread
    assert asyncio.run(tool.run({"code": 1}))["status"] == "error"


def test_code_exec_rejection_is_information() -> None:
    result = CodeTool(FakeBackend()).run_sync({"code": "fn main() {}"})
    assert result["status"] == "rejected" and "fn main" in result["message"]
    assert set(result) == {"status", "message"}
