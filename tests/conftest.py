"""Shared test fixtures.

Tests that need a real enforcer or engine (bubblewrap, Docker, gVisor, wasmtime) call :func:`require`:
outside CI a missing dependency skips with the reason; with ``CI`` set it fails, so a CI run can never go
green by skipping what it was meant to test.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from adk_sandbox.executor import (
    BackendUnavailableError,
    BubblewrapEnforcer,
    EnforcerUnavailableError,
    get_enforcer,
)
from adk_sandbox.executor.backends.docker import BASE_IMAGE, DockerBackend
from adk_sandbox.executor.testing.conformance import live_host_processes

IN_CI = bool(os.environ.get("CI"))
REPOSITORY = Path(__file__).resolve().parents[1]

#: The fixture of a current Docker engine beside the system's (``modern_engine``): one for the whole run,
#: whichever module asks for it.
pytest_plugins = ["tests.integration.modern_engine"]


@pytest.fixture(scope="session", autouse=True)
def _one_copy_of_each_module() -> Iterator[None]:
    """Fails the run if anything imported the repository's folders as top-level ``executor``/``devtools``.

    pytest puts the repository root on ``sys.path`` (``tests`` is a package), so a stray ``import executor``
    would load a second copy of every module beside ``adk_sandbox.executor``: two ``ExecutorError`` classes,
    two caches, and an install that only works from a checkout.
    """
    yield
    strays = sorted(
        name
        for name, module in list(sys.modules.items())
        if name.split(".")[0] in ("executor", "devtools")
        and str(getattr(module, "__file__", "") or "").startswith(str(REPOSITORY))
    )
    assert not strays, f"modules imported outside the adk_sandbox root: {strays[:10]}"


def require(available: bool, reason: str) -> None:
    """Skip (locally) or fail (in CI) when a real dependency of the test is missing."""
    if available:
        return
    if IN_CI:
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def bwrap_enforcer() -> BubblewrapEnforcer:
    """The real bubblewrap enforcer, probed once per test session."""
    try:
        return get_enforcer()
    except EnforcerUnavailableError as exc:
        require(False, f"bubblewrap is not usable here: {exc}")
        raise  # unreachable: require() skipped or failed


def unique_sleep_seconds() -> str:
    """A sleep duration no other process on the machine uses: it marks a test's processes in /proc."""
    return f"{300 + random.randint(1, 10**6) / 10**7:.7f}"


def live_processes_with_args(*args: str) -> list[int]:
    """Pids of live (non-zombie) processes whose argv contains ``args`` in order, consecutively."""
    return live_processes_whose_cmdline_has("\0".join(args).encode() + b"\0")


def live_processes_whose_cmdline_has(needle: bytes) -> list[int]:
    """Pids of live (non-zombie) processes whose NUL-separated ``/proc/PID/cmdline`` contains ``needle``."""
    return list(live_host_processes(needle))


def wait_until_gone(*args: str, timeout: float = 5.0) -> list[int]:
    """Wait (bounded) for processes matching ``args`` to disappear; return any still alive."""
    deadline = time.monotonic() + timeout
    while True:
        alive = live_processes_with_args(*args)
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def kill_all(pids: list[int]) -> None:
    """Clean up after a failed containment test so one failure does not leak into the next."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def docker_backend() -> Iterator[DockerBackend]:
    """A DockerBackend on the real local engine with the base image (fails in CI when missing)."""
    try:
        backend = DockerBackend()
    except BackendUnavailableError as exc:
        require(False, f"the Docker engine is not usable here: {exc}")
        raise  # unreachable
    images = {tag for image in backend._client.images.list() for tag in image.tags}
    require(BASE_IMAGE in images, f"{BASE_IMAGE} is missing: run `adk-sandbox images build`")
    yield backend
    backend.close()


@pytest.fixture
def owned_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace directory owned by uid:gid 1000:1000, as a developer's checkout would be."""
    root = tmp_path_factory.mktemp("ws")
    os.chown(root, 1000, 1000)
    return root


@pytest.fixture(params=["uid1000", "root"])
def workspace_of_either_owner(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A workspace owned by uid 1000 (a developer's checkout) or by root: commands run as its owner, so
    tests of who-can-do-what run both ways. Modules import it as their ``workspace`` fixture."""
    root = tmp_path_factory.mktemp(f"ws-{request.param}")
    owner = 1000 if request.param == "uid1000" else 0
    os.chown(root, owner, owner)
    return root


def project_containers(client: docker.DockerClient, owner_pid: int | None = None) -> list[str]:
    """Ids of every container (running or not) carrying this project's label (and this owner's, if given).

    Filtering by owner keeps a check about this process's containers true while other processes (another
    test run, a developer's session) create and remove their own. ``sparse``: the list call's own data,
    no inspect per container (which would fail on one removed meanwhile).
    """
    label = "io.adk-sandbox.project" if owner_pid is None else f"io.adk-sandbox.owner-pid={owner_pid}"
    return [str(c.id) for c in client.containers.list(all=True, sparse=True, filters={"label": label})]


def containers_mounting(client: docker.DockerClient, path: Path) -> list[str]:
    """Ids of this project's containers that mount ``path`` (a test's own workspace).

    A leak check about one test's workspace stays true while other processes on the machine create and
    remove containers of their own (another test run, a CLI subprocess's reaper).
    """
    return [
        str(c.id)
        for c in client.containers.list(all=True, sparse=True, filters={"label": "io.adk-sandbox.project"})
        if any(m.get("Source") == str(path) for m in c.attrs.get("Mounts") or [])
    ]
