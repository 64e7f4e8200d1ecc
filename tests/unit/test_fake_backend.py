"""executor.testing.FakeBackend: the shipped fake records, answers as scripted, streams, and can break."""

from __future__ import annotations

import threading

import pytest

from adk_sandbox.executor import ExecRequest, ExecResult, Language, SandboxFailedError
from adk_sandbox.executor.testing import FakeBackend, container_capabilities
from adk_sandbox.executor.tools import SandboxTool


def test_the_docstring_example() -> None:
    fake = FakeBackend(stdout="hello\n")
    assert SandboxTool(fake).run_sync({"language": "command", "code": "echo hello"})["stdout"] == "hello\n"
    assert fake.requests[0].code == "echo hello"


def test_output_is_streamed_line_by_line_and_the_answer_can_depend_on_the_request() -> None:
    def respond(request: ExecRequest) -> ExecResult:
        return ExecResult(stdout=f"ran {request.code}\nsecond\n", stderr="warn\n", exit_code=3, duration_ms=1)

    fake = FakeBackend(respond)
    seen: list[tuple[str, str]] = []
    result = fake.execute(
        ExecRequest(language=Language.COMMAND, code="x", timeout=5), lambda s, c: seen.append((s, c))
    )
    assert result.exit_code == 3
    assert seen == [("stdout", "ran x\n"), ("stdout", "second\n"), ("stderr", "warn\n")]


def test_it_plays_broken_infrastructure_and_a_cancelled_call() -> None:
    broken = FakeBackend(error=SandboxFailedError("container vanished"))
    request = ExecRequest(language=Language.COMMAND, code="true", timeout=5)
    with pytest.raises(SandboxFailedError, match="container vanished"):
        broken.execute(request)
    assert broken.requests == [request]
    cancel = threading.Event()
    cancel.set()
    assert FakeBackend(stdout="never\n").execute(request, cancel=cancel).cancelled


def test_it_reports_what_it_is_given() -> None:
    assert FakeBackend().capabilities() == container_capabilities()
    only = container_capabilities(Language.PYTHON)
    assert FakeBackend(capabilities=only).capabilities().languages == (Language.PYTHON,)
    fake = FakeBackend()
    with fake:
        pass
    assert fake.closed
