"""write_file: create or replace a file, creating its parent directories."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from adk_sandbox.devtools.errors import InvalidArgumentsError, ReadOnlyError
from adk_sandbox.devtools.tools._common import PathText, ToolArgs, ToolText
from adk_sandbox.devtools.workspace import Workspace

__all__ = ["DESCRIPTION", "WriteFileArgs", "encode_content", "write_file"]

DESCRIPTION = (
    "Create or overwrite a file of the workspace with `content` (UTF-8), creating missing parent "
    "directories. The file counts as read afterwards, so edit_file can change it."
)


class WriteFileArgs(ToolArgs):
    """Arguments of write_file."""

    path: PathText = Field(
        description="File to write, relative to the workspace root (or absolute inside it)."
    )
    content: ToolText = Field(description="The complete new content of the file.")


def encode_content(text: str, field: str) -> bytes:
    """UTF-8 bytes of ``text``; a lone surrogate (possible in JSON) is an argument error."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgumentsError(
            f"argument '{field}' is not valid Unicode text (lone surrogate at position {exc.start})"
        ) from None


def write_file(ws: Workspace, args: WriteFileArgs) -> dict[str, Any]:
    """Run write_file (blocking)."""
    if not ws.writable:
        raise ReadOnlyError("write_file")
    data = encode_content(args.content, "content")
    located = ws.locate_file(args.path, create_dirs=True)
    try:
        real, info = ws.replace_file(located, data, args.path)
    except BaseException:
        located.rollback()  # a failed write leaves no parent directories behind either
        raise
    finally:
        located.close()
    ws.mark_read(real, info)
    return {
        "path": args.path,
        "bytes_written": len(data),
        "message": f"wrote {len(data)} bytes to '{args.path}'",
    }
