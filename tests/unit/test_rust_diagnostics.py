"""Parsing rustc's JSON diagnostics (fixtures captured from real rustc 1.95 on the harnessed program)."""

from __future__ import annotations

import json
from pathlib import Path

from adk_sandbox.executor.rust.diagnostics import HARNESS_FILE, is_metadata_notice, parse_compiler_output

FIXTURES = Path(__file__).parent / "fixtures"


def test_type_error_keeps_level_message_code_and_the_users_span() -> None:
    # The user's code had 5 lines; the error is on line 3: `let n: i64 = "not a number";`
    parsed = parse_compiler_output((FIXTURES / "rustc_type_error.jsonl").read_text(), user_lines=5)
    assert [d.message for d in parsed.errors] == ["mismatched types"]
    error = parsed.errors[0]
    assert (error.level, error.code) == ("error", "E0308")
    primary = error.spans[0]
    assert (primary.file_name, primary.line_start, primary.line_end) == ("main.rs", 3, 3)
    assert (primary.column_start, primary.column_end) == (18, 32)
    assert primary.is_primary and primary.label is not None and "expected `i64`" in primary.label
    # Summaries ("aborting due to", "For more information") are not diagnostics, but stay readable.
    assert len(parsed.diagnostics) == 1
    assert "aborting due to 1 previous error" in parsed.rendered
    assert "--> main.rs:3:18" in parsed.rendered
    assert not parsed.metadata_emitted and not parsed.link_emitted


def test_spans_past_the_users_code_are_labelled_as_the_harness() -> None:
    # The user's 3 lines define no `run`; rustc points at the harness's call (line 20 of the file).
    parsed = parse_compiler_output((FIXTURES / "rustc_missing_run.jsonl").read_text(), user_lines=3)
    (error,) = parsed.errors
    assert error.message == "cannot find function `run` in this scope"
    (span,) = error.spans
    assert span.file_name == HARNESS_FILE
    assert span.line_start == 20 - 3  # counted from the harness's own first line


def test_artifact_notices_mark_the_stages_and_other_text_is_kept() -> None:
    stderr = "\n".join(
        [
            json.dumps({"$message_type": "artifact", "artifact": "./libmain.rmeta", "emit": "metadata"}),
            "sh: 1: something odd",
            json.dumps({"$message_type": "artifact", "artifact": "./main", "emit": "link"}),
            "{not json",
        ]
    )
    parsed = parse_compiler_output(stderr, user_lines=1)
    assert parsed.metadata_emitted and parsed.link_emitted
    assert parsed.diagnostics == []
    assert parsed.rendered == "sh: 1: something odd\n{not json\n"


def test_metadata_notice_is_recognised_only_as_a_real_json_notice() -> None:
    notice = json.dumps({"$message_type": "artifact", "artifact": "./libmain.rmeta", "emit": "metadata"})
    assert is_metadata_notice(notice)
    assert not is_metadata_notice(notice.replace("metadata", "link"))
    # A diagnostic whose text mentions the notice is escaped JSON inside a message, not a notice.
    diagnostic = json.dumps({"$message_type": "diagnostic", "message": notice, "level": "error"})
    assert not is_metadata_notice(diagnostic)
    assert not is_metadata_notice('"emit":"metadata" "artifact"')
