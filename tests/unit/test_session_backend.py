"""``adk_sandbox.executor.backend.SessionBackend``: what a session-opening backend holds, runs and remembers
(with the shipped FakeSession: the bookkeeping; the Docker and Kubernetes backends built on it are tested
against their engines)."""

from __future__ import annotations

import os

import pytest

from adk_sandbox.executor import Capabilities, ExecRequest, Language, SandboxFailedError
from adk_sandbox.executor.backend import SessionBackend
from adk_sandbox.testing import FakeSession, container_capabilities


class Backend(SessionBackend[FakeSession]):
    """A SessionBackend opening the shipped FakeSessions ``s0``, ``s1``, ... (each answers its own id)."""

    name = "fake"

    def __init__(self) -> None:
        super().__init__()
        self.opened: list[FakeSession] = []
        self.probes = 0

    def session(self, workspace: str | os.PathLike[str] | None = None) -> FakeSession:
        name = f"s{len(self.opened)}"
        session = FakeSession(stdout=name, session_id=name, languages=[Language.COMMAND], workspace=workspace)
        self.opened.append(session)
        return self._track(session)

    def _probe_capabilities(self) -> Capabilities:
        self.probes += 1
        with self.session() as probe:
            return probe.capabilities()


REQUEST = ExecRequest(language=Language.COMMAND, code="true", timeout=5)


def test_sessions_lists_the_open_ones_and_finds_them_by_id() -> None:
    backend = Backend()
    first, second, third = backend.session(), backend.session(), backend.session()
    second.close()
    assert set(backend.sessions()) == {first, third}
    assert backend.session_by_id("s2") is third
    assert backend.session_by_id("s1") is None  # closed
    assert backend.session_by_id("nope") is None
    assert not first.closed and second.closed


def test_a_long_lived_backend_does_not_hold_the_sessions_closed_meanwhile() -> None:
    backend = Backend()
    for _ in range(100):
        backend.session().close()
        assert backend.execute(REQUEST).exit_code == 0  # a throw-away session each
    assert backend.sessions() == ()
    assert len(backend._sessions) <= 1  # at most the last one closed: dropped by the next open or listing


def test_execute_runs_each_request_in_a_fresh_session_that_it_closes() -> None:
    backend = Backend()
    assert backend.execute(REQUEST).stdout == "s0"
    assert backend.execute(REQUEST).stdout == "s1"
    assert [s.closed for s in backend.opened] == [True, True]
    assert [len(s.requests) for s in backend.opened] == [1, 1]


def test_close_closes_what_the_caller_left_open_and_a_closed_session_refuses() -> None:
    backend = Backend()
    with backend:
        left = backend.session()
        left.start()
    assert left.closed and backend.sessions() == ()
    with pytest.raises(SandboxFailedError, match="closed"):
        left.execute(REQUEST)
    backend.close()  # idempotent


def test_capabilities_are_probed_once() -> None:
    backend = Backend()
    assert backend.capabilities() == backend.capabilities() == container_capabilities(Language.COMMAND)
    assert backend.probes == 1
    assert backend.isolation() is backend.capabilities().isolation
    assert [s.closed for s in backend.opened] == [True]  # the probe session was closed


def test_entering_a_session_starts_it() -> None:
    with Backend().session() as session:
        assert session.started and session.start_calls == 1
