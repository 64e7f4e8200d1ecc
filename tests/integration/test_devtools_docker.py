"""devtools on the Docker backend: bash runs in one session container at the workspace's own path, and
the host file tools see (and contain) what the container writes. Needs the real engine and base image.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from adk_sandbox.devtools import DevToolset, PathEscapeError, Workspace
from adk_sandbox.executor.backends.docker import DockerBackend
from tests.conftest import project_containers

pytestmark = pytest.mark.docker


def test_bash_in_a_docker_session_and_host_tools_on_what_it_wrote(
    docker_backend: DockerBackend, owned_workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", "/root")  # host values of allowlisted variables must not reach a container
    before = set(project_containers(docker_backend._client, os.getpid()))

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], str, set[str]]:
        with Workspace(owned_workspace, sandbox=docker_backend) as ws:
            tools = DevToolset(ws)
            first = await tools.run(
                "bash",
                {
                    "command": "pwd; id -u; echo $HOME; echo made > made.txt; echo state > /tmp/state; "
                    'ln -s /etc/passwd esc; ln -s "$(pwd)/made.txt" abs_in'
                },
            )
            second = await tools.run("bash", {"command": "cat /tmp/state"})  # same container: its /tmp
            read = await tools.run("read_file", {"path": "made.txt"})  # at once, no sync step
            assert (await tools.run("read_file", {"path": "abs_in"}))["content"] == read["content"]
            with pytest.raises(PathEscapeError):
                await tools.run("read_file", {"path": "esc"})
            during = set(project_containers(docker_backend._client, os.getpid()))
            return first, second, read["content"], during

    first, second, content, during = asyncio.run(scenario())
    assert first["stdout"].splitlines() == [str(owned_workspace.resolve()), "1000", "/home/sandbox"]
    assert first["isolation"] == "container"
    assert second["stdout"] == "state\n", "the second command ran in another container"
    assert content == "     1\tmade\n"
    made = (owned_workspace / "made.txt").stat()
    assert (made.st_uid, made.st_gid) == (1000, 1000)
    assert len(during - before) == 1  # one session container while the workspace was open
    after = set(project_containers(docker_backend._client, os.getpid()))
    assert after <= before, "closing the workspace left its container"
