"""What several tools share: argument-model base, argument text types, text limits, the contained walk."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Annotated

from pydantic import BaseModel, ConfigDict

from adk_sandbox.executor.tool_protocol import text_rules

__all__ = [
    "BINARY_SNIFF_BYTES",
    "MAX_GLOB_PATTERN_CHARS",
    "MAX_LINE_CHARS",
    "MAX_PATH_ARGUMENT_CHARS",
    "MAX_REGEX_CHARS",
    "SKIP_DIRS",
    "CommandText",
    "GlobText",
    "PathText",
    "RegexText",
    "ToolArgs",
    "ToolText",
    "is_binary",
    "read_all",
    "walk_files",
]

MAX_LINE_CHARS = 2000
"""Longest line read_file and grep show; longer lines are cut."""

BINARY_SNIFF_BYTES = 8192
"""A NUL byte in this many leading bytes marks a file as binary."""

SKIP_DIRS = frozenset(
    {
        ".git", ".hg", ".svn", ".bzr", "target", "node_modules", ".venv", "dist", "build",
        "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".tox", ".nox", ".eggs",
    }
)  # fmt: skip
"""Build, dependency and VCS directories glob and grep never descend into (unless asked to start there)."""

MAX_PATH_ARGUMENT_CHARS = 8192
"""Longest path argument the argument model passes on to the workspace.

The real limit is the workspace's: 4095 bytes (PATH_MAX less its NUL), and 255 per name, each an
``InvalidPathError``. But the workspace's refusals quote the path, so a megabyte of path (with a NUL byte,
say) would come back as a megabyte of message; twice the limit is refused here first, without quoting."""

MAX_GLOB_PATTERN_CHARS = 4096
"""Longest glob pattern: no path is longer, and wcmatch compiles in time quadratic in the length (a
megabyte of pattern took a minute)."""

MAX_REGEX_CHARS = 16384
"""Longest grep pattern: compiling takes time superlinear in the length (a 10 MB literal took 40 s)."""

ToolText = Annotated[str, text_rules()]
"""Text that may hold any character but a lone surrogate (file content, edit strings): NUL bytes pass."""

CommandText = Annotated[str, text_rules(nul="a shell command")]
"""A ``sh -c`` command line: no NUL byte (an argv string ends at one), no lone surrogate."""

PathText = Annotated[
    str,
    text_rules(max_chars=MAX_PATH_ARGUMENT_CHARS, kind="a path", limit="4095 bytes", pass_surrogates=True),
]
"""A path: only a gross length is checked here; NUL bytes, lone surrogates and the exact limits are the
workspace's ``InvalidPathError``, where every path is checked, whichever way it arrives."""

GlobText = Annotated[
    str, text_rules(nul="a file name", max_chars=MAX_GLOB_PATTERN_CHARS, kind="a glob pattern")
]
"""A glob pattern: matches file names, which cannot hold a NUL byte."""

RegexText = Annotated[str, text_rules(max_chars=MAX_REGEX_CHARS, kind="a regular expression")]
"""A grep pattern: may search for NUL (files past their first 8 KiB may hold one), not a lone surrogate."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class ToolArgs(BaseModel):
    """Base of every tool's argument model: unknown fields are an error, not silently ignored."""

    model_config = ConfigDict(extra="forbid")


def is_binary(data: bytes) -> bool:
    """True when ``data`` has a NUL byte in its first :data:`BINARY_SNIFF_BYTES`."""
    return b"\0" in data[:BINARY_SNIFF_BYTES]


def read_all(fd: int, size_hint: int) -> bytes:
    """Read ``fd`` to its end (``size_hint`` from fstat sizes the first read)."""
    chunks = []
    want = max(size_hint, 0) + 1  # one byte more, to see the end without a second large read
    while True:
        chunk = os.read(fd, want)
        chunks.append(chunk)
        if len(chunk) < want:  # a short read of a regular file is its end: no extra read(2) per file
            break
        want = 1 << 20
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def walk_files(
    top_fd: int, top_rel: str, *, max_depth: int | None = None
) -> Iterator[tuple[int, str, str, bool]]:
    """Yield ``(dir_fd, name, rel, is_symlink)`` for every non-directory entry below ``top_fd``.

    Containment by construction: every directory is opened relative to its parent's descriptor with
    ``O_NOFOLLOW``, so the walk never passes through a symlink (one swapped in mid-walk makes that open
    fail, and the directory is skipped). Entries come sorted by name per directory; directories named in
    :data:`SKIP_DIRS` are not entered; ``max_depth`` limits how many directory levels are entered.
    ``rel`` is ``top_rel`` joined with the entry's path below the top. ``dir_fd`` is only valid until the
    next item.
    """
    yield from _visit(top_fd, top_rel, 0, max_depth)


def _visit(fd: int, rel: str, depth: int, max_depth: int | None) -> Iterator[tuple[int, str, str, bool]]:
    try:
        with os.scandir(fd) as scan:
            entries = sorted(scan, key=lambda entry: entry.name)
    except OSError:
        return  # unreadable directory: nothing to list
    for entry in entries:
        entry_rel = f"{rel}/{entry.name}" if rel else entry.name
        if entry.is_dir(follow_symlinks=False):
            if entry.name in SKIP_DIRS or (max_depth is not None and depth >= max_depth):
                continue
            try:
                sub = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue  # vanished, unreadable, or replaced by a symlink since the listing
            try:
                yield from _visit(sub, entry_rel, depth + 1, max_depth)
            finally:
                os.close(sub)
        else:
            yield fd, entry.name, entry_rel, entry.is_symlink()
