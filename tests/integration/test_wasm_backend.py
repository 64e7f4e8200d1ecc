"""WasmBackend on real wasmtime: WASI stdio, timeouts, exit codes, the memory cap, refused imports.

The conformance suite's checks that apply to a module (the output caps, the memory cap, ...) are in
tests/conformance/test_conformance_wasm.py.
"""

from __future__ import annotations

import base64
import importlib.util
import threading
import time
from typing import Any

import pytest

from adk_sandbox.executor import ExecRequest, InvalidRequestError, IsolationClass, Language, SandboxTool
from tests.conftest import require

pytestmark = pytest.mark.usefixtures("wasmtime_available")

FD_WRITE = (
    '(import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))'
)
EXIT_7 = "(call $proc_exit (i32.const 7))"
PROC_EXIT = '(import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))'


def _writer(fd: int, text: str, times: int = 1) -> str:
    """A module writing ``text`` to ``fd`` ``times`` times through one iovec."""
    data = text.encode().decode("latin-1").replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f"""(module
  {FD_WRITE}
  (memory (export "memory") 1)
  (data (i32.const 64) "{data}")
  (func (export "_start") (local $i i32)
    (i32.store (i32.const 0) (i32.const 64))
    (i32.store (i32.const 4) (i32.const {len(text.encode())}))
    (loop $again
      (drop (call $fd_write (i32.const {fd}) (i32.const 0) (i32.const 1) (i32.const 8)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $again (i32.lt_u (local.get $i) (i32.const {times}))))))"""


@pytest.fixture(scope="module")
def wasmtime_available() -> None:
    require(importlib.util.find_spec("wasmtime") is not None, "wasmtime is not installed (extra `wasm`)")


def _backend(**kwargs: Any) -> Any:
    from adk_sandbox.executor import WasmBackend  # noqa: PLC0415 - only once require() has seen wasmtime

    return WasmBackend(**kwargs)


def _run(code: str, **kwargs: Any) -> Any:
    request = ExecRequest.model_validate({"language": "wasm", "code": code, "timeout": 10, **kwargs})
    return _backend().execute(request)


def test_hello_via_fd_write() -> None:
    result = _run(_writer(1, "hello wasm\n"))
    assert (result.stdout, result.stderr, result.exit_code) == ("hello wasm\n", "", 0)
    assert not result.timed_out and not result.oom_killed


def test_stderr_is_its_own_stream_and_output_streams_by_line() -> None:
    lines: list[tuple[str, str]] = []
    backend = _backend()
    request = ExecRequest(language=Language.WASM, code=_writer(2, "warn\n", times=2), timeout=10)
    result = backend.execute(request, lambda stream, text: lines.append((stream, text)))
    assert (result.stdout, result.stderr) == ("", "warn\nwarn\n")
    assert lines == [("stderr", "warn\n"), ("stderr", "warn\n")]


def test_binary_module_as_base64() -> None:
    import wasmtime  # noqa: PLC0415 - only once require() has seen it

    binary = wasmtime.wat2wasm(_writer(1, "from bytes\n"))
    result = _run(base64.b64encode(binary).decode())
    assert result.stdout == "from bytes\n" and result.exit_code == 0


def test_stdin_is_the_requests() -> None:
    echo = f"""(module
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  {FD_WRITE}
  (memory (export "memory") 1)
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 64))
    (i32.store (i32.const 4) (i32.const 100))
    (drop (call $fd_read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 8)))
    (i32.store (i32.const 4) (i32.load (i32.const 8)))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))"""
    assert _run(echo, stdin="piped in").stdout == "piped in"
    assert _run(echo).stdout == ""  # no stdin: end of file at once


def test_infinite_loop_is_interrupted_at_the_timeout() -> None:
    started = time.monotonic()
    result = _run('(module (func (export "_start") (loop $l (br $l))))', timeout=1)
    assert result.timed_out and result.exit_code is None and not result.cancelled
    assert 0.9 < time.monotonic() - started < 3


def test_cancel_interrupts_the_module() -> None:
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    request = ExecRequest(
        language=Language.WASM, code='(module (func (export "_start") (loop $l (br $l))))', timeout=30
    )
    started = time.monotonic()
    result = _backend().execute(request, cancel=cancel)
    assert result.cancelled and not result.timed_out and result.exit_code is None
    assert time.monotonic() - started < 3


def test_proc_exit_code_is_the_exit_code() -> None:
    code = f'(module {PROC_EXIT} (memory (export "memory") 1) (func (export "_start") {EXIT_7}))'
    result = _run(code)
    assert result.exit_code == 7 and not result.timed_out


def test_trap_is_exit_1_with_the_message() -> None:
    result = _run('(module (func (export "_start") unreachable))')
    assert result.exit_code == 1 and "unreachable" in result.stderr and not result.oom_killed


def test_memory_grow_past_the_limit_fails_inside_the_module() -> None:
    # Asks for 32 MiB more under a 16 MiB cap: memory.grow must return -1; the module reports it with exit 3.
    code = f"""(module {PROC_EXIT} (memory (export "memory") 1)
  (func (export "_start")
    (if (i32.eq (memory.grow (i32.const 512)) (i32.const -1))
      (then (call $proc_exit (i32.const 3))))
    (call $proc_exit (i32.const 0))))"""
    assert _run(code, memory_limit_mb=16).exit_code == 3
    assert _run(code, memory_limit_mb=64).exit_code == 0  # the same growth fits a larger cap


def test_initial_memory_over_the_cap_is_oom_killed() -> None:
    result = _run('(module (memory (export "memory") 8192) (func (export "_start")))')  # 512 MiB > 256 MiB
    assert result.oom_killed and result.exit_code is None


@pytest.mark.parametrize(
    "imports",
    [
        '(import "wasi_snapshot_preview1" "path_open" (func (param i32 i32 i32 i32 i32 i64 i64 i32 i32)))',
        '(import "wasi_snapshot_preview1" "sock_accept" (func (param i32 i32 i32) (result i32)))',
        '(import "wasi_snapshot_preview1" "poll_oneoff" (func (param i32 i32 i32 i32) (result i32)))',
        '(import "env" "system" (func (param i32) (result i32)))',
    ],
)
def test_imports_beyond_wasi_stdio_are_refused_before_running(imports: str) -> None:
    code = f'(module {imports} {FD_WRITE} (memory (export "memory") 1) (func (export "_start")))'
    with pytest.raises(InvalidRequestError, match="does not provide") as refused:
        _run(code)
    assert "fd_write" not in str(refused.value).split(", which")[0]  # only the offending imports are named


def test_invalid_modules_and_languages_are_refused() -> None:
    with pytest.raises(InvalidRequestError, match="not a valid module"):
        _run("(module (func (export")
    with pytest.raises(InvalidRequestError, match="_start"):
        _run("(module)")
    with pytest.raises(InvalidRequestError, match="not supported"):
        _backend().execute(ExecRequest(language=Language.COMMAND, code="true", timeout=5))


def test_capabilities_are_honest() -> None:
    backend = _backend()
    capabilities = backend.capabilities()
    assert backend.isolation() is IsolationClass.WASM
    assert capabilities.timeout and capabilities.memory and capabilities.network
    assert capabilities.fs_read and capabilities.fs_write and capabilities.env and capabilities.pids
    assert not capabilities.cpu
    assert capabilities.languages == (Language.WASM,)
    assert not (capabilities.host_filesystem or capabilities.host_environment or capabilities.host_programs)


def test_sandbox_tool_on_wasm_reports_a_refusal_as_an_error_result() -> None:
    tool = SandboxTool(_backend())
    ok = tool.run_sync({"language": "wasm", "code": _writer(1, "hi\n")})
    assert (ok["status"], ok["stdout"], ok["isolation"]) == ("success", "hi\n", "wasm")
    refused = tool.run_sync(
        {"language": "wasm", "code": '(module (import "env" "f" (func)) (func (export "_start")))'}
    )
    assert refused["status"] == "error" and "env.f" in refused["message"]
