"""Agent-facing tools: ``code_exec`` (the Rust pipeline) and ``sandbox_exec`` (any language, any backend).

:class:`CodeTool` and :class:`SandboxTool` are agent tools that never raise (errors are results),
with argument models :class:`CodeExecArgs` and :class:`SandboxExecArgs`; ``run`` is async over the one
bridge, ``run_sync`` its synchronous form. See docs/RUST_AND_WASM.md, section "CodeTool (code_exec) and
SandboxTool (sandbox_exec)".
"""

from __future__ import annotations

import math
import re
import threading
from abc import abstractmethod
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Generic, Self, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator

from adk_sandbox.executor._bridge import run_blocking
from adk_sandbox.executor.backend import OwnedSession, SandboxBackend, SessionFactory
from adk_sandbox.executor.errors import SandboxFailedError
from adk_sandbox.executor.rust.pipeline import RustExecutor, RustExecutorConfig, RustResult
from adk_sandbox.executor.tool_protocol import (
    MAX_ARGUMENT_DEPTH,
    AgentTool,
    InvalidArgumentsError,
    ProgressCallback,
    error_payload,
    text_rules,
)
from adk_sandbox.executor.types import ExecRequest, ExecResult, Language

__all__ = [
    "DEFAULT_TIMEOUT_SECS",
    "MAX_ARGUMENT_DEPTH",
    "MAX_INPUT_DEPTH",
    "MAX_TIMEOUT_SECS",
    "MIN_TIMEOUT_SECS",
    "CodeExecArgs",
    "CodeTool",
    "SandboxExecArgs",
    "SandboxTool",
    "code_result_json",
]

DEFAULT_TIMEOUT_SECS = 30.0
"""``timeout_secs`` when the call gives none."""
MIN_TIMEOUT_SECS = 1.0
"""Smaller values (zero and negative included) are raised to this."""
MAX_TIMEOUT_SECS = 300.0
"""Larger values are lowered to this."""

MAX_INPUT_DEPTH = 127
"""Deepest nesting of arrays and objects in ``code_exec``'s ``input``: serde_json's parser in the harness
refuses more (its recursion limit), which would silently turn the whole input into ``null``."""


def _check_json_value(value: Any) -> Any:
    """Refuse values the harness could not receive intact: too deep, not JSON, or NaN/Infinity."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list, tuple)):
            if depth + 1 > MAX_INPUT_DEPTH:
                raise ValueError(
                    f"input is nested more than {MAX_INPUT_DEPTH} levels deep (arrays and objects); "
                    "serde_json in the harness accepts no deeper nesting"
                )
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        raise ValueError(f"input has an object key that is not a string: {key!r}")
                    _check_input_text(key)
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise ValueError(f"input contains {item!r}, which JSON cannot represent")
        elif isinstance(item, str):
            _check_input_text(item)
        elif item is not None and not isinstance(item, int):  # bool is an int
            raise ValueError(f"input must be JSON data; it contains a {type(item).__name__}")
    return value


def _check_input_text(text: str) -> None:
    # json.dumps writes a lone surrogate as a "\ud800" escape, which serde_json refuses: the whole input
    # would silently arrive as null.
    if _LONE_SURROGATE.search(text):
        raise ValueError(
            "input holds a lone surrogate (not valid Unicode text), which the harness cannot read"
        )


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

_TIMEOUT_DESCRIPTION = (
    f"Wall-clock limit for the whole call in seconds (default {DEFAULT_TIMEOUT_SECS:g}; values are "
    f"clamped to {MIN_TIMEOUT_SECS:g}..{MAX_TIMEOUT_SECS:g})."
)


def _clamp_timeout(value: float) -> float:
    # Clamped rather than refused: a model asking for 0 or a day still gets a bounded, useful run.
    if math.isnan(value):
        raise ValueError("timeout_secs must be a number")
    return min(max(value, MIN_TIMEOUT_SECS), MAX_TIMEOUT_SECS)


def _code_not_blank(code: str) -> str:
    if not code.strip():
        raise ValueError("code must not be empty")
    return code


class CodeExecArgs(BaseModel):
    """Arguments of ``code_exec``."""

    model_config = ConfigDict(extra="forbid")

    code: Annotated[StrictStr, text_rules()] = Field(
        description=(
            "Rust source defining `fn run(input: Value) -> Value` (serde_json::Value is imported; the "
            "serde_json crate is available). Do not define `fn main` or crate attributes `#![...]`."
        )
    )
    input: Any = Field(default=None, description="Any JSON value, passed to run() as its argument.")
    timeout_secs: float = Field(default=DEFAULT_TIMEOUT_SECS, description=_TIMEOUT_DESCRIPTION)

    _not_blank = field_validator("code")(_code_not_blank)
    _clamped = field_validator("timeout_secs")(_clamp_timeout)
    _json_input = field_validator("input")(_check_json_value)


class SandboxExecArgs(BaseModel):
    """Arguments of ``sandbox_exec``."""

    model_config = ConfigDict(extra="forbid")

    language: Language = Field(description="What `code` is: `command` is a `sh -c` string.")
    code: Annotated[StrictStr, text_rules(nul="code handed to a program")] = Field(
        description="The command string or the program's source text."
    )
    # NUL bytes pass: standard input is bytes, and a program may read them.
    stdin: Annotated[StrictStr, text_rules()] | None = Field(
        default=None, description="Text fed to the program's standard input."
    )
    timeout_secs: float = Field(default=DEFAULT_TIMEOUT_SECS, description=_TIMEOUT_DESCRIPTION)

    _not_blank = field_validator("code")(_code_not_blank)
    _clamped = field_validator("timeout_secs")(_clamp_timeout)


ArgsT = TypeVar("ArgsT", bound=BaseModel)


class _BlockingTool(AgentTool, Generic[ArgsT]):
    """The code tools' contract on top of :class:`AgentTool`: never raise, run off the event loop."""

    errors_are_results: ClassVar[bool] = True

    def run_sync(
        self, arguments: Mapping[str, Any] | str, *, cancel: threading.Event | None = None
    ) -> dict[str, Any]:
        """Run the tool; ``arguments`` is a dict or its JSON text. Never raises."""
        try:
            parsed = self.parse(arguments)
        except InvalidArgumentsError as exc:
            return error_payload(str(exc))
        return self._call_reporting(cast(ArgsT, parsed), cancel)

    async def _run(self, arguments: Any, on_progress: ProgressCallback | None) -> dict[str, Any]:
        # In a thread of its own; cancelling the awaiting task kills what it started, and CancelledError
        # propagates once the execution has been killed (see ``run_blocking``).
        return await run_blocking(
            lambda cancel: self._call_reporting(cast(ArgsT, arguments), cancel),
            name=f"adk-sandbox-{self.name}",
        )

    def _call_reporting(self, arguments: ArgsT, cancel: threading.Event | None) -> dict[str, Any]:
        try:
            return self._call(arguments, cancel)
        except Exception as exc:  # infrastructure failures are information for the model, too
            return error_payload(f"{type(exc).__name__}: {exc}")

    @abstractmethod
    def _call(self, arguments: ArgsT, cancel: threading.Event | None) -> dict[str, Any]: ...


class CodeTool(_BlockingTool[CodeExecArgs]):
    """``code_exec``: compile and run a Rust ``fn run(input: Value) -> Value`` with a JSON input.

    Give it a :class:`RustExecutor` (shared, not closed by the tool) or a backend (the tool then makes and
    owns its executor; ``close()`` releases it). Results: see :func:`code_result_json`.
    """

    name = "code_exec"
    description = (
        "Compile and run a Rust function `fn run(input: Value) -> Value` in a sandbox. The input is any "
        "JSON value; the result is the JSON value run() returns, plus what it printed. Compiler errors "
        "come back as structured diagnostics with line numbers of your code. status is one of success, "
        "compile_error, runtime_error, timeout (with the stage: check, build or run), memory_exceeded, "
        "rejected, error."
    )
    args_model: type[BaseModel] = CodeExecArgs

    def __init__(
        self,
        target: RustExecutor | SandboxBackend | SessionFactory,
        config: RustExecutorConfig | None = None,
    ) -> None:
        if isinstance(target, RustExecutor):
            self._executor, self._owned = target, False
        else:
            self._executor, self._owned = RustExecutor(target, config), True

    @property
    def executor(self) -> RustExecutor:
        """The pipeline this tool runs."""
        return self._executor

    def close(self) -> None:
        """Close the executor if the tool created it (and with it the session it opened). Idempotent."""
        if self._owned:
            self._executor.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, arguments: CodeExecArgs, cancel: threading.Event | None) -> dict[str, Any]:
        result = self._executor.run(
            arguments.code, arguments.input, timeout=arguments.timeout_secs, cancel=cancel
        )
        return code_result_json(result)


class SandboxTool(_BlockingTool[SandboxExecArgs]):
    """``sandbox_exec``: run a command or program in the backend, whichever backend that is.

    Result: ``{status, exit_code, stdout, stderr, timed_out, truncated, duration_ms, isolation}`` with
    ``status`` ``success`` (exit 0), ``runtime_error`` (non-zero exit or a signal), ``timeout``,
    ``memory_exceeded``; or ``{status: "error", message}`` when it could not run.
    """

    name = "sandbox_exec"
    description = (
        "Run a shell command (language `command`) or a program (python, javascript, rust, ...) in a "
        "sandbox and return its exit code, stdout and stderr. Output is capped per stream; the process "
        "tree is killed at the timeout."
    )
    args_model: type[BaseModel] = SandboxExecArgs

    def __init__(self, backend: SandboxBackend | SessionFactory) -> None:
        """Run every call in ``backend``, or in one session of it.

        Given a :class:`SessionFactory` (``DockerBackend``) the tool opens **one** session on its first
        call and runs every call in it (one container, its agent channel kept warm; files a call writes
        are there for the next, as in a terminal), closed by :meth:`close`. Otherwise each call is the
        backend's own ``execute``.
        """
        self._factory: SessionFactory | None = None
        self._backend: SandboxBackend | None = None
        if isinstance(backend, SessionFactory):
            self._factory = backend
        else:
            self._backend = backend
        self._owned: OwnedSession | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._isolation: str | None = None

    def _sandbox(self) -> SandboxBackend:
        with self._lock:
            if self._backend is None:
                if self._closed or self._factory is None:
                    raise SandboxFailedError("this sandbox_exec tool is closed")
                self._owned = OwnedSession(self, self._factory, "the sandbox_exec tool")
                self._backend = self._owned.session
            return self._backend

    def close(self) -> None:
        """Close the session the tool opened, if any (its container is removed). Idempotent."""
        with self._lock:
            self._closed = True
            owned, self._owned = self._owned, None
            if self._factory is not None:
                self._backend = None
        if owned is not None:
            owned.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, arguments: SandboxExecArgs, cancel: threading.Event | None) -> dict[str, Any]:
        request = ExecRequest(
            language=arguments.language,
            code=arguments.code,
            stdin=arguments.stdin,
            timeout=arguments.timeout_secs,
        )
        backend = self._sandbox()
        result = backend.execute(request, cancel=cancel)
        if self._isolation is None:
            self._isolation = backend.isolation().value
        return _sandbox_result_json(result, self._isolation)


def _sandbox_result_json(result: ExecResult, isolation: str) -> dict[str, Any]:
    if result.cancelled:
        return error_payload("cancelled by the caller")
    if result.timed_out:
        status = "timeout"
    elif result.oom_killed:
        status = "memory_exceeded"
    elif result.exit_code == 0:
        status = "success"
    else:
        status = "runtime_error"
    return {
        "status": status,
        "exit_code": result.exit_code,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "timed_out": result.timed_out,
        "truncated": result.stdout_truncated or result.stderr_truncated,
        "duration_ms": result.duration_ms,
        "isolation": isolation,
    }


def code_result_json(result: RustResult) -> dict[str, Any]:
    """The JSON shape of a pipeline result (docs/RUST_AND_WASM.md); which keys appear depends on ``status``.

    * ``success``: status, stdout, stderr, exit_code, duration_ms, output, diagnostics (warnings),
      truncated
    * ``compile_error``: status, diagnostics, stderr (rustc's rendered messages)
    * ``runtime_error``: status, message, stdout, stderr, exit_code, duration_ms, diagnostics, truncated
    * ``timeout`` / ``memory_exceeded``: status, stage, message, stdout, stderr, duration_ms
    * ``rejected`` / ``error``: status, message
    """
    diagnostics = [d.model_dump(mode="json") for d in result.diagnostics]
    truncated = result.stdout_truncated or result.stderr_truncated
    if result.status == "success":
        return {
            "status": result.status,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "exit_code": result.exit_code,
            "duration_ms": result.duration_ms,
            "output": result.output,
            "diagnostics": diagnostics,
            "truncated": truncated,
        }
    if result.status == "compile_error":
        return {"status": result.status, "diagnostics": diagnostics, "stderr": result.stderr}
    if result.status == "runtime_error":
        return {
            "status": result.status,
            "message": result.message,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "exit_code": result.exit_code,
            "duration_ms": result.duration_ms,
            "diagnostics": diagnostics,
            "truncated": truncated,
        }
    if result.status in ("timeout", "memory_exceeded"):
        return {
            "status": result.status,
            "stage": result.stage,
            "message": result.message,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "duration_ms": result.duration_ms,
        }
    return {"status": result.status, "message": result.message}
