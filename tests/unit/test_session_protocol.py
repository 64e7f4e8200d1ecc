"""``adk_sandbox.executor.SessionFactory``: the one session protocol, used by Workspace and RustExecutor
(the shipped fakes of ``adk_sandbox.testing``: which object is asked for what; real sessions are in the
Docker integration tests)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from adk_sandbox import devtools, executor
from adk_sandbox.devtools import Workspace
from adk_sandbox.executor import (
    DockerBackend,
    Language,
    ProcessBackend,
    RustExecutor,
    SandboxBackend,
    SessionFactory,
)
from adk_sandbox.testing import FakeSessionFactory


class ReturnsNoBackend(FakeSessionFactory):
    """A broken factory: its ``session`` returns something that is not a backend."""

    def session(self, workspace: str | os.PathLike[str] | None = None) -> Any:
        self.workspaces.append(workspace)
        return object()


def test_the_protocol_is_one_class_exported_by_both_packages() -> None:
    assert devtools.SessionFactory is executor.SessionFactory
    assert issubclass(DockerBackend, SessionFactory)  # as written, without edits
    # The shipped fake factory is no SandboxBackend: only the protocol makes it usable.
    assert isinstance(FakeSessionFactory(), SessionFactory)
    assert not isinstance(FakeSessionFactory(), SandboxBackend)
    assert not isinstance(ProcessBackend(), SessionFactory)


def test_the_workspace_opens_enters_and_closes_one_session_bound_to_its_root(tmp_path: Path) -> None:
    factory = FakeSessionFactory()
    ws = Workspace(tmp_path, sandbox=factory)
    backend, starts_in_root = ws.bash_backend()
    (session,) = factory.opened
    assert ws.bash_backend()[0] is backend is session
    assert starts_in_root
    assert factory.workspaces == [ws.root]
    assert session.start_calls == 1 and not session.closed  # entered (started) once, not closed
    ws.close()
    assert session.closed and session.close_calls == 1


def test_a_factory_returning_something_else_than_a_backend_is_refused(tmp_path: Path) -> None:
    ws = Workspace(tmp_path, sandbox=ReturnsNoBackend())
    with ws, pytest.raises(TypeError, match="not a SandboxBackend"):
        ws.bash_backend()


def test_the_rust_executor_opens_its_session_without_a_workspace() -> None:
    factory = FakeSessionFactory(languages=[Language.COMMAND])
    with RustExecutor(factory) as rust:
        assert rust.backend is factory.opened[0]
    assert factory.workspaces == [None]
    assert factory.opened[0].closed and factory.opened[0].close_calls == 1
