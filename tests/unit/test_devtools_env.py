"""Which host variables a bash command receives, decided by the backend's capabilities (pure logic: the
backend is a fake that only reports capabilities; the real Docker case is in the integration tests).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from adk_sandbox.devtools import Workspace
from adk_sandbox.executor import Capabilities, IsolationClass, Language
from adk_sandbox.testing import FakeBackend, container_capabilities


def reporting(capabilities: Capabilities) -> FakeBackend:
    """The shipped fake reporting ``capabilities`` (it counts the asks) and refusing to run anything."""
    return FakeBackend(capabilities=capabilities, error=AssertionError("not run in this test"))


CONTAINER = container_capabilities(Language.COMMAND)  # host_filesystem, host_environment: False
# Reporting isolation "container" while seeing the host's filesystem and environment, to show that the
# decision follows the two host_* fields, not the isolation class.
HOST_PROCESS = CONTAINER.model_copy(update={"host_filesystem": True, "host_environment": True})
# Bubblewrap binding "/": the host's files as they are, but a sandbox that keeps host variables out.
HOST_FILES_ONLY = CONTAINER.model_copy(
    update={"isolation": IsolationClass.OS_ENFORCED, "host_filesystem": True, "fs_read": False}
)
OWN_VIEW_BELOW_CONTAINER = CONTAINER.model_copy(update={"isolation": IsolationClass.OS_ENFORCED})
# An attached container with an extra host volume: reads are not confined (fs_read False), yet its
# commands see the image's filesystem and must not get host paths or, with inherit_env, host secrets.
CONTAINER_WITH_EXTRA_MOUNT = CONTAINER.model_copy(update={"fs_read": False, "fs_write": False})


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
    backend = reporting(capabilities)
    with Workspace(tmp_path, inherit_env=inherit, sandbox=backend) as ws:
        assert ws.command_env(backend) == {"LANG": "C.UTF-8", "TERM": "xterm"}
    with Workspace(
        tmp_path, inherit_env=inherit, env_allowlist=["ADK_TEST_SECRET", "HOME"], sandbox=backend
    ) as ws:
        assert ws.command_env(backend) == {"ADK_TEST_SECRET": "hunter2"}  # named: passes; HOME never


@pytest.mark.usefixtures("host_env")
def test_a_backend_on_the_host_filesystem_gets_the_allowlist_or_everything(tmp_path: Path) -> None:
    backend = reporting(HOST_PROCESS)
    with Workspace(tmp_path, sandbox=backend) as ws:
        env = ws.command_env(backend)
        assert env["PATH"] == "/host/bin" and env["HOME"] == "/home/host"
        assert "ADK_TEST_SECRET" not in env
    with Workspace(tmp_path, inherit_env=True, sandbox=backend) as ws:
        assert ws.command_env(backend).get("ADK_TEST_SECRET") == "hunter2"


HOST_PATHS = {"PATH": "/host/bin", "HOME": "/home/host", "TMPDIR": "/host/tmp", "SHELL": "/bin/zsh"}
SAFE = {"LANG": "C.UTF-8", "TERM": "xterm"}


@pytest.mark.usefixtures("host_env")
@pytest.mark.parametrize(
    ("capabilities", "inherit", "expected"),
    [
        (HOST_PROCESS, False, {**SAFE, **HOST_PATHS, "USER": "host"}),
        (HOST_PROCESS, True, "everything"),
        (HOST_FILES_ONLY, False, {**SAFE, **HOST_PATHS, "USER": "host"}),
        (HOST_FILES_ONLY, True, {**SAFE, **HOST_PATHS, "USER": "host"}),  # inherit_env refused
        (CONTAINER, True, SAFE),
        (CONTAINER_WITH_EXTRA_MOUNT, False, SAFE),
        (CONTAINER_WITH_EXTRA_MOUNT, True, SAFE),
    ],
    ids=[
        "host-process",
        "host-process-inherit",
        "bwrap-root-bound",
        "bwrap-root-bound-inherit",
        "container-inherit",
        "extra-mount",
        "extra-mount-inherit",
    ],
)
def test_the_environment_follows_host_filesystem_and_host_environment(
    tmp_path: Path, capabilities: Capabilities, inherit: bool, expected: dict[str, str] | str
) -> None:
    backend = reporting(capabilities)
    with Workspace(tmp_path, inherit_env=inherit, sandbox=backend) as ws:
        env = ws.command_env(backend)
    if expected == "everything":
        assert env == dict(os.environ)
    else:
        assert env == expected


def test_the_backend_is_asked_once(tmp_path: Path) -> None:
    backend = reporting(CONTAINER)
    with Workspace(tmp_path, sandbox=backend) as ws:
        for _ in range(3):
            ws.command_env(backend)
    assert backend.capabilities_asked == 1
