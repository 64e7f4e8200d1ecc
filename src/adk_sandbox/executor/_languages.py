"""The one language-to-program table, shared by the host backends and the Docker session.

:class:`LanguageProgram` per language (program, source file, install hint), :func:`inline_argv` for
source on the argv, :data:`RUST_SCRIPT`, and Linux's argv limits (:data:`MAX_ARGUMENT_BYTES`).
See docs/DESIGN.md, section "Core types", "One language table".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from adk_sandbox.executor.errors import InvalidRequestError
from adk_sandbox.executor.types import ExecRequest, Language

__all__ = [
    "LANGUAGES",
    "MAX_ARGUMENT_BYTES",
    "MAX_INLINE_CODE_BYTES",
    "RUSTC_EDITION",
    "RUST_SCRIPT",
    "LanguageProgram",
    "check_argument_sizes",
    "inline_argv",
]

MAX_ARGUMENT_BYTES = 128 * 1024 - 1
"""Longest single argument (or ``NAME=value`` variable) ``execve`` accepts, NUL excluded (Linux's
``MAX_ARG_STRLEN``, 32 pages). It holds for every program started on Linux, in or out of a container."""

MAX_INLINE_CODE_BYTES = 1024 * 1024
"""Largest source text carried on an argv (in pieces of :data:`MAX_ARGUMENT_BYTES`). The whole argv and
environment of a program must fit in a quarter of its stack limit (2 MiB with the usual 8 MiB), so 1 MiB
leaves room for the environment; bigger code is refused with a hint to run it from a file."""

RUSTC_EDITION = "--edition=2021"
"""The edition every backend compiles Rust code with."""


@dataclass(frozen=True)
class LanguageProgram:
    """How one language is run: its program and where its source goes."""

    program: str
    """The bare name of the shell, interpreter or compiler (resolved on PATH by each backend)."""
    source_file: str | None
    """The file name the source is written to when a backend runs it from a file (None: ``sh -c``)."""
    install_hint: str
    """What to install when the program is missing."""


LANGUAGES: dict[Language, LanguageProgram] = {
    Language.COMMAND: LanguageProgram("sh", None, "install a POSIX shell (dash or bash)"),
    Language.PYTHON: LanguageProgram("python3", "main.py", "install Python 3 (`apt install python3`)"),
    Language.JAVASCRIPT: LanguageProgram("node", "main.js", "install Node.js (`apt install nodejs`)"),
    Language.RUST: LanguageProgram("rustc", "main.rs", "install Rust (`apt install rustc` or rustup)"),
}
"""Every language a real program runs; TypeScript and WASM have none (WASM runs in :mod:`wasmtime`)."""

RUST_SCRIPT = (
    'd=$(mktemp -d) || exit 1; printf %s "$@" > "$d/main.rs" && '
    f'rustc {RUSTC_EDITION} -o "$d/main" "$d/main.rs" && "$d/main"; rc=$?; rm -rf "$d"; exit $rc'
)
"""``sh -c RUST_SCRIPT rust PIECE...``: writes the source (its pieces, concatenated) to a fresh temporary
directory, compiles it, runs it and removes the build; compiler messages go to stderr."""

# The joining forms, used only when the code does not fit in one argument: the pieces follow as
# arguments and are concatenated before the code runs, in the same process.
# sh: with IFS set but empty, "$*" joins the parameters with no separator (POSIX); then IFS is restored
# to its default and the parameters are cleared, so the code sees what `sh -c` would give it.
_SH_JOIN = 'IFS=; adk_code="$*"; unset IFS; set --; eval "$adk_code"'
_PYTHON_JOIN = (
    "import sys; c = ''.join(sys.argv[1:]); del sys.argv[1:]; "
    "exec(compile(c, '<string>', 'exec'), {'__name__': '__main__', '__builtins__': __builtins__})"
)
_NODE_JOIN = 'const c = process.argv.slice(1).join(""); process.argv.splice(1); (0, eval)(c)'
# Characters per piece: at most 4 UTF-8 bytes each, so a piece never exceeds MAX_ARGUMENT_BYTES.
_PIECE_CHARS = MAX_ARGUMENT_BYTES // 4


def inline_argv(language: Language, code: str, program: str | None = None) -> tuple[str, ...]:
    """The argv that runs ``code`` with the source on the argv itself (no file): ``sh -c``, ``python3 -c``.

    ``program`` replaces the language's bare program name (a host backend passes the resolved path).
    Code longer than one argument may be travels in pieces joined by a small prelude in the same
    process; beyond :data:`MAX_INLINE_CODE_BYTES` it is refused with ``InvalidRequestError``. Raises
    ``InvalidRequestError`` for a language without a program (TypeScript, WASM).
    """
    if language not in LANGUAGES:
        raise InvalidRequestError(f"{language.value!r} code cannot be run as a program")
    size = len(code.encode())
    if size > MAX_INLINE_CODE_BYTES:
        raise InvalidRequestError(
            f"code is {size} bytes; at most {MAX_INLINE_CODE_BYTES} bytes of code can be passed to a "
            "program: write it to a file in the workspace and run the file"
        )
    fits = size <= MAX_ARGUMENT_BYTES
    pieces = (code,) if fits else tuple(code[i : i + _PIECE_CHARS] for i in range(0, len(code), _PIECE_CHARS))
    match language:
        case Language.COMMAND:
            shell = program or "/bin/sh"
            # "--": a command string starting with "-" is the command, not an option of sh.
            return (shell, "-c", "--", code) if fits else (shell, "-c", _SH_JOIN, shell, *pieces)
        case Language.PYTHON:
            python = program or LANGUAGES[language].program
            return (python, "-c", code) if fits else (python, "-c", _PYTHON_JOIN, *pieces)
        case Language.JAVASCRIPT:
            node = program or LANGUAGES[language].program
            return (node, "-e", code) if fits else (node, "-e", _NODE_JOIN, *pieces)
        case _:  # Language.RUST: compiled by a shell script
            return (program or "/bin/sh", "-c", RUST_SCRIPT, "rust", *pieces)


def check_argument_sizes(argv: Sequence[str], backend: str) -> None:
    """Refuse (``InvalidRequestError``) an argv with an argument Linux would reject (``E2BIG``)."""
    for index, arg in enumerate(argv):
        size = len(arg.encode())
        if size > MAX_ARGUMENT_BYTES:
            raise InvalidRequestError(
                f"argv[{index}] is {size} bytes; Linux accepts at most {MAX_ARGUMENT_BYTES} bytes per "
                f"argument on any backend (here {backend!r}): pass the data on stdin or in a file instead"
            )


def request_argv(request: ExecRequest, backend: str) -> tuple[str, ...]:
    """The program and arguments that run ``request`` in a sandbox that has the languages' programs on PATH.

    ``argv`` runs as given (each argument checked against Linux's limit); code travels on the argv
    (:func:`inline_argv`, in pieces when longer than one argument may be). One table for the container
    backends (Docker, Kubernetes); ``backend`` names the caller in errors.
    """
    if request.argv is not None:
        check_argument_sizes(request.argv, backend)
        return request.argv
    assert request.language is not None and request.code is not None  # noqa: S101 - ExecRequest checks
    if request.language not in LANGUAGES:
        raise InvalidRequestError(f"the {backend} backend cannot run {request.language.value!r} code")
    return inline_argv(request.language, request.code)
