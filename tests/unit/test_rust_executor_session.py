"""RustExecutor on a backend that opens sessions (a DockerBackend): one session for the executor's life.

The backend is the shipped FakeSessionFactory (``adk_sandbox.testing``): it has no ``execute`` of its own,
so a throw-away execution on it would fail the test.
"""

from __future__ import annotations

import pytest

from adk_sandbox.executor import Language, RustExecutor, SandboxFailedError
from adk_sandbox.testing import FakeSession, FakeSessionFactory


def test_the_executor_runs_every_step_in_one_session_it_closes() -> None:
    factory = FakeSessionFactory(languages=[Language.COMMAND])
    with RustExecutor(factory) as executor:
        assert len(factory.opened) == 1
        (session,) = factory.opened
        assert executor.backend is session and factory.workspaces == [None]
        executor.run("fn run(i: Value) -> Value { i }", 1)
        executor.run("fn run(i: Value) -> Value { i }", 2)
        assert len(factory.opened) == 1 and len(session.requests) >= 2
        assert not session.closed
    assert session.closed and session.close_calls == 1
    executor.close()
    assert session.close_calls == 1  # idempotent


def test_a_session_that_cannot_start_is_closed_and_the_error_raised() -> None:
    factory = FakeSessionFactory(start_error=SandboxFailedError("the sandbox container could not start"))
    with pytest.raises(SandboxFailedError, match="could not start"):
        RustExecutor(factory)
    assert [s.close_calls for s in factory.opened] == [1]


def test_a_session_is_used_as_given_and_not_closed() -> None:
    session = FakeSession(languages=[Language.COMMAND])
    with RustExecutor(session) as executor:
        assert executor.backend is session
    assert not session.closed and session.close_calls == 0
