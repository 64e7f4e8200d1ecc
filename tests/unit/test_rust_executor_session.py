"""RustExecutor on a backend that opens sessions (a DockerBackend): one session for the executor's life."""

from __future__ import annotations

import threading

import pytest

from adk_sandbox.executor import ExecRequest, ExecResult, Language, RustExecutor, SandboxFailedError
from adk_sandbox.executor.backend import OutputCallback, SandboxBackend
from adk_sandbox.executor.types import Capabilities
from tests.conftest import full_container_capabilities


class FakeSession(SandboxBackend):
    name = "fake-session"

    def __init__(self, *, broken: bool = False) -> None:
        self.broken = broken
        self.closed = 0
        self.requests: list[ExecRequest] = []

    def capabilities(self) -> Capabilities:
        if self.broken:
            raise SandboxFailedError("the sandbox container could not start: scripted")
        return full_container_capabilities(Language.COMMAND)

    def execute(
        self,
        request: ExecRequest,
        on_output: OutputCallback | None = None,
        *,
        cancel: threading.Event | None = None,
    ) -> ExecResult:
        self.requests.append(request)
        return ExecResult(stdout="", stderr="", exit_code=0, duration_ms=1)

    def close(self) -> None:
        self.closed += 1


class SessionMaker(SandboxBackend):
    """Like DockerBackend: execute() would use a throw-away container, session() keeps one."""

    name = "session-maker"

    def __init__(self, *, broken: bool = False) -> None:
        self.broken = broken
        self.sessions: list[FakeSession] = []

    def capabilities(self) -> Capabilities:
        return full_container_capabilities(Language.COMMAND)

    def execute(
        self,
        request: ExecRequest,
        on_output: OutputCallback | None = None,
        *,
        cancel: threading.Event | None = None,
    ) -> ExecResult:
        raise AssertionError("the pipeline must not use throw-away executions")

    def session(self) -> FakeSession:
        self.sessions.append(FakeSession(broken=self.broken))
        return self.sessions[-1]


def test_the_executor_runs_every_step_in_one_session_it_closes() -> None:
    backend = SessionMaker()
    with RustExecutor(backend) as executor:
        assert len(backend.sessions) == 1
        (session,) = backend.sessions
        assert executor.backend is session
        executor.run("fn run(i: Value) -> Value { i }", 1)
        executor.run("fn run(i: Value) -> Value { i }", 2)
        assert len(backend.sessions) == 1 and len(session.requests) >= 2
        assert session.closed == 0
    assert session.closed == 1
    executor.close()
    assert session.closed == 1  # idempotent


def test_a_session_that_cannot_start_is_closed_and_the_error_raised() -> None:
    backend = SessionMaker(broken=True)
    with pytest.raises(SandboxFailedError, match="could not start"):
        RustExecutor(backend)
    assert [s.closed for s in backend.sessions] == [1]


def test_a_session_is_used_as_given_and_not_closed() -> None:
    session = FakeSession()
    with RustExecutor(session) as executor:
        assert executor.backend is session
    assert session.closed == 0
