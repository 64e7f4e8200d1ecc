"""RustExecutor's logic against a scripted fake backend: what it sends, and how it reads outcomes.

Real compilers and sandboxes are exercised by tests/contract/test_rust_pipeline.py; these tests cover
what a real backend cannot produce on demand (a container's OOM kill, a build that hangs after checking).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from adk_sandbox.executor import (
    Capabilities,
    ExecRequest,
    ExecResult,
    Language,
    OutputCallback,
    SandboxBackend,
)
from adk_sandbox.executor.rust import CONTAINER_DEPS_DIR, CONTAINER_WORK_DIR, RustExecutor, RustExecutorConfig
from adk_sandbox.executor.rust.pipeline import _LLD_PROBE
from adk_sandbox.testing import container_capabilities

METADATA = json.dumps({"$message_type": "artifact", "artifact": "./libmain.rmeta", "emit": "metadata"})
LINK = json.dumps({"$message_type": "artifact", "artifact": "./main", "emit": "link"})
CODE = "fn run(input: Value) -> Value { input }"

Cancel = threading.Event | None
Step = Callable[[ExecRequest, OutputCallback | None, Cancel], ExecResult]


class ScriptedContainer(SandboxBackend):
    """Pretends to be a container backend; each execute() plays the next scripted step."""

    name = "scripted"

    def __init__(self, *steps: Step) -> None:
        self.steps = list(steps)
        self.requests: list[ExecRequest] = []

    def capabilities(self) -> Capabilities:
        return container_capabilities(Language.COMMAND)

    def execute(
        self,
        request: ExecRequest,
        on_output: OutputCallback | None = None,
        *,
        cancel: threading.Event | None = None,
    ) -> ExecResult:
        self.requests.append(request)
        step = self.steps.pop(0) if self.steps else _exit(0)
        return step(request, on_output, cancel)


def _exit(code: int | None, stdout: str = "", stderr: str = "", **flags: bool) -> Step:
    def step(request: ExecRequest, on_output: OutputCallback | None, cancel: Cancel) -> ExecResult:
        return ExecResult(stdout=stdout, stderr=stderr, exit_code=code, duration_ms=1, **flags)

    return step


def _compiles() -> Step:
    return _exit(0, stderr=f"{METADATA}\n{LINK}\n")


def _hangs(after_lines: list[str]) -> Step:
    """Streams ``after_lines`` on stderr, then blocks until cancelled or timed out, like a stuck rustc."""

    def step(request: ExecRequest, on_output: OutputCallback | None, cancel: Cancel) -> ExecResult:
        for line in after_lines:
            if on_output is not None:
                on_output("stderr", line + "\n")
        assert cancel is not None
        cancelled = cancel.wait(request.timeout)
        return ExecResult(
            stdout="",
            stderr="".join(line + "\n" for line in after_lines),
            exit_code=None,
            cancelled=cancelled,
            timed_out=not cancelled,
            duration_ms=1,
        )

    return step


def test_container_defaults_and_source_on_stdin() -> None:
    backend = ScriptedContainer(_compiles(), _exit(0, stdout='\n{"a":1}\n'))
    result = RustExecutor(backend).run(CODE, {"a": 1}, timeout=30)
    assert result.status == "success" and result.output == {"a": 1}
    compile_request, run_request = backend.requests
    assert compile_request.language is Language.COMMAND and run_request.language is Language.COMMAND
    # Nothing is assumed about the backend's filesystem: the program travels on stdin...
    assert compile_request.stdin is not None and compile_request.stdin.startswith(CODE + "\n")
    assert "fn main()" in compile_request.stdin
    # ...and the artifacts live in the container's work dir, against the image's serde_json.
    assert f"{CONTAINER_WORK_DIR}/run-" in compile_request.code
    assert f"serde_json={CONTAINER_DEPS_DIR}/libserde_json.rlib" in compile_request.code
    assert "--emit=metadata,link" in compile_request.code and "--error-format=json" in compile_request.code
    # The input JSON is the run step's stdin; the run step runs the binary under the memory cap.
    assert run_request.stdin == '{"a": 1}'
    assert "ulimit -v 524288" in run_request.code and "./main" in run_request.code


def test_in_a_container_the_compile_uses_lld_when_there_and_rustc_args_come_last() -> None:
    backend = ScriptedContainer(_compiles(), _exit(0, stdout="\n1\n"))
    config = RustExecutorConfig(rustc_args=("-C", "link-arg=-fuse-ld=bfd"))
    assert RustExecutor(backend, config).run(CODE, None, timeout=30).status == "success"
    script = backend.requests[0].code
    assert _LLD_PROBE in script
    rustc_line = next(line for line in script.splitlines() if line.startswith("rustc "))
    words = rustc_line.split()
    # The pipeline's own flags first, so the caller's (here: GNU ld) override them.
    assert words[:4] == ["rustc", "-C", "strip=debuginfo", "$link"]
    assert words.index("link-arg=-fuse-ld=bfd") > words.index("$link")


def _probe(path: str) -> str:
    done = subprocess.run(
        ["/bin/sh", "-c", f'{_LLD_PROBE}\nprintf "%s" "$link"'],
        env={"PATH": path},
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return done.stdout


def test_the_lld_probe_adds_the_flag_only_when_ld_lld_is_on_path(tmp_path: Path) -> None:
    with_lld, without = tmp_path / "with", tmp_path / "without"
    with_lld.mkdir()
    without.mkdir()
    lld = with_lld / "ld.lld"
    lld.write_text("#!/bin/sh\n")
    lld.chmod(0o700)
    assert _probe(str(with_lld)) == "-C link-arg=-fuse-ld=lld"
    assert _probe(str(without)) == ""  # an image without lld links with cc's default linker


def test_container_oom_kill_is_memory_exceeded() -> None:
    backend = ScriptedContainer(_compiles(), _exit(None, stderr="", oom_killed=True))
    result = RustExecutor(backend).run(CODE, None, timeout=30)
    assert (result.status, result.stage) == ("memory_exceeded", "run")


def test_build_that_hangs_after_checking_times_out_in_the_build_stage() -> None:
    backend = ScriptedContainer(_hangs([METADATA]))
    config = RustExecutorConfig(check_timeout=30, build_timeout=0.3)
    started = time.monotonic()
    result = RustExecutor(backend, config).run(CODE, None, timeout=60)
    assert (result.status, result.stage) == ("timeout", "build")
    assert time.monotonic() - started < 2  # the build limit, not the backstop of check + build


def test_check_that_hangs_times_out_in_the_check_stage() -> None:
    backend = ScriptedContainer(_hangs([]))
    result = RustExecutor(backend, RustExecutorConfig(check_timeout=0.3)).run(CODE, None, timeout=60)
    assert (result.status, result.stage) == ("timeout", "check")


def test_the_call_budget_bounds_the_stages() -> None:
    backend = ScriptedContainer(_hangs([METADATA]))
    started = time.monotonic()
    result = RustExecutor(backend).run(CODE, None, timeout=0.5)
    assert (result.status, result.stage) == ("timeout", "build")
    assert time.monotonic() - started < 2


def test_callers_cancel_reaches_the_compile_step() -> None:
    backend = ScriptedContainer(_hangs([]))
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    result = RustExecutor(backend).run(CODE, None, timeout=60, cancel=cancel)
    assert (result.status, result.message) == ("error", "cancelled by the caller")


def test_a_missing_serde_json_in_the_backend_is_an_infrastructure_error() -> None:
    diagnostic = json.dumps(
        {
            "$message_type": "diagnostic",
            "message": f"extern location for serde_json does not exist: {CONTAINER_DEPS_DIR}/x.rlib",
            "code": None,
            "level": "error",
            "spans": [],
            "children": [],
            "rendered": "error: extern location for serde_json does not exist\n",
        }
    )
    backend = ScriptedContainer(_exit(1, stderr=diagnostic + "\n"))
    result = RustExecutor(backend).run(CODE, None, timeout=30)
    assert result.status == "error" and result.message is not None
    assert "serde_json" in result.message and "adk-sandbox/rust" in result.message


def test_a_vanished_binary_is_an_infrastructure_error_not_the_users() -> None:
    gone = "adk-sandbox: the compiled program is gone; the backend must keep its filesystem (use a session)"
    backend = ScriptedContainer(_compiles(), _exit(125, stderr=gone + "\n"))
    result = RustExecutor(backend).run(CODE, None, timeout=30)
    assert result.status == "error" and result.message is not None
    assert "keep its filesystem" in result.message


def test_killed_steps_are_cleaned_up_through_the_backend() -> None:
    backend = ScriptedContainer(_compiles(), _exit(None, timed_out=True))
    result = RustExecutor(backend).run(CODE, None, timeout=30)
    assert (result.status, result.stage) == ("timeout", "run")
    cleanup = backend.requests[-1]
    assert cleanup.code.startswith(f"rm -rf {CONTAINER_WORK_DIR}/run-")
