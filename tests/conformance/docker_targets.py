"""What the Docker-engine conformance modules share: the limits their backends enforce, gVisor's known
differences, the target of a backend, a leftovers check."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import docker
import pytest

from adk_sandbox.executor import ResourceLimits, SandboxBackend, SandboxFailedError
from adk_sandbox.executor.backends.docker import DockerBackend
from adk_sandbox.testing import ConformanceTarget, KnownDifference
from tests.conformance.table import column

#: Small enough that the memory and pids checks are quick; large enough for every other check.
LIMITS = ResourceLimits(memory_mb=128, pids=128)

#: gVisor's limits: its sentry's own threads count against the container's pids limit (see below).
GVISOR_LIMITS = ResourceLimits(memory_mb=LIMITS.memory_mb)

#: What a gVisor session does differently, on any engine.
GVISOR_KNOWN_DIFFERENCES = {
    "pids_limit": KnownDifference(
        "under gVisor the container's pids limit counts the sandbox's host threads (its sentry "
        "and gofer), not the processes inside: a limit of 128 starves the sentry, and a few "
        "hundred sleeping processes kill or wedge the sandbox (the session replaces its "
        "container) before the limit refuses a fork; not run, as it would break the shared "
        "session",
        run=False,
    ),
    "memory_limit": KnownDifference(
        "under gVisor the memory limit covers the whole sandbox, its sentry included: an "
        "allocation past it kills or wedges the sandbox, so the command ends in "
        "SandboxFailedError (the session then replaces its container), not in an oom_killed "
        "result",
        raises=SandboxFailedError,
    ),
}


def docker_target(
    backend: DockerBackend,
    tmp_path_factory: pytest.TempPathFactory,
    *,
    table: str | None = None,
    warm_pool: Callable[[], SandboxBackend] | None = None,
    **known: KnownDifference,
) -> ConformanceTarget:
    """The suite's target on ``backend``: a workspace owned by uid 1000 (as a checkout is), its limits, the
    containers a closed session left on its engine; ``table``: its column of docs/CAPABILITIES.md,
    ``warm_pool``: makes a pooled backend of the same engine; ``known``: the checks it fails, by name."""
    workspace = tmp_path_factory.mktemp("conformance-ws")
    os.chown(workspace, 1000, 1000)
    limits = backend.config.limits
    return ConformanceTarget(
        backend,
        workspace=workspace,
        memory_limit_mb=limits.memory_mb,
        pids_limit=limits.pids,
        leftovers=containers_left(backend._client),
        known_differences=known,
        warm_pool=warm_pool,
        table=column(table) if table is not None else None,
    )


def containers_left(client: docker.DockerClient) -> Callable[[SandboxBackend], Sequence[str]]:
    """For a closed session: the containers on ``client``'s engine still labelled with its session id."""

    def left(session: SandboxBackend) -> list[str]:
        session_id = getattr(session, "session_id")  # noqa: B009 - every Docker session has one
        listed = client.containers.list(
            all=True, sparse=True, filters={"label": f"io.adk-sandbox.session={session_id}"}
        )
        return [f"container {container.id}" for container in listed]

    return left
