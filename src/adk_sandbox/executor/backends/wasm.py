"""WasmBackend: WASI preview-1 modules in wasmtime, with standard streams and nothing else.

:class:`WasmBackend` refuses a module importing anything outside :data:`ALLOWED_WASI_IMPORTS` before it
runs, times out by epoch interruption and caps linear memory (:data:`DEFAULT_WASM_MEMORY_MB`). Needs the
``wasm`` extra. See docs/RUST_AND_WASM.md, section "WasmBackend".
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Literal

from adk_sandbox.executor._output import OutputCapture
from adk_sandbox.executor.backend import OutputCallback, SandboxBackend
from adk_sandbox.executor.errors import (
    BackendUnavailableError,
    InvalidRequestError,
    PolicyNotEnforceableError,
)
from adk_sandbox.executor.types import Capabilities, ExecRequest, ExecResult, IsolationClass, Language, Stream

try:
    import wasmtime
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise BackendUnavailableError("the WASM backend needs wasmtime: pip install 'adk-sandbox[wasm]'") from exc

__all__ = ["ALLOWED_WASI_IMPORTS", "DEFAULT_WASM_MEMORY_MB", "WASI_MODULE", "WasmBackend"]

DEFAULT_WASM_MEMORY_MB = 256
"""Linear-memory cap per execution when neither the backend nor the request sets one."""

WASI_MODULE = "wasi_snapshot_preview1"
"""The only import module a program may use."""

ALLOWED_WASI_IMPORTS: frozenset[str] = frozenset(
    {
        # the standard streams
        "fd_read",
        "fd_write",
        "fd_close",
        "fd_seek",
        "fd_tell",
        "fd_sync",
        "fd_datasync",
        "fd_fdstat_get",
        "fd_fdstat_set_flags",
        "fd_filestat_get",
        # what a libc's startup asks; with nothing configured the answers are empty
        "fd_prestat_get",
        "fd_prestat_dir_name",
        "args_get",
        "args_sizes_get",
        "environ_get",
        "environ_sizes_get",
        # process and time: no host resources behind them
        "proc_exit",
        "clock_time_get",
        "clock_res_get",
        "random_get",
        "sched_yield",
    }
)
"""WASI functions a module may import. Filesystem paths (``path_*``), sockets (``sock_*``) and
``poll_oneoff`` (a host-side sleep that epoch interruption cannot cut short) are refused."""

_PAGE = 64 * 1024
_EPOCH_TICK = 0.01
_TRAP_EXIT_CODE = 1


class WasmBackend(SandboxBackend):
    """Runs WASI preview-1 modules (WAT text, or wasm bytes as base64) in wasmtime: ``WASM`` isolation.

    ``memory_limit_mb`` caps each module's linear memory (a request's own ``memory_limit_mb`` overrides
    it). ``execute`` runs in the calling thread; executions share nothing, so calls may be concurrent.
    """

    name = "wasm"

    def __init__(self, *, memory_limit_mb: int = DEFAULT_WASM_MEMORY_MB) -> None:
        if memory_limit_mb <= 0:
            raise ValueError("memory_limit_mb must be positive")
        self._memory_limit_mb = memory_limit_mb

    def capabilities(self) -> Capabilities:
        """Everything but a CPU share is enforced: a module has no syscalls beyond the allowed WASI ones."""
        return Capabilities(
            isolation=IsolationClass.WASM,
            timeout=True,
            memory=True,
            cpu=False,  # one thread, but no share or quota of it is enforced beyond the timeout
            pids=True,  # WASI preview 1 cannot create processes at all
            network=True,
            fs_read=True,
            fs_write=True,
            env=True,
            languages=(Language.WASM,),
            host_filesystem=False,  # no preopened directories: no filesystem at all
            host_environment=False,  # no environment at all
            host_programs=False,  # a module calls WASI functions, never a program
        )

    def execute(
        self,
        request: ExecRequest,
        on_output: OutputCallback | None = None,
        *,
        cancel: threading.Event | None = None,
    ) -> ExecResult:
        """Compile, check the imports of, and run ``request.code``'s ``_start`` export."""
        started = time.monotonic()
        _check_wasm_request(request)
        if request.language is not Language.WASM or request.code is None:
            language = request.language.value if request.language is not None else None
            raise InvalidRequestError(
                f"language {language!r} is not supported by backend 'wasm'; supported: wasm"
            )
        if request.env:
            raise InvalidRequestError("the WASM backend gives modules no environment; env must be empty")
        memory_mb = request.memory_limit_mb if request.memory_limit_mb is not None else self._memory_limit_mb

        config = wasmtime.Config()
        config.epoch_interruption = True
        engine = wasmtime.Engine(config)
        module = _compile(engine, request.code)
        _check_imports(module)

        capture = OutputCapture(request.output_cap, on_output, keep_tail=request.truncate == "head_tail")
        with _stdin_file(request.stdin_bytes) as stdin_path:
            wasi = wasmtime.WasiConfig()
            wasi.stdin_file = stdin_path
            failures: list[BaseException] = []
            wasi.stdout_custom = _feeder(capture, "stdout", engine, failures)
            wasi.stderr_custom = _feeder(capture, "stderr", engine, failures)
            store = wasmtime.Store(engine)
            store.set_wasi(wasi)
            store.set_limits(memory_size=memory_mb * 1024 * 1024)
            store.set_epoch_deadline(1)
            linker = wasmtime.Linker(engine)
            linker.define_wasi()
            with _Interrupter(engine, started + request.timeout, cancel) as interrupter:
                outcome = _run(store, linker, module, capture, memory_mb)
        if failures:
            # The on_output callback failed: the module was interrupted, the callback's error propagates.
            raise failures[0]

        streams = capture.finish()
        interrupted = outcome == "interrupted"
        if isinstance(outcome, int):
            exit_code: int | None = outcome
        else:
            # Stopped from outside (timeout, cancel, memory cap) has no exit status, like a killed process.
            exit_code = _TRAP_EXIT_CODE if outcome == "trapped" else None
        return ExecResult(
            stdout=streams["stdout"].text,
            stderr=streams["stderr"].text,
            exit_code=exit_code,
            timed_out=interrupted and not interrupter.cancelled,
            cancelled=interrupted and interrupter.cancelled,
            oom_killed=outcome == "memory_exhausted",
            stdout_truncated=streams["stdout"].truncated,
            stderr_truncated=streams["stderr"].truncated,
            duration_ms=int((time.monotonic() - started) * 1000),
        )


_Outcome = int | Literal["interrupted", "trapped", "memory_exhausted"]


def _check_wasm_request(request: ExecRequest) -> None:
    """Refuse what a module cannot have: a program to start, a directory to be in, a user to be."""
    if request.argv is not None:
        raise InvalidRequestError(
            "backend 'wasm' runs a WASI module given as code (language 'wasm'), not a program from argv; "
            "give language='wasm' and the module as code, or use a host or Docker backend for argv"
        )
    if request.cwd is not None:
        raise InvalidRequestError(
            "backend 'wasm' gives modules no filesystem, so there is no working directory; omit cwd"
        )
    if request.background:
        raise InvalidRequestError(
            "backend 'wasm' runs one module inside this process, which cannot start processes to keep in "
            "the background; omit background, or use a DockerBackend session for a background server"
        )
    if request.user is not None:
        raise PolicyNotEnforceableError(
            "backend 'wasm' runs modules inside this process and has no users to switch to; omit user, "
            "or use a DockerBackend session to run a program as a given uid:gid"
        )


def _run(
    store: wasmtime.Store,
    linker: wasmtime.Linker,
    module: wasmtime.Module,
    capture: OutputCapture,
    memory_mb: int,
) -> _Outcome:
    """Instantiate and call ``_start``; the exit code, or how it ended abnormally."""
    try:
        instance = linker.instantiate(store, module)
    except wasmtime.WasmtimeError as error:
        if "memory" in str(error).lower() and "limit" in str(error).lower():
            # The module's initial memory is already over the cap.
            capture.feed("stderr", f"wasm: {error}\n".encode())
            return "memory_exhausted"
        raise InvalidRequestError(f"the module cannot be instantiated: {error}") from error
    start = instance.exports(store).get("_start")
    if not isinstance(start, wasmtime.Func):
        raise InvalidRequestError("the module exports no `_start` function (a WASI command is expected)")
    try:
        start(store)
    except wasmtime.ExitTrap as exit_trap:
        return exit_trap.code
    except wasmtime.Trap as trap:
        if trap.trap_code is wasmtime.TrapCode.INTERRUPT:
            return "interrupted"
        capture.feed("stderr", f"wasm trap: {trap.message}\n".encode())
        return "memory_exhausted" if _memory_at_limit(store, instance, memory_mb) else "trapped"
    except wasmtime.WasmtimeError as error:
        # A host function failed (e.g. WASI called by a module without the memory it needs): the module
        # stops there, like a trap.
        capture.feed("stderr", f"wasm error: {error}\n".encode())
        return "trapped"
    return 0


def _memory_at_limit(store: wasmtime.Store, instance: wasmtime.Instance, memory_mb: int) -> bool:
    # wasmtime-py has no limiter callback telling that a grow was refused, so only the unambiguous case is
    # reported: a trap while a memory cannot grow by a single page is attributed to the cap.
    limit = memory_mb * 1024 * 1024
    for _, export in instance.exports(store).items():
        if isinstance(export, wasmtime.Memory) and export.data_len(store) + _PAGE > limit:
            return True
    return False


def _compile(engine: wasmtime.Engine, code: str) -> wasmtime.Module:
    """WAT text, or base64 of wasm bytes (recognised by the wasm magic number once decoded)."""
    binary: bytes | None = None
    stripped = "".join(code.split())
    if stripped and not stripped.startswith("("):
        with contextlib.suppress(binascii.Error, ValueError):
            decoded = base64.b64decode(stripped, validate=True)
            if decoded.startswith(b"\0asm"):
                binary = decoded
    try:
        return wasmtime.Module(engine, binary if binary is not None else code)
    except wasmtime.WasmtimeError as error:
        kind = "wasm bytes" if binary is not None else "WAT text (or base64 of wasm bytes)"
        raise InvalidRequestError(f"the code is not a valid module as {kind}: {error}") from error


def _check_imports(module: wasmtime.Module) -> None:
    refused = [
        f"{item.module}.{item.name}"
        for item in module.imports
        if item.module != WASI_MODULE or item.name not in ALLOWED_WASI_IMPORTS
    ]
    if refused:
        raise InvalidRequestError(
            f"the module imports {', '.join(refused)}, which the WASM backend does not provide: only "
            f"WASI preview 1 standard streams, clocks, random and proc_exit ({WASI_MODULE}."
            f"{{{', '.join(sorted(ALLOWED_WASI_IMPORTS))}}}) are available"
        )


def _feeder(
    capture: OutputCapture, stream: Stream, engine: wasmtime.Engine, failures: list[BaseException]
) -> Callable[[bytes], None]:
    def feed(data: bytes) -> None:
        # Runs inside the module's fd_write; an exception here would be printed by wasmtime-py and
        # turned into EIO, so a failing on_output callback is kept off the module's path: it is recorded,
        # the module is interrupted at its next epoch check, and execute() raises it.
        if failures:
            return
        try:
            capture.feed(stream, data)
        except BaseException as exc:  # KeyboardInterrupt too: the caller gets it once the module stopped
            failures.append(exc)
            engine.increment_epoch()

    return feed


@contextlib.contextmanager
def _stdin_file(stdin: bytes | None) -> Iterator[str]:
    if stdin is None:
        yield os.devnull
        return
    with tempfile.NamedTemporaryFile(prefix="adk-wasm-stdin-", delete=True) as handle:
        handle.write(stdin)
        handle.flush()
        yield handle.name


class _Interrupter:
    """A timer thread that bumps the engine's epoch at the deadline or on cancellation."""

    def __init__(self, engine: wasmtime.Engine, deadline: float, cancel: threading.Event | None) -> None:
        self._engine = engine
        self._deadline = deadline
        self._cancel = cancel
        self._done = threading.Event()
        self.cancelled = False
        self._thread = threading.Thread(target=self._watch, name="adk-wasm-epoch", daemon=True)

    def __enter__(self) -> _Interrupter:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._done.wait(_EPOCH_TICK):
            if self._cancel is not None and self._cancel.is_set():
                self.cancelled = True
            if self.cancelled or time.monotonic() >= self._deadline:
                self._engine.increment_epoch()
                return
