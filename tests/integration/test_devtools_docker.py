"""devtools on the Docker backend: bash runs in one session container at the workspace's own path, and
the host file tools see (and contain) what the container writes. Needs the real engine and base image.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from devtools import DevToolset, PathEscapeError, Workspace

docker_module = pytest.importorskip("executor.backends.docker", reason="the Docker backend is not built in")


def test_bash_in_a_docker_session_and_host_tools_on_what_it_wrote(
    docker_backend: Any, owned_workspace: Path
) -> None:
    async def scenario() -> tuple[dict[str, Any], dict[str, Any], str]:
        with Workspace(owned_workspace, sandbox=docker_backend) as ws:
            tools = DevToolset(ws)
            first = await tools.run(
                "bash",
                {
                    "command": "pwd; id -u; hostname; echo made > made.txt; ln -s /etc/passwd esc; "
                    'ln -s "$(pwd)/made.txt" abs_in'
                },
            )
            second = await tools.run("bash", {"command": "hostname"})
            read = await tools.run("read_file", {"path": "abs_in"})  # an absolute link the container made
            with pytest.raises(PathEscapeError):
                await tools.run("read_file", {"path": "esc"})
            return first, second, read["content"]

    first, second, content = asyncio.run(scenario())
    pwd, uid, hostname = first["stdout"].splitlines()
    assert pwd == str(owned_workspace.resolve())
    assert uid == "1000"
    assert first["isolation"] in ("container", "gvisor")
    assert second["stdout"].strip() == hostname, "the second command ran in another container"
    assert content == "     1\tmade\n"
    remaining = [c.id for c in docker_backend._client.containers.list(all=True) if c.id.startswith(hostname)]
    assert remaining == [], "closing the workspace did not remove its session container"
