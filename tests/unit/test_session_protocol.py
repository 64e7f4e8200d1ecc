"""``adk_sandbox.executor.SessionFactory``: the one session protocol, used by Workspace and RustExecutor
(fakes only: which object is asked for what; real sessions are in the Docker integration tests)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from adk_sandbox import devtools, executor
from adk_sandbox.devtools import Workspace
from adk_sandbox.executor import (
    Capabilities,
    DockerBackend,
    ExecRequest,
    ExecResult,
    Language,
    OutputCallback,
    ProcessBackend,
    RustExecutor,
    SandboxBackend,
    SessionFactory,
)
from tests.conftest import full_container_capabilities


class Session(SandboxBackend):
    name = "fake-session"

    def __init__(self) -> None:
        self.entered = self.closed = 0

    def __enter__(self) -> Session:
        self.entered += 1
        return self

    def capabilities(self) -> Capabilities:
        return full_container_capabilities(Language.COMMAND)

    def execute(
        self,
        request: ExecRequest,
        on_output: OutputCallback | None = None,
        *,
        cancel: threading.Event | None = None,
    ) -> ExecResult:
        return ExecResult(stdout="", stderr="", exit_code=0, duration_ms=1)

    def close(self) -> None:
        self.closed += 1


class Factory:
    """Opens sessions and is not a SandboxBackend: only the protocol makes it usable."""

    def __init__(self, session: object = None) -> None:
        self.calls: list[str | os.PathLike[str] | None] = []
        self.made = session if session is not None else Session()

    def session(self, workspace: str | os.PathLike[str] | None = None) -> SandboxBackend:
        self.calls.append(workspace)
        return self.made  # type: ignore[return-value]  # a bad factory in one test


def test_the_protocol_is_one_class_exported_by_both_packages() -> None:
    assert devtools.SessionFactory is executor.SessionFactory
    assert issubclass(DockerBackend, SessionFactory)  # as written, without edits
    assert isinstance(Factory(), SessionFactory)
    assert not isinstance(ProcessBackend(), SessionFactory)


def test_the_workspace_opens_enters_and_closes_one_session_bound_to_its_root(tmp_path: Path) -> None:
    factory = Factory()
    ws = Workspace(tmp_path, sandbox=factory)  # type: ignore[arg-type]  # structural: a Factory is one
    backend, starts_in_root = ws.bash_backend()
    assert ws.bash_backend()[0] is backend is factory.made
    assert starts_in_root
    assert factory.calls == [ws.root]
    assert isinstance(backend, Session) and backend.entered == 1 and backend.closed == 0
    ws.close()
    assert backend.closed == 1


def test_a_factory_returning_something_else_than_a_backend_is_refused(tmp_path: Path) -> None:
    ws = Workspace(tmp_path, sandbox=Factory(session=object()))  # type: ignore[arg-type]
    with ws, pytest.raises(TypeError, match="not a SandboxBackend"):
        ws.bash_backend()


def test_the_rust_executor_opens_its_session_without_a_workspace() -> None:
    factory = Factory()
    with RustExecutor(factory) as rust:
        assert rust.backend is factory.made
    assert factory.calls == [None]
    assert isinstance(factory.made, Session) and factory.made.closed == 1
