"""read_file: numbered lines of a UTF-8 text file."""

from __future__ import annotations

import codecs
import os
from typing import Annotated, Any

from pydantic import Field

from adk_sandbox.devtools.errors import BinaryFileError
from adk_sandbox.devtools.tools._common import MAX_LINE_CHARS, PathText, ToolArgs, is_binary
from adk_sandbox.devtools.workspace import Workspace

__all__ = ["DEFAULT_READ_LIMIT", "DESCRIPTION", "ReadFileArgs", "read_file"]

DEFAULT_READ_LIMIT = 2000
"""Lines returned when the call gives no ``limit``."""

DESCRIPTION = (
    "Read a UTF-8 text file of the workspace. Returns numbered lines (number, tab, text), starting at "
    f"`offset` (1-based, default 1), at most `limit` lines (default {DEFAULT_READ_LIMIT}); lines longer than "
    f"{MAX_LINE_CHARS} characters are cut. `total_lines` is the file's real line count; `truncated` says "
    "the content does not show the whole file. A file must be read before edit_file can change it."
)


class ReadFileArgs(ToolArgs):
    """Arguments of read_file."""

    path: PathText = Field(
        description="File to read, relative to the workspace root (or absolute inside it)."
    )
    offset: Annotated[int, Field(ge=1, description="First line to return (1-based).")] = 1
    limit: Annotated[int, Field(ge=1, description="Most lines to return.")] = DEFAULT_READ_LIMIT


def read_file(ws: Workspace, args: ReadFileArgs) -> dict[str, Any]:
    """Run read_file (blocking)."""
    fd, info, real = ws.open_regular(args.path)
    try:
        scan = _LineWindow(args.offset - 1, args.limit)
        scan.read(fd, args.path)
    finally:
        os.close(fd)
    parts = []
    for number, line in enumerate(scan.window, start=args.offset):
        parts.append(f"{number:>6}\t{line[:MAX_LINE_CHARS]}\n")
    # The stamp is the fstat taken before reading: a change during the read makes the next edit stale.
    ws.mark_read(real, info)
    return {
        "path": args.path,
        "content": "".join(parts),
        "total_lines": scan.total,
        "returned_lines": len(scan.window),
        "truncated": scan.cut or args.offset - 1 + len(scan.window) < scan.total,
    }


class _LineWindow:
    r"""One streaming pass over a file: every line counted, only the requested window kept.

    Each kept line is cut to ``MAX_LINE_CHARS + 1`` characters, so memory stays bounded however large the
    file (the sandbox can write gigabytes into the workspace; reading them must not take the host's
    memory). Only ``\n`` ends a line; a final newline does not start another one.
    """

    def __init__(self, start: int, limit: int) -> None:
        self.start = start
        self.end = start + limit
        self.window: list[str] = []
        self.total = 0  # complete lines seen so far
        self.cut = False
        self._pending = ""  # the current partial line (kept only when it belongs to the window)
        self._pending_chars = 0
        self._consumed = 0  # bytes decoded so far, for the offset in an error message

    def read(self, fd: int, path: str) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")("strict")
        first = True
        while True:
            chunk = os.read(fd, _CHUNK)
            if first and is_binary(chunk):
                raise BinaryFileError(
                    f"file '{path}' looks binary (a NUL byte in its first 8 KiB); read_file only shows text"
                )
            first = False
            try:
                text = decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as exc:
                at = self._consumed + exc.start
                raise BinaryFileError(
                    f"file '{path}' is not valid UTF-8 (invalid byte at offset {at}); read_file only shows "
                    "UTF-8 text"
                ) from None
            self._consumed += len(chunk)
            if not chunk:
                break
            self._feed(text)
        if self._pending_chars:
            self._complete(self._pending)

    def _feed(self, text: str) -> None:
        newlines = text.count("\n")
        if self.total >= self.end or self.total + newlines < self.start:
            # Nothing in this text belongs to the window: count its lines without splitting them.
            self.total += newlines
            tail = len(text) - text.rfind("\n") - 1 if newlines else len(text)
            self._pending = ""
            self._pending_chars = tail if newlines else self._pending_chars + tail
            return
        *complete, rest = text.split("\n")
        for part in complete:
            self._complete(self._pending + part)
            self._pending, self._pending_chars = "", 0
        self._pending_chars += len(rest)
        if self.start <= self.total < self.end:
            self._pending = (self._pending + rest)[: MAX_LINE_CHARS + 1]

    def _complete(self, line: str) -> None:
        if self.start <= self.total < self.end:
            self.cut = self.cut or len(line) > MAX_LINE_CHARS
            self.window.append(line[: MAX_LINE_CHARS + 1])
        self.total += 1


_CHUNK = 1024 * 1024
