"""What the Docker-engine conformance modules share: the limits their backends enforce, a leftovers check."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import docker

from adk_sandbox.executor import ResourceLimits, SandboxBackend

#: Small enough that the memory and pids checks are quick; large enough for every other check.
LIMITS = ResourceLimits(memory_mb=128, pids=128)


def containers_left(client: docker.DockerClient) -> Callable[[SandboxBackend], Sequence[str]]:
    """For a closed session: the containers on ``client``'s engine still labelled with its session id."""

    def left(session: SandboxBackend) -> list[str]:
        session_id = getattr(session, "session_id")  # noqa: B009 - every Docker session has one
        listed = client.containers.list(
            all=True, sparse=True, filters={"label": f"io.adk-sandbox.session={session_id}"}
        )
        return [f"container {container.id}" for container in listed]

    return left
