"""devtools on Docker: host secrets never enter the container, also with ``inherit_env=True``.
Needs the real engine and base image.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from adk_sandbox.devtools import DevToolset, Workspace
from adk_sandbox.executor.backends.docker import DockerBackend

pytestmark = pytest.mark.docker


def test_inherit_env_passes_no_host_secret_into_a_container(
    docker_backend: DockerBackend, owned_workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ADK_TEST_SECRET", "hunter2-in-docker")
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.setenv("HOME", "/root/host-home")
    monkeypatch.setenv("PATH", "/host-only/bin:" + "/usr/bin:/bin")

    async def env_of(ws: Workspace) -> list[str]:
        result = await DevToolset(ws).run("bash", {"command": "env"})
        assert result["exit_code"] == 0, result
        return str(result["stdout"]).splitlines()

    with Workspace(owned_workspace, inherit_env=True, sandbox=docker_backend) as ws:
        lines = asyncio.run(env_of(ws))
    assert not [line for line in lines if "hunter2" in line]
    assert "LANG=C.UTF-8" in lines  # allowlisted and not host-specific: passes
    assert "HOME=/home/sandbox" in lines  # the image's, not the host's
    assert not [line for line in lines if "host-only" in line or "host-home" in line]

    with Workspace(
        owned_workspace, inherit_env=True, env_allowlist=["ADK_TEST_SECRET"], sandbox=docker_backend
    ) as ws:
        assert "ADK_TEST_SECRET=hunter2-in-docker" in asyncio.run(env_of(ws))  # named by the caller: passes
