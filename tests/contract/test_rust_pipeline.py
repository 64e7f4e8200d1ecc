"""The Rust pipeline's contract, run against every backend it supports (real rustc, real sandboxes).

Each backend is an entry of :data:`TARGETS`: a factory that yields a ready :class:`RustExecutor`. Known
differences between backends are listed per backend in :data:`KNOWN_DIFFERENCES` and asserted as such
(the test checks the documented behaviour), never skipped. To run the suite on another backend (the
Docker session), add a factory and its known differences.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from adk_sandbox.executor import CodeTool, ProcessBackend, SandboxPolicy, get_enforcer
from adk_sandbox.executor.backends.docker import RUST_IMAGE, DockerBackend
from adk_sandbox.executor.errors import BackendUnavailableError, EnforcerUnavailableError
from adk_sandbox.executor.rust import RustExecutor, RustExecutorConfig, RustResult, host_rust
from tests.conftest import require


@dataclass
class Target:
    """A backend under test with its executor."""

    name: str
    executor: RustExecutor
    work_dir: Path | None
    """The work directory as the host sees it, when the host can see it (None for containers)."""

    def differs(self, behaviour: str) -> bool:
        return behaviour in KNOWN_DIFFERENCES.get(self.name, set())


KNOWN_DIFFERENCES: dict[str, set[str]] = {
    # A bare host process sees the whole host filesystem: compile-time file access is not confined.
    "process": {"include_str_reads_host_files"},
    "bwrap": set(),
    "docker": set(),
}
"""Per backend: behaviours of the suite that are documented to differ there (docs/RUST_AND_WASM.md)."""


def _require_host_rust() -> None:
    host = host_rust()
    require(host is not None, "rustc (and cc) are not installed on the host")
    assert host is not None
    require(
        host.deps_available, f"serde_json for this rustc is missing: run scripts/build-rust-deps ({host})"
    )


@contextlib.contextmanager
def _process_target(tmp_path: Path) -> Iterator[Target]:
    _require_host_rust()
    work = tmp_path / "rust-work"
    with ProcessBackend() as backend, RustExecutor(backend, RustExecutorConfig(work_dir=str(work))) as ex:
        yield Target("process", ex, work)


@contextlib.contextmanager
def _bwrap_target(tmp_path: Path) -> Iterator[Target]:
    _require_host_rust()
    try:
        enforcer = get_enforcer()
    except EnforcerUnavailableError as exc:
        require(False, f"bubblewrap is not usable here: {exc}")
        raise
    host = host_rust()
    assert host is not None
    work = tmp_path / "rust-work"
    work.mkdir()
    builder = SandboxPolicy.builder().allow_process_spawn().allow_read_write(work)
    for path in host.read_only_paths:
        builder.allow_read(path)
    backend = ProcessBackend.with_sandbox(enforcer, builder.build())
    with backend, RustExecutor(backend, RustExecutorConfig(work_dir=str(work))) as executor:
        yield Target("bwrap", executor, work)


@contextlib.contextmanager
def _docker_target(tmp_path: Path) -> Iterator[Target]:
    try:
        backend = DockerBackend(image=RUST_IMAGE)
    except BackendUnavailableError as exc:
        require(False, f"the Docker engine is not usable here: {exc}")
        raise
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    os.chown(workspace, 1000, 1000)
    # Check, build and run all happen in the session's container, against the image's serde_json.
    with backend, backend.session(workspace=workspace) as session, RustExecutor(session) as executor:
        yield Target("docker", executor, None)


TARGETS: dict[str, Callable[[Path], contextlib.AbstractContextManager[Target]]] = {
    "process": _process_target,
    "bwrap": _bwrap_target,
    "docker": _docker_target,
}


@pytest.fixture(params=sorted(TARGETS))
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    with TARGETS[request.param](tmp_path) as ready:
        yield ready


def _leftover_runs(target: Target) -> list[str]:
    if target.work_dir is None or not target.work_dir.exists():
        return []
    return [name for name in os.listdir(target.work_dir) if name.startswith("run-")]


# -- success ---------------------------------------------------------------------------------------


def test_success_returns_output_and_side_prints(target: Target) -> None:
    code = (
        "fn run(input: Value) -> Value {\n"
        '    println!("side print");\n'
        '    eprintln!("to stderr");\n'
        '    print!("no newline");\n'
        '    let n = input["n"].as_i64().unwrap_or(0);\n'
        '    serde_json::json!({"double": n * 2, "items": input["items"].clone()})\n'
        "}\n"
    )
    result = target.executor.run(code, {"n": 21, "items": [1, "two", None]}, timeout=60)
    assert result.status == "success", result
    assert result.output == {"double": 42, "items": [1, "two", None]}
    assert result.stdout == "side print\nno newline"
    assert result.stderr == "to stderr\n"
    assert result.exit_code == 0 and result.duration_ms > 0
    assert set(result.timings_ms) == {"compile", "run"}
    assert _leftover_runs(target) == []


# What the linker put in the program, read by the program itself from its ELF section headers (std
# has ".debug_info" as a string of its own, so searching the bytes would not do).
LINKED_WITH = """fn run(_input: Value) -> Value {
    let exe = std::fs::read("/proc/self/exe").unwrap();
    let u = |at: usize, n: usize| (0..n).fold(0usize, |v, i| v | (exe[at + i] as usize) << (8 * i));
    let (shoff, shentsize, shnum, shstrndx) = (u(0x28, 8), u(0x3a, 2), u(0x3c, 2), u(0x3e, 2));
    let section = |i: usize| {
        let h = shoff + i * shentsize;
        (u(h, 4), u(h + 0x18, 8), u(h + 0x20, 8))
    };
    let strtab = section(shstrndx).1;
    let name = |i: usize| {
        let start = strtab + section(i).0;
        let end = start + exe[start..].iter().position(|b| *b == 0).unwrap();
        String::from_utf8_lossy(&exe[start..end]).into_owned()
    };
    let comment = (0..shnum).find(|i| name(*i) == ".comment").map(|i| {
        let (_, offset, size) = section(i);
        String::from_utf8_lossy(&exe[offset..offset + size]).into_owned()
    });
    serde_json::json!({
        "debug_info": (0..shnum).any(|i| name(i) == ".debug_info"),
        "lld": comment.unwrap_or_default().contains("LLD"), // "Linker: Debian LLD 19.1.7"
    })
}
"""
"""Returns whether the running binary has a ``.debug_info`` section and lld's ``Linker: LLD`` comment."""


def test_the_program_is_linked_without_debug_info(target: Target) -> None:
    # std's and serde_json's debug info made most of the binary and of the link time (BENCHMARKS.md,
    # "Issue 11: the warm Rust snippet"); panic locations do not need it (see the panic test).
    result = target.executor.run(LINKED_WITH, None, timeout=60)
    assert result.status == "success", result
    assert result.output["debug_info"] is False


def test_missing_or_invalid_input_is_null(target: Target) -> None:
    code = 'fn run(input: Value) -> Value { serde_json::json!({"null": input.is_null()}) }'
    assert target.executor.run(code, None, timeout=60).output == {"null": True}
    assert target.executor.run(code, "text", timeout=60).output == {"null": False}


def test_run_may_return_any_serializable_value(target: Target) -> None:
    code = 'fn run(_input: Value) -> Vec<(String, i64)> { vec![("a".to_string(), 1)] }'
    result = target.executor.run(code, None, timeout=60)
    assert result.status == "success" and result.output == [["a", 1]]


def test_users_own_value_import_and_warnings(target: Target) -> None:
    code = "use serde_json::Value;\nfn run(input: Value) -> Value {\n    let unused = 1;\n    input\n}\n"
    result = target.executor.run(code, [1], timeout=60)
    assert result.status == "success" and result.output == [1]
    (warning,) = result.diagnostics
    assert warning.level == "warning" and "unused" in warning.message
    assert (warning.spans[0].file_name, warning.spans[0].line_start) == ("main.rs", 3)


def test_look_alikes_of_fn_main_in_strings_and_comments_compile(target: Target) -> None:
    code = (
        "// fn main() {}\n"
        "/* #![no_std] /* fn main */ */\n"
        "fn run(_input: Value) -> Value {\n"
        '    let raw = r#"fn main() { "quoted" }"#;\n'
        '    Value::String(format!("{raw} fn main"))\n'
        "}\n"
    )
    result = target.executor.run(code, None, timeout=60)
    assert result.status == "success", result
    assert result.output == 'fn main() { "quoted" } fn main'


# -- failures of the code ------------------------------------------------------------------------


def test_type_error_is_a_compile_error_at_the_users_line(target: Target) -> None:
    code = 'fn run(input: Value) -> Value {\n    let x: i64 = "seven";\n    input\n}\n'
    result = target.executor.run(code, None, timeout=60)
    assert result.status == "compile_error"
    first = result.diagnostics[0]
    assert (first.level, first.code) == ("error", "E0308")
    span = first.spans[0]
    assert (span.file_name, span.line_start, span.column_start) == ("main.rs", 2, 18)
    assert "--> main.rs:2:18" in result.stderr
    assert _leftover_runs(target) == []
    shaped = CodeTool(target.executor).run_sync({"code": code})
    assert set(shaped) == {"status", "diagnostics", "stderr"}
    assert shaped["diagnostics"][0]["spans"][0]["line_start"] == 2


@pytest.mark.parametrize(
    ("code", "needle"),
    [
        ("fn main() {}\nfn run(input: Value) -> Value { input }", "fn main"),
        ("#![no_std]\nfn run(input: Value) -> Value { input }", "#!["),
    ],
)
def test_fn_main_and_crate_attributes_are_rejected_before_compiling(
    target: Target, code: str, needle: str
) -> None:
    result = target.executor.run(code, None, timeout=60)
    assert result.status == "rejected" and result.message is not None and needle in result.message
    assert result.timings_ms == {}  # nothing reached the backend


def test_panic_is_a_runtime_error_with_its_message(target: Target) -> None:
    code = 'fn run(input: Value) -> Value {\n    println!("before");\n    panic!("boom {}", 42);\n}\n'
    result = target.executor.run(code, None, timeout=60)
    assert result.status == "runtime_error"
    assert result.message == "panicked at main.rs:3:5: boom 42"
    assert result.exit_code == 101 and "before" in result.stdout
    assert _leftover_runs(target) == []


def test_exiting_without_a_result_is_a_runtime_error(target: Target) -> None:
    code = "fn run(_input: Value) -> Value { std::process::exit(0) }"
    result = target.executor.run(code, None, timeout=60)
    assert result.status == "runtime_error" and result.message is not None
    assert "printed no result" in result.message


def test_infinite_loop_times_out_in_the_run_stage(target: Target) -> None:
    code = (
        "fn run(_input: Value) -> Value {\n    let mut i: u64 = 0;\n    loop { i = i.wrapping_add(1); }\n}\n"
    )
    started = time.monotonic()
    result = target.executor.run(code, None, timeout=4)
    elapsed = time.monotonic() - started
    assert (result.status, result.stage) == ("timeout", "run")
    assert elapsed < 4 + 3, elapsed
    assert _leftover_runs(target) == []  # the killed step's directory was removed afterwards


def test_slow_type_checking_times_out_in_the_check_stage(target: Target) -> None:
    # 2^30 macro expansions: expansion is part of checking, long before any metadata is written.
    code = (
        "macro_rules! blow { () => {}; ($x:tt $($rest:tt)*) => { blow!($($rest)*); blow!($($rest)*); }; }\n"
        "fn run(input: Value) -> Value {\n"
        "    blow!(a a a a a a a a a a a a a a a a a a a a a a a a a a a a a a);\n"
        "    input\n"
        "}\n"
    )
    config = target.executor.config.model_copy(update={"check_timeout": 2.0})
    executor = RustExecutor(target.executor.backend, config)
    started = time.monotonic()
    result = executor.run(code, None, timeout=30)
    assert (result.status, result.stage) == ("timeout", "check")
    assert time.monotonic() - started < 2 + 3


def test_memory_hog_is_memory_exceeded(target: Target) -> None:
    # Every backend reports it: the pipeline caps the program's address space (ulimit -v, default 512 MiB),
    # also on the bare host where ProcessBackend itself enforces no memory limit. On Docker the container's
    # OOM kill is the second line (ExecResult.oom_killed).
    code = (
        "fn run(_input: Value) -> Value {\n"
        "    let mut hog: Vec<Vec<u8>> = Vec::new();\n"
        "    loop { hog.push(vec![1u8; 16 << 20]); }\n"
        "}\n"
    )
    result = target.executor.run(code, None, timeout=60)
    assert (result.status, result.stage) == ("memory_exceeded", "run"), result


def test_include_str_of_a_host_file_outside_the_workspace(target: Target, tmp_path: Path) -> None:
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    token = secrets.token_hex(8)
    secret.write_text(token)
    code = f'fn run(_input: Value) -> Value {{\n    Value::String(include_str!("{secret}").to_string())\n}}\n'
    result = target.executor.run(code, None, timeout=60)
    if target.differs("include_str_reads_host_files"):
        # Known difference: a bare ProcessBackend compiles with the host's view of the filesystem.
        assert result.status == "success" and result.output == token
        return
    assert result.status == "compile_error", result
    assert token not in str(result.model_dump())
    assert result.diagnostics[0].spans[0].line_start == 2


# -- the executor's own behaviour -------------------------------------------------------------------


def test_concurrent_snippets_do_not_interfere(target: Target) -> None:
    results: dict[int, RustResult] = {}

    def one(n: int) -> None:
        code = f"fn run(_i: Value) -> Value {{ Value::from({n}) }}"
        results[n] = target.executor.run(code, None, timeout=60)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {n: r.output for n, r in results.items()} == {0: 0, 1: 1, 2: 2}


def test_cancel_stops_a_running_snippet(target: Target) -> None:
    cancel = threading.Event()
    threading.Timer(1.0, cancel.set).start()
    started = time.monotonic()
    result = target.executor.run("fn run(_i: Value) -> Value { loop {} }", None, timeout=60, cancel=cancel)
    assert result.status == "error" and result.message == "cancelled by the caller"
    assert time.monotonic() - started < 5
