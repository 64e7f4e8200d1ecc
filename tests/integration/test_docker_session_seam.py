"""The session's seams against the real engine: the transport is injectable, and the channel in use is
reported by ``capabilities()`` (issue 11, "The seam").
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import docker
import pytest

from adk_sandbox.executor import ExecRequest, Language, PolicyNotEnforceableError
from adk_sandbox.executor._output import OutputCapture
from adk_sandbox.executor.backends.docker import DockerBackend
from adk_sandbox.executor.backends.docker.session import DockerSession, agent_transport
from adk_sandbox.executor.channel.agent_transport import AgentTransport
from adk_sandbox.executor.channel.transport import CommandOutcome, CommandTransport, PreparedCommand
from tests.conftest import containers_mounting, project_containers

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]


def test_capabilities_report_the_channel_in_use(owned_workspace: Path) -> None:
    with DockerBackend(transport="agent") as backend:  # the one channel, still accepted by name
        assert backend.capabilities().channel == "agent"
        with backend.session(workspace=owned_workspace) as session:
            assert session.capabilities().channel == "agent" == session.channel


class _CountingTransport:
    """Wraps a real transport and counts what goes through it: proves the session uses the injected one."""

    def __init__(self, inner: CommandTransport) -> None:
        self.inner = inner
        self.argvs: list[tuple[str, ...]] = []
        self.closed = False

    channel = "counting"  # not the agent's name: capabilities() must report the injected one

    def run(
        self,
        command: PreparedCommand,
        capture: OutputCapture,
        *,
        deadline: float,
        cancel: threading.Event | None,
    ) -> CommandOutcome:
        self.argvs.append(command.argv)
        return self.inner.run(command, capture, deadline=deadline, cancel=cancel)

    def close(self) -> None:
        self.closed = True
        self.inner.close()


def test_an_injected_transport_carries_every_command_including_the_start_up_check(
    docker_backend: DockerBackend, owned_workspace: Path
) -> None:
    made: list[_CountingTransport] = []

    def factory(
        client: docker.DockerClient,
        container_id: str,
        on_restart: Callable[[str], None],
        *,
        setid_allowed: bool,
    ) -> CommandTransport:
        assert not setid_allowed  # a hardened session keeps the filter
        made.append(
            _CountingTransport(agent_transport(client, container_id, on_restart, setid_allowed=False))
        )
        return made[-1]

    config = docker_backend.session(workspace=owned_workspace)._config
    session = DockerSession(docker_backend._client, config, transport=factory)
    try:
        result = session.execute(ExecRequest(language=Language.COMMAND, code="echo via-injected", timeout=30))
        assert result.stdout == "via-injected\n"
        (transport,) = made
        assert isinstance(transport.inner, AgentTransport)
        assert "adk-sandbox-probe" in transport.argvs[0]  # the start-up check went through it too
        assert any("echo via-injected" in argv for argv in transport.argvs)
        assert session.capabilities().channel == "counting"
    finally:
        session.close()
    assert transport.closed
    assert containers_mounting(docker_backend._client, owned_workspace) == []


def test_a_transport_that_lets_set_id_modes_through_is_refused_at_start(
    docker_backend: DockerBackend, owned_workspace: Path
) -> None:
    """The start-up check goes through the injected transport: one that does not install the set-id
    filter (here: one that fakes the probe's answer) cannot slip past it, and the container is removed."""

    class _Lying(_CountingTransport):
        def run(
            self,
            command: PreparedCommand,
            capture: OutputCapture,
            *,
            deadline: float,
            cancel: threading.Event | None,
        ) -> CommandOutcome:
            if "adk-sandbox-probe" in command.argv:
                capture.feed("stdout", b"setid-allowed\n")
                return CommandOutcome(exit_code=0)
            return super().run(command, capture, deadline=deadline, cancel=cancel)

    def factory(
        client: docker.DockerClient,
        container_id: str,
        on_restart: Callable[[str], None],
        *,
        setid_allowed: bool,
    ) -> CommandTransport:
        return _Lying(agent_transport(client, container_id, on_restart, setid_allowed=setid_allowed))

    config = docker_backend.session(workspace=owned_workspace)._config
    session = DockerSession(docker_backend._client, config, transport=factory)
    with pytest.raises(PolicyNotEnforceableError, match="setuid"):
        session.start()
    session.close()
    assert containers_mounting(docker_backend._client, owned_workspace) == []


def test_sandbox_tool_on_a_docker_backend_holds_one_session(docker_backend: DockerBackend) -> None:
    """sandbox_exec rides on one session's channel: one container for every call, removed at close."""
    from adk_sandbox.executor import SandboxTool  # noqa: PLC0415 - the tool under test

    before = set(project_containers(docker_backend._client, os.getpid()))
    with SandboxTool(docker_backend) as tool:
        first = tool.run_sync({"language": "command", "code": "echo kept > /tmp/state"})
        assert first["status"] == "success", first
        second = tool.run_sync({"language": "command", "code": "cat /tmp/state"})
        assert second["status"] == "success" and second["stdout"] == "kept\n", second
        assert second["isolation"] == "container"
        (container,) = set(project_containers(docker_backend._client, os.getpid())) - before
    assert container not in project_containers(docker_backend._client, os.getpid())
    closed = tool.run_sync({"language": "command", "code": "true"})
    assert closed["status"] == "error" and "closed" in closed["message"]
