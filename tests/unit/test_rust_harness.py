"""Validation of Rust snippets and the harness around them (pure logic, no compiler)."""

from __future__ import annotations

import pytest

from adk_sandbox.executor.rust.harness import (
    HARNESS,
    blank_comments_and_literals,
    validation_error,
    wrap_in_harness,
)

RUN = "fn run(input: Value) -> Value { input }\n"


@pytest.mark.parametrize(
    "code",
    [
        "fn main() {}\n" + RUN,
        RUN + "pub fn main() { }",
        RUN + "fn  main\n() {}",
        RUN + "fn r#main() {}",  # a raw identifier is the identifier `main`
        RUN + "/* a comment */ fn main() {}",
        RUN + 'const S: &str = "x"; fn main() {}',
        RUN + "const C: char = '\"'; fn main() {}",  # a char literal holding a quote ends where it should
        RUN + "fn f<'a>(x: &'a str) -> &'a str { x } fn main() {}",  # lifetimes are not char literals
        RUN + "const Q: char = '\\''; fn main() {}",
    ],
)
def test_fn_main_is_rejected(code: str) -> None:
    message = validation_error(code)
    assert message is not None and "fn main" in message


@pytest.mark.parametrize(
    "code",
    [
        "#![no_std]\n" + RUN,
        "#![allow(dead_code)]\n" + RUN,
        "# ! [feature(never_type)]\n" + RUN,
        RUN + "/* */ #![no_main]",
    ],
)
def test_crate_attributes_are_rejected(code: str) -> None:
    message = validation_error(code)
    assert message is not None and "#![" in message


@pytest.mark.parametrize(
    "code",
    [
        RUN + '// fn main() {}\nconst A: &str = "fn main() {}";',
        RUN + "/* outer /* nested fn main() */ still a comment: fn main() */",
        RUN + 'const R: &str = r#"raw "fn main" #![no_std]"#;',
        RUN + 'const R: &str = r##"contains "# and fn main"##;',
        RUN + 'const B: &[u8] = b"fn main"; const BR: &[u8] = br#"fn main"#;',
        RUN + 'const E: &str = "escaped \\" fn main() \\\\";',
        RUN + "const C: char = '#'; const D: u8 = b'!';",
        RUN + "#[allow(dead_code)]\nfn main_helper() {}\nfn not_main() {}",
        RUN + "fn outer() { fn main() {} #![allow(unused)] }",  # not the crate's main / attributes
        RUN + "mod inner { pub fn main() {} }",
        RUN + "fn labels() { 'outer: loop { break 'outer; } }",
    ],
)
def test_look_alikes_in_strings_comments_and_nested_items_are_accepted(code: str) -> None:
    assert validation_error(code) is None


def test_rejection_names_the_line() -> None:
    message = validation_error("// one\n/* two\n */\nfn main() {}\n")
    assert message is not None and message.startswith("line 4:")


def test_blanking_keeps_positions_and_newlines() -> None:
    code = 'let s = "a\nb"; // c\nlet r = r#"x"#; /* d\n e */ let c = \'z\';'
    blanked = blank_comments_and_literals(code)
    assert len(blanked) == len(code)
    assert [i for i, ch in enumerate(blanked) if ch == "\n"] == [i for i, ch in enumerate(code) if ch == "\n"]
    assert "let s =" in blanked and "let r =" in blanked and "let c =" in blanked
    for gone in ('"a', "c\n", "x", "d", "z"):
        assert gone not in blanked


def test_unterminated_comment_blanks_to_the_end() -> None:
    assert validation_error(RUN + "/* never closed fn main() {}") is None


def test_harness_follows_the_user_code_so_line_numbers_hold() -> None:
    code = "fn run(input: Value) -> Value {\n    input\n}"
    wrapped = wrap_in_harness(code)
    assert wrapped.text.startswith(code + "\n")
    assert wrapped.user_lines == 3
    assert wrapped.text.endswith(HARNESS)
    # With or without a final newline the user's part has the same number of lines.
    assert wrap_in_harness(code + "\n").user_lines == 3
    assert wrap_in_harness(code + "\n").text == wrapped.text


def test_harness_defines_main_and_reads_stdin_as_json() -> None:
    assert "fn main()" in HARNESS
    assert "serde_json::from_str(&raw).unwrap_or(serde_json::Value::Null)" in HARNESS
    assert "run(input)" in HARNESS
    # The newline printed before the result keeps it on a line of its own after a print! without one.
    assert 'write!(stdout, "\\n{output}\\n")' in HARNESS
