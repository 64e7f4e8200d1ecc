"""ProcessBackend against real host processes: languages, env, stdin, process trees, timeouts.

What every backend owes (a result, the timeout and cancel with their tree kill, leftovers, a cleared
environment, the output caps) is checked by the conformance suite, tests/conformance/test_conformance_host.py.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
from pydantic import ValidationError

from adk_sandbox.executor import (
    BackendUnavailableError,
    BubblewrapEnforcer,
    ExecRequest,
    InvalidRequestError,
    IsolationClass,
    Language,
    PolicyNotEnforceableError,
    ProcessBackend,
    SandboxFailedError,
    SandboxPolicy,
)
from adk_sandbox.executor.backends.process import resolve_program
from tests.conftest import kill_all, live_processes_with_args, require, unique_sleep_seconds


def run(code: str, language: str = "command", backend: ProcessBackend | None = None, **kw: object):  # type: ignore[no-untyped-def]
    request = ExecRequest.model_validate({"language": language, "code": code, "timeout": 30, **kw})
    return (backend or ProcessBackend()).execute(request)


# -- languages -----------------------------------------------------------------------------------------


def test_command_runs_with_exit_code_and_both_streams() -> None:
    result = run("echo out; echo err >&2; exit 3")
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 3)
    assert not result.timed_out and result.duration_ms >= 0


def test_python_program_reads_stdin() -> None:
    result = run("import sys; print(sys.stdin.read()[::-1])", "python", stdin="abc")
    assert result.stdout == "cba\n" and result.exit_code == 0


def test_javascript_program() -> None:
    require(shutil.which("node") is not None, "node is not installed")
    result = run("console.log([1, 2, 3].map(x => x * 2).join(','))", "javascript")
    assert result.stdout == "2,4,6\n" and result.exit_code == 0


def test_rust_program_is_compiled_then_run() -> None:
    require(shutil.which("rustc") is not None, "rustc is not installed")
    code = (
        "use std::io::Read;\n"
        "fn main() { let mut s = String::new(); std::io::stdin().read_to_string(&mut s).unwrap();"
        ' println!("got {}", s.trim()); }'
    )
    result = run(code, "rust", stdin="42")
    assert result.stdout == "got 42\n" and result.exit_code == 0


def test_rust_compile_error_is_a_result_with_the_diagnostic() -> None:
    require(shutil.which("rustc") is not None, "rustc is not installed")
    result = run('fn main() { let x: i32 = "no"; }', "rust")
    assert result.exit_code not in (0, None)
    assert "mismatched types" in result.stderr


def test_command_starting_with_a_dash_is_run_not_parsed_as_an_option() -> None:
    result = run("-definitely-not-a-command")
    assert result.exit_code == 127 and "not found" in result.stderr


def test_no_stdin_means_dev_null() -> None:
    # The test process's own fd 0 is replaced by a pipe holding data: a child that inherited it instead
    # of getting /dev/null would show a pipe and read that data.
    saved = os.dup(0)
    read_end, write_end = os.pipe()
    os.write(write_end, b"inherited stdin\n")
    os.close(write_end)
    os.dup2(read_end, 0)
    try:
        result = run("readlink /proc/self/fd/0; cat; echo done")
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        os.close(read_end)
    assert result.stdout == "/dev/null\ndone\n"


def test_a_program_that_cannot_be_started_is_a_sandbox_failure() -> None:
    broken = ProcessBackend.with_sandbox(
        BubblewrapEnforcer("/nonexistent/bwrap"), SandboxPolicy(allow_process_spawn=True)
    )
    with pytest.raises(SandboxFailedError, match="/nonexistent/bwrap"):
        broken.execute(ExecRequest(language=Language.COMMAND, code="true", timeout=5))


def test_large_stdin_is_fed_and_unread_stdin_does_not_block() -> None:
    payload = "x" * (4 * 1024 * 1024)
    assert run("wc -c", stdin=payload).stdout.strip() == str(len(payload))
    result = run("echo ignored-stdin", stdin=payload)  # never reads its 4 MiB of stdin
    assert result.stdout == "ignored-stdin\n" and result.exit_code == 0


# -- environment and program resolution -------------------------------------------------------------------


def test_program_is_resolved_on_the_callers_path_before_the_env_is_cleared(tmp_path: Path) -> None:
    # A private `sh` on the search path is found and started by absolute path, although the child's own
    # environment has no PATH (dash then uses its built-in default, which does not include tmp_path).
    fake_sh = tmp_path / "sh"
    fake_sh.write_text('#!/bin/sh\necho "private sh got: $3"; echo "PATH=${PATH-unset}"\n')
    fake_sh.chmod(0o755)
    backend = ProcessBackend(search_path=str(tmp_path))
    result = backend.execute(ExecRequest(language=Language.COMMAND, code="hi", timeout=10))
    assert result.stdout.splitlines()[0] == "private sh got: hi"
    assert str(tmp_path) not in result.stdout.splitlines()[1]


def test_resolve_program(tmp_path: Path) -> None:
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    (tmp_path / "not-executable").write_text("")
    assert resolve_program("tool", str(tmp_path)) == str(tool)
    assert resolve_program("not-executable", str(tmp_path)) is None
    assert resolve_program("missing", str(tmp_path)) is None


def test_missing_interpreter_is_backend_unavailable_with_a_hint(tmp_path: Path) -> None:
    backend = ProcessBackend(search_path=str(tmp_path))  # nothing on this PATH
    with pytest.raises(BackendUnavailableError, match="python3"):
        backend.execute(ExecRequest(language=Language.PYTHON, code="print(1)", timeout=10))
    assert Language.PYTHON not in backend.capabilities().languages


# -- bad input --------------------------------------------------------------------------------------------


def test_bad_requests_are_refused_before_anything_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with pytest.raises(ValidationError, match="timeout"):
        ExecRequest(language=Language.COMMAND, code=f"touch {marker}")  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="timeout"):
        ExecRequest(language=Language.COMMAND, code=f"touch {marker}", timeout=-1)
    with pytest.raises(ValidationError, match="language"):
        ExecRequest.model_validate({"language": "cobol", "code": f"touch {marker}", "timeout": 5})
    with pytest.raises(InvalidRequestError, match="not supported by backend 'process'"):
        ProcessBackend().execute(ExecRequest(language=Language.TYPESCRIPT, code="1", timeout=5))
    assert not marker.exists()


def test_memory_limit_is_refused_not_ignored(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    request = ExecRequest(language=Language.COMMAND, code=f"touch {marker}", timeout=5, memory_limit_mb=64)
    with pytest.raises(PolicyNotEnforceableError, match="memory_limit_mb"):
        ProcessBackend().execute(request)
    assert not marker.exists()


def test_a_policy_without_an_enforcer_is_refused() -> None:
    with pytest.raises(PolicyNotEnforceableError, match="enforcer"):
        ProcessBackend(policy=SandboxPolicy())


def test_capabilities_are_honest() -> None:
    caps = ProcessBackend().capabilities()
    assert caps.isolation is IsolationClass.SUBPROCESS_ONLY
    assert ProcessBackend().isolation() is IsolationClass.SUBPROCESS_ONLY
    assert caps.timeout and caps.env
    assert not (caps.memory or caps.cpu or caps.pids or caps.network or caps.fs_read or caps.fs_write)
    assert caps.host_filesystem and caps.host_environment and caps.host_programs


def test_host_facts_are_true(tmp_path: Path) -> None:
    """host_filesystem: a host file outside any workspace is there at its path, as it is."""
    host_file = tmp_path / "host-only.txt"
    host_file.write_text("on the host\n")
    with ProcessBackend() as backend:
        result = backend.execute(ExecRequest(language=Language.COMMAND, code=f"cat {host_file}", timeout=10))
    assert result.stdout == "on the host\n"


# -- output -----------------------------------------------------------------------------------------------


def test_output_is_capped_per_stream_and_streamed_in_lines() -> None:
    lines: list[tuple[str, str]] = []
    request = ExecRequest(
        language=Language.COMMAND,
        code="for i in 1 2 3; do echo line$i; done; head -c 1000000 /dev/zero | tr '\\0' x >&2",
        timeout=30,
        max_output_bytes=100,
    )
    result = ProcessBackend().execute(request, on_output=lambda s, c: lines.append((s, c)))
    assert result.stdout == "line1\nline2\nline3\n" and not result.stdout_truncated
    assert result.stderr == "x" * 100 and result.stderr_truncated
    assert [c for s, c in lines if s == "stdout"] == ["line1\n", "line2\n", "line3\n"]
    assert "".join(c for s, c in lines if s == "stderr") == "x" * 100


def test_flood_of_300_mb_finishes_with_flat_memory() -> None:
    tracemalloc.start()
    try:
        started = time.monotonic()
        request = ExecRequest(
            language=Language.COMMAND, code="head -c 300000000 /dev/zero", timeout=120, max_output_bytes=4096
        )
        result = ProcessBackend().execute(request)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.exit_code == 0 and result.stdout_truncated and len(result.stdout) == 4096
    assert peak < 16 * 1024 * 1024, f"peak traced memory {peak} bytes"
    assert time.monotonic() - started < 60  # does not hang; ~1 s expected


def test_multibyte_output_is_cut_on_a_character_boundary() -> None:
    request = ExecRequest(language=Language.COMMAND, code="printf 'ab€€€'", timeout=10, max_output_bytes=6)
    result = ProcessBackend().execute(request)
    assert result.stdout == "ab€" and result.stdout_truncated  # a cut € would have been 'ab€\ufffd'


# -- process trees: timeout, cancellation, leftovers ---------------------------------------------


def test_killed_by_signal_has_no_exit_code() -> None:
    result = run("kill -9 $$")
    assert result.exit_code is None and not result.timed_out


def test_setsid_escapee_holding_stdout_does_not_hang_the_backend() -> None:
    # Without an enforcer a process that leaves the group can outlive the command (the backend reports
    # SUBPROCESS_ONLY for that reason); it must still not make execute() wait for it.
    marker = unique_sleep_seconds()
    started = time.monotonic()
    try:
        result = run(f"setsid sleep {marker} & echo done")
        assert result.stdout == "done\n"
        assert time.monotonic() - started < 15
    finally:
        kill_all(live_processes_with_args("sleep", marker))


def test_scratch_directory_is_removed_and_workdir_is_used(tmp_path: Path) -> None:
    first = run("pwd").stdout.strip()
    assert first.startswith("/") and not os.path.exists(first)
    backend = ProcessBackend(workdir=tmp_path)
    assert (
        backend.execute(ExecRequest(language=Language.COMMAND, code="pwd", timeout=5)).stdout
        == f"{tmp_path}\n"
    )


def test_concurrent_executions_do_not_mix() -> None:
    backend = ProcessBackend()
    results: dict[int, str] = {}

    def work(i: int) -> None:
        request = ExecRequest(
            language=Language.COMMAND, code=f"for j in 1 2 3; do echo {i}; done", timeout=30
        )
        results[i] = backend.execute(request).stdout

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {i: f"{i}\n{i}\n{i}\n" for i in range(8)}
