"""A failing ``on_output`` callback behaves the same on every backend (issue 10, item 4).

The execution is killed (a WASM module interrupted) and the callback's exception reaches the caller.
The Docker case, with the tree inside the container checked, is in ``test_docker_tree_kill.py``.
"""

from __future__ import annotations

import importlib.util
import time

import pytest

from adk_sandbox.executor import ExecRequest, Language, ProcessBackend
from tests.conftest import kill_all, live_processes_with_args, require, unique_sleep_seconds, wait_until_gone

#: Generous "does not hang" bound: the commands below would run for a minute if not stopped.
QUICK = 20.0


class CallbackBroke(Exception):
    pass


def fail(stream: str, chunk: str) -> None:
    raise CallbackBroke(chunk)


def test_process_backend_kills_the_command_and_raises() -> None:
    mark = unique_sleep_seconds()
    request = ExecRequest(
        language=Language.COMMAND, code=f"echo first; sleep {mark} & sleep {mark}", timeout=60
    )
    started = time.monotonic()
    try:
        with pytest.raises(CallbackBroke):
            ProcessBackend().execute(request, on_output=fail)
        assert time.monotonic() - started < QUICK
        assert wait_until_gone("sleep", mark) == []
    finally:
        kill_all(live_processes_with_args("sleep", mark))


def test_wasm_backend_interrupts_the_module_and_raises() -> None:
    require(importlib.util.find_spec("wasmtime") is not None, "wasmtime is not installed (extra `wasm`)")
    from adk_sandbox.executor import WasmBackend  # noqa: PLC0415 - only once require() has seen wasmtime

    forever = """(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 64) "first\\n")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 64))
    (i32.store (i32.const 4) (i32.const 6))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
    (loop $l (br $l))))"""
    request = ExecRequest(language=Language.WASM, code=forever, timeout=60)
    started = time.monotonic()
    with pytest.raises(CallbackBroke, match="first"):
        WasmBackend().execute(request, on_output=fail)
    assert time.monotonic() - started < QUICK
