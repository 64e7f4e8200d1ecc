"""grep: lines matching a regular expression, over the files of the workspace."""

from __future__ import annotations

import os
import stat
from typing import Any

import regex
from pydantic import Field

from adk_sandbox.devtools.errors import InvalidArgumentsError, PatternTimeoutError
from adk_sandbox.devtools.tools._common import (
    MAX_LINE_CHARS,
    GlobText,
    PathText,
    RegexText,
    ToolArgs,
    is_binary,
    read_all,
    walk_files,
)
from adk_sandbox.devtools.tools.glob import compile_glob
from adk_sandbox.devtools.workspace import Workspace

__all__ = [
    "DESCRIPTION",
    "MAX_GREP_FILE_BYTES",
    "MAX_GREP_MATCHES",
    "REGEX_TIMEOUT_SECONDS",
    "GrepArgs",
    "grep",
    "grep_lines",
]

MAX_GREP_MATCHES = 500
"""Most matching lines one grep call returns."""

MAX_GREP_FILE_BYTES = 5 * 1024 * 1024
"""Larger files are skipped."""

REGEX_TIMEOUT_SECONDS = 5.0
"""Longest one regular-expression search may run in one file before the grep is stopped with an error."""

DESCRIPTION = (
    "Search file contents with a regular expression (Python `regex` syntax). Returns matching lines as "
    f"`path:line: text`, paths relative to the workspace root, at most {MAX_GREP_MATCHES}. `path` limits "
    "the search to a file or directory; `glob` filters file names (e.g. `*.py`, or `src/**/*.rs` when it "
    "contains a '/'). Skips binary files, files over 5 MiB, symlinks and build/VCS directories."
)


class GrepArgs(ToolArgs):
    """Arguments of grep."""

    pattern: RegexText = Field(min_length=1, description="Regular expression to search for.")
    path: PathText | None = Field(
        default=None, description="File or directory to search (default: the root)."
    )
    glob: GlobText | None = Field(default=None, description="Only search files whose name matches this glob.")
    case_insensitive: bool = Field(default=False, description="Match regardless of case.")


def grep(ws: Workspace, args: GrepArgs) -> dict[str, Any]:
    """Run grep (blocking)."""
    matches, truncated = grep_lines(
        ws, args.pattern, args.path, args.glob, case_insensitive=args.case_insensitive, limit=MAX_GREP_MATCHES
    )
    return {"pattern": args.pattern, "matches": matches, "count": len(matches), "truncated": truncated}


def grep_lines(
    ws: Workspace,
    pattern: str,
    path: str | None = None,
    file_glob: str | None = None,
    *,
    case_insensitive: bool = False,
    limit: int | None = MAX_GREP_MATCHES,
) -> tuple[list[str], bool]:
    """Matching lines ``"rel:line: text"`` and whether more existed; ``limit=None`` returns all of them."""
    flags = regex.MULTILINE | (regex.IGNORECASE if case_insensitive else 0)
    try:
        compiled = regex.compile(pattern, flags)
    except regex.error as exc:
        raise InvalidArgumentsError(f"argument 'pattern' is not a valid regular expression: {exc}") from None
    except RecursionError:  # regex's parser recurses once per nested group
        raise InvalidArgumentsError(
            "argument 'pattern' is nested too deeply to compile (too many nested groups); simplify it"
        ) from None
    accept = _name_filter(file_glob)
    fd, info, start_rel = ws.open_entry(path or ".")
    searcher = _Searcher(compiled, pattern, limit, None if case_insensitive else _literal_bytes(pattern))
    try:
        if stat.S_ISREG(info.st_mode):
            searcher.search_fd(fd, info, start_rel)
            return searcher.matches, searcher.truncated
        for dir_fd, name, rel, is_link in walk_files(fd, "" if start_rel == "." else start_rel):
            if is_link or not accept(name, rel):
                continue
            try:
                file_fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
            except OSError:
                continue  # vanished, unreadable, or a special file that refuses a non-blocking open
            try:
                if not searcher.search_fd(file_fd, os.fstat(file_fd), rel):
                    break
            finally:
                os.close(file_fd)
    finally:
        os.close(fd)
    return searcher.matches, searcher.truncated


_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def _name_filter(file_glob: str | None) -> Any:
    if file_glob is None:
        return lambda name, rel: True
    if "/" in file_glob:
        matcher = compile_glob(file_glob, "glob")
        return lambda name, rel: matcher.match(rel)
    name_matcher = compile_glob(file_glob, "glob", fnmatch=True)
    return lambda name, rel: name_matcher.match(name)


_METACHARACTERS = frozenset(".^$*+?{}[]\\|()#")


def _literal_bytes(pattern: str) -> bytes | None:
    """The UTF-8 bytes of a pattern that is a plain literal, else None.

    A file whose bytes do not contain them cannot match, and ``bytes in`` is several times faster than
    decoding the file and running the regex engine over it. U+FFFD is excluded: it can match a decoded
    invalid byte that is not in the raw bytes.
    """
    if _METACHARACTERS.intersection(pattern) or "\ufffd" in pattern or pattern.isspace():
        return None
    return pattern.encode("utf-8")


class _Searcher:
    def __init__(
        self, compiled: regex.Pattern[str], pattern: str, limit: int | None, literal: bytes | None
    ) -> None:
        self.literal = literal
        self.compiled = compiled
        self.pattern = pattern
        self.limit = limit
        self.matches: list[str] = []
        self.truncated = False

    def search_fd(self, fd: int, info: os.stat_result, rel: str) -> bool:
        """Add the matching lines of one file; False once the limit is passed (stop searching)."""
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_GREP_FILE_BYTES:
            return True
        data = read_all(fd, info.st_size)
        if len(data) > MAX_GREP_FILE_BYTES or is_binary(data):
            return True
        if self.literal is not None and self.literal not in data:
            return True
        text = data.decode("utf-8", errors="replace")
        pos_limit = self.limit
        matches = self.matches
        counted_to = 0
        line = 1
        next_line = 0  # matches starting before this offset are on a line already reported
        try:
            for found in self.compiled.finditer(text, timeout=REGEX_TIMEOUT_SECONDS):
                at = found.start()
                if at < next_line:
                    continue  # one entry per line, however many matches it holds
                line += text.count("\n", counted_to, at)
                counted_to = at
                line_end = text.find("\n", at)
                if line_end == -1:
                    line_end = len(text)
                if pos_limit is not None and len(matches) >= pos_limit:
                    self.truncated = True
                    return False
                line_start = text.rfind("\n", 0, at) + 1
                matches.append(f"{rel}:{line}: {text[line_start:line_end][:MAX_LINE_CHARS]}")
                next_line = line_end + 1
        except TimeoutError:
            raise PatternTimeoutError(
                f"the regular expression '{self.pattern}' took longer than {REGEX_TIMEOUT_SECONDS:g} "
                f"seconds on '{rel}' and was stopped; simplify it (nested quantifiers such as (a|aa)+ "
                "backtrack catastrophically)"
            ) from None
        return True
