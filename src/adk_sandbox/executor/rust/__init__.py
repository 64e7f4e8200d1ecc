"""The Rust compile-run pipeline: ``fn run(input: Value) -> Value`` snippets on any backend."""

from adk_sandbox.executor.rust.diagnostics import Diagnostic, DiagnosticChild, DiagnosticSpan
from adk_sandbox.executor.rust.harness import validation_error, wrap_in_harness
from adk_sandbox.executor.rust.host import HostRust, host_rust
from adk_sandbox.executor.rust.pipeline import (
    CONTAINER_DEPS_DIR,
    CONTAINER_WORK_DIR,
    DEFAULT_RUSTC_ARGS,
    RustExecutor,
    RustExecutorConfig,
    RustResult,
    RustStage,
    RustStatus,
)

__all__ = [
    "CONTAINER_DEPS_DIR",
    "CONTAINER_WORK_DIR",
    "DEFAULT_RUSTC_ARGS",
    "Diagnostic",
    "DiagnosticChild",
    "DiagnosticSpan",
    "HostRust",
    "RustExecutor",
    "RustExecutorConfig",
    "RustResult",
    "RustStage",
    "RustStatus",
    "host_rust",
    "validation_error",
    "wrap_in_harness",
]
