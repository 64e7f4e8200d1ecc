"""The Rust pipeline and CodeTool on the host: deps lookup, work dirs, policies, async cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import time
from pathlib import Path

import pytest

from adk_sandbox.executor import (
    BubblewrapEnforcer,
    CodeTool,
    InvalidRequestError,
    ProcessBackend,
    SandboxPolicy,
    SandboxTool,
)
from adk_sandbox.executor.rust import RustExecutor, RustExecutorConfig, host_rust
from tests.conftest import require, unique_sleep_seconds, wait_until_gone


@pytest.fixture
def ready_host_rust() -> None:
    host = host_rust()
    require(host is not None, "rustc (and cc) are not installed on the host")
    assert host is not None
    require(host.deps_available, f"serde_json for rustc is missing, run scripts/build-rust-deps: {host}")


def test_missing_serde_json_says_how_to_build_it(tmp_path: Path) -> None:
    require(host_rust() is not None, "rustc is not installed on the host")
    empty = tmp_path / "no-deps"
    empty.mkdir()
    with RustExecutor(ProcessBackend(), RustExecutorConfig(deps_dir=str(empty))) as executor:
        result = executor.run("fn run(i: Value) -> Value { i }", None, timeout=30)
    assert result.status == "error" and result.message is not None
    assert "scripts/build-rust-deps" in result.message and str(empty) in result.message


def test_deps_cache_is_keyed_by_the_rustc_in_use() -> None:
    host = host_rust()
    require(host is not None, "rustc is not installed on the host")
    assert host is not None
    assert host.deps_dir.endswith(os.path.join("adk-sandbox", "rust-deps", host.version))
    assert host.rustc.startswith(host.sysroot)  # the real compiler, not rustup's proxy


@pytest.mark.usefixtures("ready_host_rust")
def test_an_owned_work_dir_is_removed_even_without_close() -> None:
    executor = RustExecutor(ProcessBackend())
    work = Path(executor.work_dir)
    assert work.is_dir()
    del executor
    gc.collect()
    assert not work.exists()


@pytest.mark.usefixtures("ready_host_rust")
def test_an_owned_work_dir_is_removed_on_close() -> None:
    executor = RustExecutor(ProcessBackend())
    work = Path(executor.work_dir)
    assert executor.run("fn run(i: Value) -> Value { i }", 5, timeout=60).output == 5
    assert work.is_dir() and [p.name for p in work.iterdir() if p.name.startswith("run-")] == []
    executor.close()
    assert not work.exists()
    closed = executor.run("fn run(i: Value) -> Value { i }", 5, timeout=60)
    assert (closed.status, closed.message) == ("error", "the Rust executor is closed")
    assert not work.exists()


@pytest.mark.usefixtures("ready_host_rust")
def test_a_given_work_dir_is_kept(tmp_path: Path) -> None:
    with RustExecutor(ProcessBackend(), RustExecutorConfig(work_dir=str(tmp_path), incremental=True)) as ex:
        assert ex.run("fn run(i: Value) -> Value { i }", [1], timeout=60).output == [1]
    assert (tmp_path / "incr").is_dir()  # incremental cache kept for the next executor


@pytest.mark.usefixtures("ready_host_rust")
def test_policy_without_the_work_dir_is_refused_up_front(
    bwrap_enforcer: BubblewrapEnforcer, tmp_path: Path
) -> None:
    host = host_rust()
    assert host is not None
    builder = SandboxPolicy.builder().allow_process_spawn()
    for path in host.read_only_paths:
        builder.allow_read(path)
    backend = ProcessBackend.with_sandbox(bwrap_enforcer, builder.build())
    with pytest.raises(InvalidRequestError, match="allow_read_write"):
        RustExecutor(backend, RustExecutorConfig(work_dir=str(tmp_path / "work")))
    denied_toolchain = SandboxPolicy.builder().allow_process_spawn().allow_read_write(tmp_path).build()
    with pytest.raises(InvalidRequestError, match="allow_read"):
        RustExecutor(
            ProcessBackend.with_sandbox(bwrap_enforcer, denied_toolchain),
            RustExecutorConfig(work_dir=str(tmp_path)),
        )


def test_input_that_is_not_json_is_an_error_result() -> None:
    with RustExecutor(ProcessBackend()) as executor:
        result = executor.run("fn run(i: Value) -> Value { i }", {1, 2}, timeout=30)
    assert result.status == "error" and result.message is not None and "not JSON" in result.message


@pytest.mark.usefixtures("ready_host_rust")
def test_code_exec_end_to_end_shape() -> None:
    tool = CodeTool(ProcessBackend())
    try:
        result = asyncio.run(
            tool.run({"code": 'fn run(i: Value) -> Value { println!("hi"); i }', "input": {"k": [1]}})
        )
    finally:
        tool.close()
    assert set(result) == {
        "status",
        "stdout",
        "stderr",
        "exit_code",
        "duration_ms",
        "output",
        "diagnostics",
        "truncated",
    }
    assert (result["status"], result["output"], result["stdout"], result["exit_code"]) == (
        "success",
        {"k": [1]},
        "hi\n",
        0,
    )
    with contextlib.closing(CodeTool(ProcessBackend())) as looping:
        timeout = looping.run_sync({"code": "fn run(_i: Value) -> Value { loop {} }", "timeout_secs": -5})
    assert (timeout["status"], timeout["stage"]) == ("timeout", "run")  # -5 was clamped to 1 second


def test_cancelling_the_awaiting_task_kills_the_command() -> None:
    marker = unique_sleep_seconds()
    tool = SandboxTool(ProcessBackend())

    async def cancel_soon() -> None:
        task = asyncio.create_task(
            tool.run({"language": "command", "code": f"sleep {marker}", "timeout_secs": 300})
        )
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    started = time.monotonic()
    asyncio.run(cancel_soon())
    assert wait_until_gone("sleep", marker) == []
    assert time.monotonic() - started < 10
