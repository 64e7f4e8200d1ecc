"""The conformance suite (adk_sandbox.testing) on the WASM backend: the checks that apply to a WASI module.

A module has no shell, processes, filesystem, network or environment: the checks that need a shell do not
apply (skipped), the others run with programs written as WAT (results, timeout, cancel, the output caps,
binary stdin, the memory cap). What a module cannot have is refused, as the README says.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from adk_sandbox.executor import InvalidRequestError, PolicyNotEnforceableError
from adk_sandbox.testing import ConformanceSuite, ConformanceTarget, KnownDifference
from tests.conformance.table import column
from tests.conftest import require

MEMORY_MB = 16


@pytest.fixture(scope="module")
def conformance_target() -> Iterator[ConformanceTarget]:
    require(importlib.util.find_spec("wasmtime") is not None, "wasmtime is not installed (extra `wasm`)")
    from adk_sandbox.executor import WasmBackend  # noqa: PLC0415 - only once require() has seen wasmtime

    with WasmBackend(memory_limit_mb=MEMORY_MB) as backend:
        yield ConformanceTarget(
            backend,
            shell=False,
            memory_limit_mb=MEMORY_MB,
            table=column("wasm"),
            known_differences={
                "argv": KnownDifference(
                    "runs a WASI module given as code, never a program from argv", raises=InvalidRequestError
                ),
                "cwd": KnownDifference(
                    "a module has no filesystem, so no working directory: any cwd is refused",
                    raises=InvalidRequestError,
                ),
                "user_other": KnownDifference(
                    "a module runs inside this process and has no user to switch to: any user is refused",
                    raises=PolicyNotEnforceableError,
                ),
            },
        )


class TestWasmConformance(ConformanceSuite):
    pass
