"""The shipped fakes (``adk_sandbox.testing``): FakeBackend records, answers as scripted, streams, and can
break; FakeSession adds a real session's lifecycle; FakeSessionFactory opens and tracks them."""

from __future__ import annotations

import threading

import pytest

from adk_sandbox.executor import (
    ExecRequest,
    ExecResult,
    Language,
    PolicyNotEnforceableError,
    SandboxBackend,
    SandboxFailedError,
    SessionFactory,
)
from adk_sandbox.executor.backend import SandboxSession
from adk_sandbox.executor.testing import FakeBackend, FakeSession, FakeSessionFactory, container_capabilities
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


# -- FakeSession and FakeSessionFactory ------------------------------------------------------------------


REQUEST = ExecRequest(language=Language.COMMAND, code="true", timeout=5)


def test_the_kit_is_public_under_adk_sandbox_testing() -> None:
    import adk_sandbox.testing as kit  # noqa: PLC0415 - the public module itself is under test

    assert kit.FakeBackend is FakeBackend and kit.FakeSession is FakeSession
    assert kit.FakeSessionFactory is FakeSessionFactory
    assert kit.ConformanceSuite.__module__ == "adk_sandbox.executor.testing.conformance"
    assert set(kit.CHECKS) >= {"results", "timeout", "close_leaves_nothing"}


def test_a_fake_session_starts_on_entry_or_first_use_and_refuses_once_closed() -> None:
    session = FakeSession(stdout="hi\n", session_id="s1", workspace="/w")
    assert isinstance(session, SandboxSession) and session.session_id == "s1" and session.workspace == "/w"
    assert not session.started
    assert session.execute(REQUEST).stdout == "hi\n"
    assert session.started and session.start_calls == 1 and session.requests == [REQUEST]
    with session as entered:
        assert entered is session and session.start_calls == 2  # idempotent: started once
    assert session.closed and session.close_calls == 1
    with pytest.raises(SandboxFailedError, match="closed"):
        session.execute(REQUEST)
    with pytest.raises(SandboxFailedError, match="closed"):
        session.start()
    assert session.requests == [REQUEST]  # a refused command is not recorded
    session.close()
    assert session.close_calls == 2 and session.closed


def test_a_fake_session_that_cannot_start_raises_until_the_error_is_cleared() -> None:
    session = FakeSession(start_error=SandboxFailedError("the container could not start"))
    for call in (session.start, session.capabilities, lambda: session.execute(REQUEST)):
        with pytest.raises(SandboxFailedError, match="could not start"):
            call()
    assert not session.started and session.requests == [] and session.capabilities_asked == 0
    session.start_error = None
    assert session.capabilities() == container_capabilities() and session.started
    assert session.capabilities_asked == 1
    assert FakeSession().session_id != FakeSession().session_id  # unique by default


def test_a_fake_session_answers_and_breaks_like_a_fake_backend() -> None:
    seen: list[tuple[str, str]] = []
    session = FakeSession(ExecResult(stdout="a\nb\n", stderr="", exit_code=2, duration_ms=1))
    assert session.execute(REQUEST, lambda s, c: seen.append((s, c))).exit_code == 2
    assert seen == [("stdout", "a\n"), ("stdout", "b\n")]
    session.error = SandboxFailedError("the agent died")
    with pytest.raises(SandboxFailedError, match="agent died"):
        session.execute(REQUEST)
    assert len(session.requests) == 2


def test_a_fake_factory_opens_tracks_and_closes_sessions() -> None:
    factory = FakeSessionFactory(stdout="ok\n", languages=[Language.COMMAND])
    assert isinstance(factory, SessionFactory) and not isinstance(factory, SandboxBackend)
    first, second = factory.session(workspace="/w"), factory.session()
    assert [s.session_id for s in factory.opened] == ["fake-0", "fake-1"]
    assert factory.workspaces == ["/w", None] and first.workspace == "/w"
    assert first.execute(REQUEST).stdout == "ok\n"
    assert first.capabilities().languages == (Language.COMMAND,) == factory.capabilities().languages
    second.close()
    assert factory.sessions() == (first,)
    assert factory.session_by_id("fake-0") is first and factory.session_by_id("fake-1") is None
    with factory:
        pass
    assert factory.closed and first.closed and factory.sessions() == ()


def test_a_fake_factory_can_fail_to_open_or_to_start() -> None:
    factory = FakeSessionFactory(open_error=SandboxFailedError("the engine is gone"))
    with pytest.raises(SandboxFailedError, match="engine is gone"):
        factory.session(workspace="/w")
    assert factory.opened == [] and factory.workspaces == ["/w"]
    factory.open_error = None
    factory.start_error = PolicyNotEnforceableError("no runtime 'runsc'")
    session = factory.session()
    with pytest.raises(PolicyNotEnforceableError, match="runsc"), session:
        pass
    assert not session.started and factory.opened == [session]
