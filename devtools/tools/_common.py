"""What several tools share: argument-model base, text limits, the contained directory walk."""

from __future__ import annotations

import os
from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict

__all__ = [
    "BINARY_SNIFF_BYTES",
    "MAX_LINE_CHARS",
    "SKIP_DIRS",
    "ToolArgs",
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
