"""One factory, every backend: ``make_backend`` and ``adk-sandbox run --backend`` on the real engines.

Docker and bubblewrap fail in CI when missing (their marks); the microVM needs QEMU, which fails in CI
and skips locally, as tests/integration/test_microvm.py.
"""

from __future__ import annotations

import asyncio
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from adk_sandbox import make_backend
from adk_sandbox.executor import ExecRequest, IsolationClass, Language
from adk_sandbox.executor.backend import SessionBackend
from tests.conftest import require

ISOLATION = {
    "docker": IsolationClass.CONTAINER,
    "process": IsolationClass.SUBPROCESS_ONLY,
    "bwrap": IsolationClass.OS_ENFORCED,
}
MARKS: dict[str, tuple[pytest.MarkDecorator, ...]] = {
    "docker": (pytest.mark.docker,),
    "bwrap": (pytest.mark.bwrap,),
    "process": (),
}


def adk(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adk_sandbox", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize("kind", [pytest.param(kind, marks=MARKS[kind]) for kind in ISOLATION])
def test_a_mapping_makes_the_backend_it_names(kind: str, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("from the host\n")
    config: dict[str, object] = {"type": kind}
    if kind == "bwrap":  # the host directory is shown to its commands only as the policy says
        paths = [{"path": str(tmp_path), "mode": "read_only"}]
        config["policy"] = {"allow_process_spawn": True, "allowed_paths": paths}
    with make_backend(config) as backend:
        assert backend.capabilities().isolation == ISOLATION[kind]
        request = ExecRequest(language=Language.COMMAND, code="cat f", cwd=str(tmp_path), timeout=60)
        if isinstance(backend, SessionBackend):
            with backend.session(workspace=tmp_path) as session:
                result = session.execute(request)
        else:
            result = backend.execute(request)
    assert (result.exit_code, result.stdout) == (0, "from the host\n"), result.stderr


@pytest.mark.parametrize("kind", [pytest.param(kind, marks=MARKS[kind]) for kind in ISOLATION])
def test_run_with_backend_runs_there_in_the_workspace(kind: str, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("hi\n")
    done = adk("run", "--backend", kind, "--workspace", str(tmp_path), "--", "sh", "-c", "cat f; pwd; exit 3")
    assert (done.stdout, done.returncode) == (f"hi\n{tmp_path}\n", 3), done.stderr


def test_run_refuses_a_docker_flag_on_another_backend() -> None:
    done = adk("run", "--backend", "process", "--runtime", "runsc", "--", "true")
    assert done.returncode == 2
    assert (
        done.stderr == "adk-sandbox: error: process backend config: runtime: Extra inputs are not permitted\n"
    )


@pytest.mark.slow
def test_run_on_a_microvm_answers_with_the_guests_kernel(tmp_path: Path) -> None:
    require(shutil.which("qemu-system-x86_64") is not None, "QEMU is not installed (scripts/setup)")
    config = tmp_path / "vm.json"
    config.write_text('{"type": "microvm", "boot_timeout_seconds": 120}')
    done = adk("run", "--backend-config", str(config), "--", "uname", "-r")
    if (
        done.returncode != 0 and "BackendUnavailable" in done.stderr
    ):  # pragma: no cover - a machine without VMs
        require(False, done.stderr)
    assert done.returncode == 0, done.stderr
    guest = done.stdout.strip()
    assert guest and guest != platform.release()  # the VM's own kernel, not the host's


def test_the_adk_code_executor_takes_a_config() -> None:
    adk_adapter = pytest.importorskip("adk_sandbox.devtools.adapters.adk")
    from google.adk.code_executors.code_execution_utils import CodeExecutionInput  # noqa: PLC0415

    with adk_adapter.SandboxCodeExecutor({"type": "process"}) as executor:
        made = executor._made
        result = executor.execute_code(None, CodeExecutionInput(code="print(6 * 7)"))
    assert (result.stdout, result.stderr) == ("42\n", "")
    assert made is not None and made.name == "process"


@pytest.mark.slow
def test_the_mcp_tools_run_bash_in_a_microvm() -> None:
    require(shutil.which("qemu-system-x86_64") is not None, "QEMU is not installed (scripts/setup)")
    mcp = pytest.importorskip("adk_sandbox.devtools.adapters.mcp")
    from adk_sandbox.executor.backends.microvm import MicroVMConfig  # noqa: PLC0415

    # The VM's share reaches the workspace as its owner only: a directory of 1000's it can reach
    # (pytest's tmp_path is below a 0700 directory of root's).
    workspace = Path(tempfile.mkdtemp(prefix="adk-sandbox-mcp-vm-"))
    try:
        os.chown(workspace, 1000, 1000)
        with mcp.workspace_tools(workspace, config=MicroVMConfig(boot_timeout_seconds=120)) as tools:
            bash = next(tool for tool in tools if tool.name == "bash")
            result = asyncio.run(bash.run({"command": "uname -r; echo made > new.txt"}))
        assert (result["exit_code"], result["isolation"]) == (0, "microvm"), result
        assert result["stdout"].strip() != platform.release()
        assert (workspace / "new.txt").read_text() == "made\n"
    finally:
        shutil.rmtree(workspace)
