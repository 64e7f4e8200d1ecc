"""What the Docker benchmarks share: a workspace like a developer's, the requests, and the leak count."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import docker

from adk_sandbox.executor import ExecRequest, Language, ResourceLimits
from adk_sandbox.executor._owner import OWNER_PID
from adk_sandbox.executor.backends.docker import BASE_IMAGE
from adk_sandbox.executor.backends.docker._spec import ContainerSpec, host_config_arguments

FLOOD_BYTES = 200_000_000
TRUE = ExecRequest(language=Language.COMMAND, code="true", timeout=60)
FLOOD = ExecRequest(
    language=Language.COMMAND, code=f"head -c {FLOOD_BYTES} /dev/zero", timeout=300, max_output_bytes=4096
)


def owned_workspace(prefix: str = "adk-bench-") -> str:
    """A fresh directory owned by uid:gid 1000:1000, as a checkout would be (commands run as its owner)."""
    root = tempfile.mkdtemp(prefix=prefix)
    if os.geteuid() == 0:
        os.chown(root, 1000, 1000)
    return root


def containers_of_this_process(client: docker.DockerClient) -> list[str]:
    """Ids of this project's containers (running or not) owned by this process (tests/conftest.py's check).

    Filtering by owner keeps the count true while other processes create and remove their own.
    """
    label = f"{OWNER_PID}={os.getpid()}"
    return [str(c.id) for c in client.containers.list(all=True, filters={"label": label})]


def runtime_name(runtime: str | None) -> str:
    """How a table names the runtime."""
    return "gVisor (runsc)" if runtime == "runsc" else "runc"


def raw_host_config(client: docker.DockerClient, runtime: str | None, workspace: str) -> Any:
    """The raw anchors' host config: the library's own hardening of a session container, for docker-py."""
    spec = ContainerSpec(image=BASE_IMAGE, limits=ResourceLimits(), runtime=runtime, workspace=workspace)
    return client.api.create_host_config(**host_config_arguments(spec))


def create_raw_container(client: docker.DockerClient, host_config: Any, workspace: str) -> str:
    """A raw docker-py create of the base image idling in ``sleep`` with that host config: its id."""
    created = client.api.create_container(
        BASE_IMAGE, entrypoint=["sleep"], command=["600"], host_config=host_config, working_dir=workspace
    )
    return str(created["Id"])
