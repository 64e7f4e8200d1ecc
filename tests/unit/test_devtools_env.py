"""Which host variables a bash command receives, decided by the backend's capabilities (pure logic: the
backend is a fake that only reports capabilities; the real Docker case is in the integration tests).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from devtools import Workspace
from executor import (
    Capabilities,
    ExecRequest,
    ExecResult,
    IsolationClass,
    Language,
    OutputCallback,
    SandboxBackend,
)
from tests.conftest import full_container_capabilities


class ReportingBackend(SandboxBackend):
    """Reports the given capabilities and counts how often it was asked; never runs anything."""

    name = "reporting"

    def __init__(self, capabilities: Capabilities) -> None:
        self._capabilities = capabilities
        self.asked = 0

    def capabilities(self) -> Capabilities:
        self.asked += 1
        return self._capabilities

    def execute(
        self,
        request: ExecRequest,
        on_output: OutputCallback | None = None,
        *,
        cancel: threading.Event | None = None,
    ) -> ExecResult:
        raise AssertionError("not run in this test")


CONTAINER = full_container_capabilities(Language.COMMAND)
# A host process that reads the host's filesystem, reporting isolation "container" to show that the
# decision follows fs_read, not the isolation class.
HOST_VIEW = CONTAINER.model_copy(update={"fs_read": False})
OWN_VIEW_BELOW_CONTAINER = CONTAINER.model_copy(update={"isolation": IsolationClass.OS_ENFORCED})


@pytest.fixture
def host_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "ADK_TEST_SECRET": "hunter2",
        "LANG": "C.UTF-8",
        "PATH": "/host/bin",
        "HOME": "/home/host",
        "TMPDIR": "/host/tmp",
        "SHELL": "/bin/zsh",
        "USER": "host",
        "TERM": "xterm",
    }.items():
        monkeypatch.setenv(name, value)


@pytest.mark.usefixtures("host_env")
@pytest.mark.parametrize("inherit", [False, True])
@pytest.mark.parametrize("capabilities", [CONTAINER, OWN_VIEW_BELOW_CONTAINER], ids=["container", "bwrap"])
def test_a_sandbox_with_its_own_filesystem_gets_only_the_allowlist_minus_host_paths(
    tmp_path: Path, inherit: bool, capabilities: Capabilities
) -> None:
    backend = ReportingBackend(capabilities)
    with Workspace(tmp_path, inherit_env=inherit, sandbox=backend) as ws:
        assert ws.command_env(backend) == {"LANG": "C.UTF-8", "TERM": "xterm"}
    with Workspace(
        tmp_path, inherit_env=inherit, env_allowlist=["ADK_TEST_SECRET", "HOME"], sandbox=backend
    ) as ws:
        assert ws.command_env(backend) == {"ADK_TEST_SECRET": "hunter2"}  # named: passes; HOME never


@pytest.mark.usefixtures("host_env")
def test_a_backend_on_the_host_filesystem_gets_the_allowlist_or_everything(tmp_path: Path) -> None:
    backend = ReportingBackend(HOST_VIEW)
    with Workspace(tmp_path, sandbox=backend) as ws:
        env = ws.command_env(backend)
        assert env["PATH"] == "/host/bin" and env["HOME"] == "/home/host"
        assert "ADK_TEST_SECRET" not in env
    with Workspace(tmp_path, inherit_env=True, sandbox=backend) as ws:
        assert ws.command_env(backend).get("ADK_TEST_SECRET") == "hunter2"


def test_the_backend_is_asked_once(tmp_path: Path) -> None:
    backend = ReportingBackend(CONTAINER)
    with Workspace(tmp_path, sandbox=backend) as ws:
        for _ in range(3):
            ws.command_env(backend)
    assert backend.asked == 1
