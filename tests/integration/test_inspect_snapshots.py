"""Snapshots inside an inspect eval: a solver snapshots its sample, forks it, and rolls it back (issue 24).

A real ``inspect_ai.eval`` on the provider's defaults (task profile, runc): the solver reaches the provider
through ``sandbox().as_type(AdkSandboxEnvironment)``, as an inspect user would, and records what each
sandbox saw in the sample's store. State lives in the root filesystem (``/opt``, the task profile's
writable root) and in ``/tmp`` (a tmpfs): both must travel.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from adk_sandbox.executor.snapshots import SnapshotStore
from tests.conftest import IN_CI, require
from tests.integration.provider_containers import provider_containers

try:
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import Sample
    from inspect_ai.model import get_model
    from inspect_ai.solver import Generate, TaskState, solver
    from inspect_ai.util import SandboxEnvironmentSpec, sandbox

    from adk_sandbox.devtools.adapters.inspect_sandbox import (
        PROVIDER_LABEL,
        AdkSandboxConfig,
        AdkSandboxEnvironment,
    )

    INSPECT_MISSING = None
except ImportError as exc:  # pragma: no cover - the inspect extra is not installed
    if IN_CI:
        raise
    INSPECT_MISSING = str(exc)

pytestmark = pytest.mark.docker

#: Where the state lives: Docker's task profile has a writable root (``/opt``); a microVM's root is
#: read-only, and its HOME a tmpfs like ``/tmp`` (kept in its memory, which its snapshot carries).
PLACES = {"docker": ("/opt/state", "/tmp/state"), "microvm": ("/home/sandbox/state", "/tmp/state")}


@solver
def branch_and_roll_back(places: tuple[str, str]) -> Any:
    def _write(value: str) -> list[str]:
        return ["sh", "-c", " && ".join(f"echo {value} > {place}" for place in places)]

    async def _read(env: Any) -> str:
        result = await env.exec(["cat", *places])
        return " ".join(result.stdout.split()) if result.success else f"FAILED {result.stderr}"

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        env = sandbox().as_type(AdkSandboxEnvironment)
        seen = state.store
        await env.exec(_write("one"))
        snap = await env.snapshot("before-attempt")
        seen.set("snapshot", snap.id)
        await env.exec(_write("two"))
        async with env.fork() as other:
            seen.set("fork starts with", await _read(other))
            await other.exec(_write("fork"))
            seen.set("fork after its write", await _read(other))
            seen.set("sample while the fork wrote", await _read(env))
        await env.restore(snap)
        # inspect's own handle, not the object the solver holds: the sample itself was rolled back.
        seen.set("sample after restore", await _read(sandbox()))
        await env.exec(_write("three"))
        await env.restore(snap)
        seen.set("after a second restore", await _read(env))
        return state

    return solve


@pytest.mark.parametrize("backend", ["docker", pytest.param("microvm", marks=pytest.mark.slow)])
def test_a_solver_snapshots_forks_and_restores_its_sample(backend: str, tmp_path: Path) -> None:
    """The same solver on Docker (files) and on a microVM (the whole VM, its processes with it)."""
    require(INSPECT_MISSING is None, f"inspect_ai is not installed: {INSPECT_MISSING}")
    if backend == "microvm":
        require(shutil.which("qemu-system-x86_64") is not None, "QEMU is not installed (scripts/setup)")
    before = provider_containers(PROVIDER_LABEL)
    config = AdkSandboxConfig() if backend == "docker" else AdkSandboxConfig(backend="microvm")
    task = Task(
        dataset=[Sample(input="branch", target="")],
        solver=branch_and_roll_back(PLACES[backend]),
        sandbox=SandboxEnvironmentSpec("adk-sandbox", config),
    )
    [log] = inspect_eval(task, model=get_model("mockllm/model"), log_dir=str(tmp_path), display="none")
    assert log.status == "success", log.error
    assert log.samples is not None
    [sample] = log.samples
    assert sample.error is None, sample.error
    seen = sample.store
    assert seen["fork starts with"] == "two two"
    assert seen["fork after its write"] == "fork fork"
    assert seen["sample while the fork wrote"] == "two two"
    assert seen["sample after restore"] == "one one"
    assert seen["after a second restore"] == "one one"
    # Nothing is left: no container of the sample, its fork or its restores, and no snapshot.
    assert provider_containers(PROVIDER_LABEL) - before == set()
    assert seen["snapshot"] not in {each.id for each in SnapshotStore().list()}
