"""Unit tests of the shared language-to-argv table (pure logic; the forms run in integration tests)."""

from __future__ import annotations

import pytest

from adk_sandbox.executor._languages import (
    LANGUAGES,
    MAX_ARGUMENT_BYTES,
    MAX_INLINE_CODE_BYTES,
    check_argument_sizes,
    inline_argv,
)
from adk_sandbox.executor.errors import InvalidRequestError
from adk_sandbox.executor.types import Language


def test_every_program_language_is_in_the_table() -> None:
    assert set(LANGUAGES) == {Language.COMMAND, Language.PYTHON, Language.JAVASCRIPT, Language.RUST}
    assert LANGUAGES[Language.COMMAND].source_file is None
    assert {
        LANGUAGES[lang].source_file for lang in (Language.PYTHON, Language.JAVASCRIPT, Language.RUST)
    } == {
        "main.py",
        "main.js",
        "main.rs",
    }


@pytest.mark.parametrize(
    ("language", "expected"),
    [
        (Language.COMMAND, ("/bin/sh", "-c", "--", "echo hi")),
        (Language.PYTHON, ("python3", "-c", "echo hi")),
        (Language.JAVASCRIPT, ("node", "-e", "echo hi")),
    ],
)
def test_small_code_is_one_argument(language: Language, expected: tuple[str, ...]) -> None:
    assert inline_argv(language, "echo hi") == expected


def test_the_program_can_be_a_resolved_path() -> None:
    assert inline_argv(Language.COMMAND, "true", "/usr/bin/dash")[0] == "/usr/bin/dash"


@pytest.mark.parametrize("language", [Language.COMMAND, Language.PYTHON, Language.JAVASCRIPT, Language.RUST])
@pytest.mark.parametrize("char", ["x", "é", "😀"])
def test_long_code_travels_in_pieces_that_each_fit(language: Language, char: str) -> None:
    code = char * (300 * 1024 // len(char.encode()))
    argv = inline_argv(language, code)
    assert all(len(arg.encode()) <= MAX_ARGUMENT_BYTES for arg in argv)
    # After the program, its flag and the joining prelude: sh and the Rust script take a $0 first.
    first_piece = 4 if language in (Language.COMMAND, Language.RUST) else 3
    assert "".join(argv[first_piece:]) == code


def test_code_over_the_inline_limit_is_refused_with_a_hint() -> None:
    with pytest.raises(InvalidRequestError, match="write it to a file"):
        inline_argv(Language.COMMAND, "x" * (MAX_INLINE_CODE_BYTES + 1))


@pytest.mark.parametrize("language", [Language.TYPESCRIPT, Language.WASM])
def test_languages_without_a_program_are_refused(language: Language) -> None:
    with pytest.raises(InvalidRequestError):
        inline_argv(language, "x")


def test_an_argument_over_linux_limit_is_refused_naming_it() -> None:
    check_argument_sizes(["cat", "x" * MAX_ARGUMENT_BYTES], "process")
    with pytest.raises(InvalidRequestError, match=r"argv\[1\] is 131072 bytes.*'process'.*stdin"):
        check_argument_sizes(["cat", "x" * (MAX_ARGUMENT_BYTES + 1)], "process")
