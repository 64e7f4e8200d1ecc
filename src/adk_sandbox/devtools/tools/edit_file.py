"""edit_file: exact string replacement in a file read before, written atomically."""

from __future__ import annotations

import os
import stat
from typing import Any

from pydantic import Field

from adk_sandbox.devtools.errors import (
    AmbiguousMatchError,
    BinaryFileError,
    InvalidArgumentsError,
    NoMatchError,
    NotReadError,
    NotRegularFileError,
    PathNotFoundError,
    ReadOnlyError,
)
from adk_sandbox.devtools.tools._common import PathText, ToolArgs, ToolText, read_all
from adk_sandbox.devtools.tools.write_file import encode_content
from adk_sandbox.devtools.workspace import Workspace, check_permitted

__all__ = ["DESCRIPTION", "EditFileArgs", "edit_file"]

DESCRIPTION = (
    "Replace `old_string` with `new_string` in a file (exact, case-sensitive match). The file must have "
    "been read with read_file (or written with write_file) first and not changed since. `old_string` must "
    "occur exactly once unless `replace_all` is true. The file is replaced atomically."
)


class EditFileArgs(ToolArgs):
    """Arguments of edit_file."""

    path: PathText = Field(
        description="File to edit, relative to the workspace root (or absolute inside it)."
    )
    old_string: ToolText = Field(min_length=1, description="The exact text to replace.")
    new_string: ToolText = Field(description="The text to put in its place.")
    replace_all: bool = Field(default=False, description="Replace every occurrence instead of exactly one.")


def edit_file(ws: Workspace, args: EditFileArgs) -> dict[str, Any]:
    """Run edit_file (blocking)."""
    if not ws.writable:
        raise ReadOnlyError("edit_file")
    if args.old_string == args.new_string:
        raise InvalidArgumentsError(
            "arguments 'old_string' and 'new_string' are identical; nothing would change"
        )
    located = ws.locate_file(args.path, create_dirs=False)
    try:
        if located.lstat is None:
            raise PathNotFoundError(f"path '{args.path}' does not exist")
        with ws.mapped_errors(args.path):
            fd = os.open(
                located.name,
                os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                dir_fd=located.dir_fd,
            )
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    raise NotRegularFileError(f"path '{args.path}' is not a regular file")
                check_permitted(info, "write", args.path)
                real = os.path.join(ws.real_path_of(located.dir_fd), located.name)
                if ws.read_stamp(real) is None:
                    raise NotReadError(args.path)
                ws.check_fresh(real, info, args.path)
                data = read_all(fd, info.st_size)
            finally:
                os.close(fd)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise BinaryFileError(
                f"file '{args.path}' is not valid UTF-8 text; edit_file cannot change it"
            ) from None
        count = text.count(args.old_string)
        if count == 0:
            raise NoMatchError(args.path)
        if count > 1 and not args.replace_all:
            raise AmbiguousMatchError(args.path, count)
        replaced = text.replace(args.old_string, args.new_string, -1 if args.replace_all else 1)
        real, new_info = ws.replace_file(located, encode_content(replaced, "new_string"), args.path)
    finally:
        located.close()
    ws.mark_read(real, new_info)
    done = count if args.replace_all else 1
    return {
        "path": args.path,
        "replacements": done,
        "message": f"replaced {done} occurrence{'s' if done != 1 else ''} in '{args.path}'",
    }
