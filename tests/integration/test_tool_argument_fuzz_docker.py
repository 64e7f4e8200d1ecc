"""bash and sandbox_exec on the real Docker backend: any argument gives a result or the documented error.

One session (one container) serves every example of both tools, opened before hypothesis runs: the
fuzz is about what the container's agent and the backend do with hostile text, not about starting
containers. Derandomized, so CI runs the same commands every time. Needs the engine and the base image.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings

from adk_sandbox.devtools import DevToolset, Workspace
from adk_sandbox.executor import SandboxTool
from adk_sandbox.executor.backends.docker import DockerBackend
from tests.conftest import project_containers
from tests.unit.tool_fuzz_support import (
    BASH_CALLS,
    HUGE,
    SANDBOX_CALLS,
    assert_sandbox_outcome,
    assert_workspace_outcome,
)

pytestmark = pytest.mark.docker

FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


async def _bash(tools: DevToolset, arguments: Any) -> dict[str, Any] | BaseException:
    try:
        return await tools.run("bash", arguments)
    except Exception as exc:
        return exc


def test_any_arguments_to_bash_and_sandbox_exec_in_one_container(
    docker_backend: DockerBackend, owned_workspace: Path
) -> None:
    before = set(project_containers(docker_backend._client, os.getpid()))
    with docker_backend.session(workspace=owned_workspace) as session:
        sandbox = SandboxTool(session)  # the tool uses the session as given: it does not close it
        with Workspace(owned_workspace, sandbox=session, bash_timeout=2) as ws:
            tools = DevToolset(ws)

            @FUZZ
            @given(BASH_CALLS, SANDBOX_CALLS)
            def both(bash_arguments: Any, sandbox_arguments: Any) -> None:
                outcome = asyncio.run(_bash(tools, bash_arguments))
                event(f"bash: {type(outcome).__name__}")
                assert_workspace_outcome("bash", outcome)
                result = asyncio.run(sandbox.run(sandbox_arguments))
                event(f"sandbox_exec: {result.get('status')}")
                assert_sandbox_outcome(result)

            both()
            for tail in ("", "\x00", "\ud800"):  # ten megabytes: explicit, not generated
                assert_workspace_outcome("bash", asyncio.run(_bash(tools, {"command": "#" + HUGE + tail})))
                for field in ("code", "stdin"):
                    arguments = {"language": "command", "code": "true", "timeout_secs": 1, field: HUGE + tail}
                    assert_sandbox_outcome(sandbox.run_sync(arguments))
            # Still the one container, and it still works after all of that.
            alive = asyncio.run(tools.run("bash", {"command": "echo alive"}))
            assert (alive["stdout"], alive["isolation"]) == ("alive\n", "container")
            during = set(project_containers(docker_backend._client, os.getpid()))
    assert len(during - before) == 1
