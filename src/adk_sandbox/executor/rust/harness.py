"""The user's Rust source: validation (no ``fn main``, no crate attributes) and the harness around it.

Validation works on a *blanked* copy of the source: comments, string literals (raw, byte and C strings
included) and char literals are replaced by spaces, newlines kept, so ``"fn main"`` inside a string or a
comment is not mistaken for code and every position still refers to the user's text.

The harness is appended **after** the user's code, so the user's line and column numbers are the ones
rustc reports (items in Rust may appear in any order); spans past the user's last line belong to the
harness and are labelled so by the diagnostics parser.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "HARNESS",
    "SOURCE_FILE",
    "HarnessedSource",
    "blank_comments_and_literals",
    "validation_error",
    "wrap_in_harness",
]

SOURCE_FILE = "main.rs"
"""The file name rustc compiles (relative to its working directory), as it appears in diagnostics."""

HARNESS = """
// ---- adk-sandbox harness: not part of the submitted code ----
// `Value` through a glob re-export: a user's own `use serde_json::Value;` (or type named Value)
// shadows it instead of clashing with it.
#[allow(unused_imports)]
use __adk_harness::*;
#[allow(unused_imports)]
mod __adk_harness {
    pub use serde_json::Value;
}
fn main() {
    use std::io::{Read, Write};
    let mut raw = String::new();
    // Empty, unreadable or invalid input is null.
    let _ = std::io::stdin().read_to_string(&mut raw);
    let input: serde_json::Value = serde_json::from_str(&raw).unwrap_or(serde_json::Value::Null);
    let output = serde_json::to_string(&run(input)).expect("the value returned by run() is not JSON");
    let mut stdout = std::io::stdout().lock();
    // A newline first, so the result is a line of its own even after a print! without one.
    let _ = write!(stdout, "\\n{output}\\n");
    let _ = stdout.flush();
}
"""
"""Appended to the user's code: imports ``Value`` and defines ``main``, which reads stdin as JSON, calls
``run`` and prints the compact JSON result as the last stdout line (preceded by a newline)."""

# Blanks code[start:end] in the output copy.
_Blank = Callable[[int, int], None]

_IDENT_CHAR = re.compile(r"[A-Za-z0-9_]")
_RAW_STRING_START = re.compile(r'(?:br|cr|r)(#*)"')
_FN_MAIN = re.compile(r"\bfn\s+(?:r#)?main\b")
_CRATE_ATTRIBUTE = re.compile(r"#\s*!\s*\[")


@dataclass(frozen=True)
class HarnessedSource:
    """The complete program rustc compiles, and where the user's part ends."""

    text: str
    """User code, a newline, then :data:`HARNESS`."""
    user_lines: int
    """Lines ``1..user_lines`` are the user's code, later ones the harness's."""


def wrap_in_harness(code: str) -> HarnessedSource:
    """Return the program to compile: ``code`` unchanged (so its line numbers hold), then the harness."""
    user_lines = code.count("\n") + (0 if code.endswith("\n") else 1)
    separator = "" if code.endswith("\n") else "\n"
    return HarnessedSource(text=code + separator + HARNESS, user_lines=user_lines)


def validation_error(code: str) -> str | None:
    """Why ``code`` is refused before compiling, or None if it may be compiled.

    Refused: a top-level ``fn main`` (the harness defines ``main``) and crate attributes ``#![...]`` (they
    could change how the whole crate is built: ``no_std``, ``no_main``, features). Only the top level
    (brace depth 0) counts: a ``fn main`` nested in a function or module does not clash with the harness,
    and an inner attribute inside a block is not a crate attribute.
    """
    blanked = blank_comments_and_literals(code)
    depth = 0
    line = 1
    position = 0
    while position < len(blanked):
        char = blanked[position]
        if char == "\n":
            line += 1
        elif char == "{":
            depth += 1
        elif char == "}":
            depth = max(0, depth - 1)
        elif depth == 0 and _FN_MAIN.match(blanked, position) and _starts_word(blanked, position):
            return (
                f"line {line}: the code must not define `fn main`; the harness provides main(), which "
                "parses stdin as JSON and calls your `fn run(input: Value) -> Value`"
            )
        elif depth == 0 and char == "#" and _CRATE_ATTRIBUTE.match(blanked, position):
            return (
                f"line {line}: crate attributes (`#![...]`) are not allowed; the harness decides how the "
                "crate is built. Use item attributes (`#[...]`) instead"
            )
        position += 1
    return None


def _starts_word(text: str, position: int) -> bool:
    return position == 0 or not _IDENT_CHAR.match(text[position - 1])


def blank_comments_and_literals(code: str) -> str:
    r"""Replace comments and string/char literals by spaces, keeping newlines (and so every position).

    Understands what Rust's lexer does: nested block comments, escapes in strings, raw strings
    ``r#"..."#`` with any number of ``#``, byte strings (``b"..."``, ``br"..."``), C strings, byte and char
    literals (``'x'``, ``'\n'``, ``'\u{1F600}'``, ``b'x'``) as opposed to lifetimes and labels (``'a``,
    ``'static``), and raw identifiers (``r#main`` is the identifier ``main``, left in place).
    Unterminated comments or literals blank to the end: rustc rejects such code anyway.
    """
    out = list(code)
    length = len(code)
    i = 0

    def blank(start: int, end: int) -> None:
        for k in range(start, min(end, length)):
            if out[k] != "\n":
                out[k] = " "

    while i < length:
        char = code[i]
        nxt = code[i + 1] if i + 1 < length else ""
        if char == "/" and nxt == "/":
            end = code.find("\n", i)
            end = length if end == -1 else end
            blank(i, end)
            i = end
        elif char == "/" and nxt == "*":
            end = _block_comment_end(code, i)
            blank(i, end)
            i = end
        elif char in "rbc" and (i == 0 or not _IDENT_CHAR.match(code[i - 1])):
            i = _prefixed_literal(code, i, blank)
        elif char == '"':
            end = _quoted_end(code, i + 1, '"')
            blank(i, end)
            i = end
        elif char == "'":
            char_end = _char_literal_end(code, i)
            if char_end is None:
                i += 1  # a lifetime or label: code, not a literal
            else:
                blank(i, char_end)
                i = char_end
        else:
            i += 1
    return "".join(out)


def _prefixed_literal(code: str, start: int, blank: _Blank) -> int:
    """Blank a raw, byte or C string / byte literal starting at ``start``; return where scanning resumes."""
    raw = _RAW_STRING_START.match(code, start)
    if raw is not None:
        closing = '"' + raw.group(1)
        end = code.find(closing, raw.end())
        end = len(code) if end == -1 else end + len(closing)
        blank(start, end)
        return end
    prefix = code[start]
    nxt = code[start + 1] if start + 1 < len(code) else ""
    if prefix in "bc" and nxt == '"':
        end = _quoted_end(code, start + 2, '"')
        blank(start, end)
        return end
    if prefix == "b" and nxt == "'":
        byte_end = _char_literal_end(code, start + 1)
        if byte_end is not None:
            blank(start, byte_end)
            return byte_end
    # An identifier starting with r/b/c (or a raw identifier r#name): skip the whole word.
    end = start + 1
    while end < len(code) and (_IDENT_CHAR.match(code[end]) or (code[end] == "#" and end == start + 1)):
        end += 1
    return end


def _block_comment_end(code: str, start: int) -> int:
    """End (exclusive) of the block comment opening at ``start``; block comments nest in Rust."""
    depth = 0
    i = start
    while i < len(code) - 1:
        pair = code[i : i + 2]
        if pair == "/*":
            depth += 1
            i += 2
        elif pair == "*/":
            depth -= 1
            i += 2
            if depth == 0:
                return i
        else:
            i += 1
    return len(code)


def _quoted_end(code: str, i: int, quote: str) -> int:
    """End (exclusive) of a literal whose body starts at ``i`` and ends at an unescaped ``quote``."""
    while i < len(code):
        if code[i] == "\\":
            i += 2
        elif code[i] == quote:
            return i + 1
        else:
            i += 1
    return len(code)


def _char_literal_end(code: str, start: int) -> int | None:
    """End (exclusive) of the char literal at ``start`` (a quote), or None if it is a lifetime/label."""
    if start + 1 >= len(code):
        return None
    if code[start + 1] == "\\":
        return _quoted_end(code, start + 1, "'")
    # 'x' is a char; 'x... without a closing quote right after one character is a lifetime or label.
    if start + 2 < len(code) and code[start + 2] == "'" and code[start + 1] != "\n":
        return start + 3
    return None
