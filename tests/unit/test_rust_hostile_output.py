"""A program's (or rustc's) hostile output must give a normal result: never an exception, never a stall.

Reading a run's stderr and stdout happens in the host process, so a quadratic regex holds the GIL and
freezes every session, and an uncaught RecursionError loses the call's result. The executor is driven
through a scripted fake backend (no rustc): compile succeeds, then the run step returns the output.
"""

from __future__ import annotations

import time

from adk_sandbox.executor.rust import RustExecutor, RustResult
from adk_sandbox.executor.rust.diagnostics import is_metadata_notice, parse_compiler_output
from tests.unit.test_rust_pipeline_logic import METADATA, ScriptedContainer, _compiles, _exit

CODE = "fn run(input: Value) -> Value {\n    let a = 1;\n    let b = 2;\n    input\n}\n"  # user lines 1-5
NOTE = "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n"
# Far above the linear time (well under a second); the quadratic search took minutes for 1 MiB.
DOES_NOT_HANG = 10.0
# 1 MiB of panic headers on one line that never ends in ":" (so none is a panic).
HEADERS = "thread 'x' panicked at " * (1024 * 1024 // 23)


def _run(exit_code: int | None, stdout: str = "", stderr: str = "") -> RustResult:
    return RustExecutor(ScriptedContainer(_compiles(), _exit(exit_code, stdout, stderr))).run(
        CODE, None, timeout=30
    )


def test_a_megabyte_of_panic_headers_without_a_newline_does_not_stall_the_host() -> None:
    started = time.monotonic()
    result = _run(101, stderr=HEADERS)
    assert time.monotonic() - started < DOES_NOT_HANG
    assert result.status == "runtime_error" and result.message is not None
    assert result.message.startswith("the program exited with status 101: thread 'x' panicked at ")


def test_a_megabyte_of_panic_headers_before_a_real_panic_still_finds_it() -> None:
    started = time.monotonic()
    result = _run(101, stderr=f"{HEADERS}\nthread 'main' panicked at main.rs:1:5:\nboom\n{NOTE}")
    assert time.monotonic() - started < DOES_NOT_HANG
    assert result.message == "panicked at main.rs:1:5: boom"


def test_a_panic_reports_its_location_and_message_up_to_the_note() -> None:
    result = _run(101, stdout="before\n", stderr=f"thread 'main' panicked at main.rs:3:5:\nboom 42\n{NOTE}")
    assert (result.status, result.message) == ("runtime_error", "panicked at main.rs:3:5: boom 42")


def test_a_panic_with_the_thread_id_of_newer_rustc_and_a_multi_line_message() -> None:
    stderr = f"thread 'main' (1168) panicked at main.rs:2:9:\nfirst\nsecond\n{NOTE}"
    assert _run(101, stderr=stderr).message == "panicked at main.rs:2:9: first\nsecond"


def test_a_panic_after_unterminated_program_text_on_the_same_line_is_found() -> None:
    stderr = f"partial line thread 'worker' panicked at main.rs:1:1:\nbad\n{NOTE}"
    assert _run(101, stderr=stderr).message == "panicked at main.rs:1:1: bad"


def test_the_first_of_several_panics_is_reported() -> None:
    stderr = (
        f"thread 'worker' panicked at main.rs:2:1:\nfirst\n{NOTE}"
        "thread 'main' panicked at main.rs:4:1:\nsecond\n"
    )
    assert _run(101, stderr=stderr).message == "panicked at main.rs:2:1: first"


def test_a_panic_header_without_its_colon_line_end_is_not_a_panic() -> None:
    stderr = "thread 'main' panicked at main.rs:1:1\nnot really\n"
    assert _run(101, stderr=stderr).message == "the program exited with status 101: not really"


def test_a_panic_in_the_harness_is_labelled_as_the_harness() -> None:
    result = _run(101, stderr=f"thread 'main' panicked at main.rs:900:5:\nbad input\n{NOTE}")
    assert result.message == "panicked at the harness: bad input"


def test_a_panic_location_with_an_absurd_line_number_is_kept_as_text() -> None:
    # int() refuses strings over 4300 digits; such a "line number" is not one rustc writes anyway.
    location = "main.rs:" + "9" * 5000 + ":1"
    result = _run(101, stderr=f"thread 'main' panicked at {location}:\nboom\n")
    assert result.message == f"panicked at {location}: boom"


def test_deeply_nested_json_as_the_result_line_is_no_result() -> None:
    result = _run(0, stdout="before\n\n" + "[" * 100_000 + "\n")
    assert result.status == "runtime_error" and result.message is not None
    assert "printed no result" in result.message


def test_deeply_nested_json_on_rustcs_stderr_is_kept_as_text() -> None:
    nested = '{"artifact":' * 100_000
    parsed = parse_compiler_output(f"{nested}\n{METADATA}\n", user_lines=1)
    assert parsed.metadata_emitted and parsed.diagnostics == []
    assert parsed.rendered == nested + "\n"
    assert not is_metadata_notice(nested)
