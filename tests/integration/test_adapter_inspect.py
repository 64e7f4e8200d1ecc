"""The inspect_ai provider (devtools.adapters.inspect_sandbox) driven by inspect's own machinery.

* inspect's conformance suite (``inspect_ai.util._sandbox.self_check``, 44 checks) against the provider,
  under runc and gVisor, with the known failures listed per runtime (inspect's own style) as strict
  xfails: a check that starts passing fails the run until it is taken off the list.
* a real ``inspect_ai.eval`` with ``mockllm/model`` and scripted tool calls of ``bash()``, ``python()``,
  ``text_editor()`` and ``bash_session()`` in the sandbox, scored.

In CI a missing inspect_ai fails these tests (it is a dependency of the ``inspect`` extra), never skips.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import docker
import pytest

from tests.conftest import IN_CI, require

try:
    from inspect_ai.util import SandboxEnvironment
    from inspect_ai.util._sandbox.self_check import *  # noqa: F403 - inspect's checks, collected here

    from devtools.adapters.inspect_sandbox import PROVIDER_LABEL, AdkSandboxConfig, AdkSandboxEnvironment

    INSPECT_MISSING = None
except ImportError as exc:  # pragma: no cover - the inspect extra is not installed
    if IN_CI:
        raise
    INSPECT_MISSING = str(exc)

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

TASK = "test_adapter_inspect"

#: Checks this provider fails, per runtime, and why (strict xfails: each must really fail).
KNOWN_FAILURES: dict[str, dict[str, str]] = {
    runtime: {
        "test_exec_as_user": (
            "adds a user with adduser as root: the base image has no adduser, and the sandbox's root "
            "filesystem is read-only with every capability dropped (SPEC §4), so /etc/passwd cannot "
            "change; running as any existing user (user='root', a uid, a name) works"
        ),
    }
    for runtime in ("runc", "runsc")
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _runtime_available(runtime: str) -> None:
    try:
        client = docker.from_env()
        runtimes = client.info().get("Runtimes") or {}
        client.close()
    except docker.errors.DockerException as exc:
        require(False, f"the Docker engine is not usable here: {exc}")
        return
    require(runtime in runtimes, f"the Docker engine has no {runtime} runtime")


@pytest.fixture(scope="module", params=["runc", "runsc"])
def module_sandbox(request: pytest.FixtureRequest) -> Iterator[tuple[str, SandboxEnvironment]]:
    """One sample's sandbox per runtime, made and removed by the provider's own lifecycle calls."""
    require(INSPECT_MISSING is None, f"inspect_ai is not installed: {INSPECT_MISSING}")
    runtime = request.param
    _runtime_available(runtime)
    config = AdkSandboxConfig(runtime=runtime)
    asyncio.run(AdkSandboxEnvironment.task_init(TASK, config))
    environments = asyncio.run(AdkSandboxEnvironment.sample_init(TASK, config, {}))
    try:
        yield runtime, environments["default"]
    finally:
        asyncio.run(AdkSandboxEnvironment.sample_cleanup(TASK, config, environments, False))
        asyncio.run(AdkSandboxEnvironment.task_cleanup(TASK, config, True))


@pytest.fixture
def sandbox_env(
    request: pytest.FixtureRequest, module_sandbox: tuple[str, SandboxEnvironment]
) -> SandboxEnvironment:
    """What inspect's checks take: the module's sandbox, with this runtime's known failures marked."""
    runtime, environment = module_sandbox
    reason = KNOWN_FAILURES[runtime].get(request.node.originalname)
    if reason is not None:
        request.node.add_marker(pytest.mark.xfail(reason=reason, strict=True))
    return environment


def provider_containers() -> list[str]:
    client = docker.from_env()
    try:
        label = f"{PROVIDER_LABEL}=adk-sandbox"
        return [c.id for c in client.containers.list(all=True, sparse=True, filters={"label": label})]
    finally:
        client.close()
