"""read_file: numbered lines of a UTF-8 text file."""

from __future__ import annotations

import os
from typing import Annotated, Any

from pydantic import Field

from devtools.errors import BinaryFileError
from devtools.tools._common import MAX_LINE_CHARS, ToolArgs, is_binary, read_all
from devtools.workspace import Workspace

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

    path: str = Field(description="File to read, relative to the workspace root (or absolute inside it).")
    offset: Annotated[int, Field(ge=1, description="First line to return (1-based).")] = 1
    limit: Annotated[int, Field(ge=1, description="Most lines to return.")] = DEFAULT_READ_LIMIT


def read_file(ws: Workspace, args: ReadFileArgs) -> dict[str, Any]:
    """Run read_file (blocking)."""
    fd, info, real = ws.open_regular(args.path)
    try:
        data = read_all(fd, info.st_size)
    finally:
        os.close(fd)
    if is_binary(data):
        raise BinaryFileError(
            f"file '{args.path}' looks binary (a NUL byte in its first 8 KiB); read_file only shows text"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BinaryFileError(
            f"file '{args.path}' is not valid UTF-8 (invalid byte at offset {exc.start}); read_file only "
            "shows UTF-8 text"
        ) from None
    # Only "\n" ends a line; a final newline does not start another one.
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    start = args.offset - 1
    window = lines[start : start + args.limit]
    parts = []
    cut = False
    for number, line in enumerate(window, start=args.offset):
        cut = cut or len(line) > MAX_LINE_CHARS
        parts.append(f"{number:>6}\t{line[:MAX_LINE_CHARS]}\n")
    # The stamp is the fstat taken before reading: a change during the read makes the next edit stale.
    ws.mark_read(real, info)
    return {
        "path": args.path,
        "content": "".join(parts),
        "total_lines": len(lines),
        "returned_lines": len(window),
        "truncated": cut or start + len(window) < len(lines),
    }
