"""Errors of the workspace tools. Every message is written to be read by the model that called the tool.

Each error subclasses :class:`ToolError` (and the builtin it resembles, e.g. ``PermissionError``);
``ToolError``, ``UnknownToolError`` and ``InvalidArgumentsError`` are re-exported from
:mod:`adk_sandbox.executor.tool_protocol`. See docs/DEVTOOLS.md, section "Errors", for the tree.
"""

from __future__ import annotations

# The base and the two errors every tool shares live with the one tool protocol; re-exported here.
from adk_sandbox.executor.tool_protocol import InvalidArgumentsError, ToolError, UnknownToolError

__all__ = [
    "AmbiguousMatchError",
    "BashDisabledError",
    "BinaryFileError",
    "FilePermissionError",
    "InvalidArgumentsError",
    "InvalidPathError",
    "NoMatchError",
    "NotReadError",
    "NotRegularFileError",
    "PathEscapeError",
    "PathNotFoundError",
    "PatternTimeoutError",
    "ReadOnlyError",
    "StaleReadError",
    "ToolError",
    "UnknownToolError",
]


class PathEscapeError(ToolError, PermissionError):
    """The path, or a symbolic link on the way, leads outside the workspace root."""

    def __init__(self, path: str) -> None:
        super().__init__(f"path '{path}' escapes the workspace root")
        self.path = path


class InvalidPathError(ToolError, ValueError):
    """The path cannot name a file here: NUL byte, over-long name, dangling or looping symbolic link."""


class PathNotFoundError(ToolError, FileNotFoundError):
    """Nothing exists at the path."""


class NotRegularFileError(ToolError):
    """A directory, FIFO, socket or device where a regular file is needed (refused without blocking)."""


class BinaryFileError(ToolError, ValueError):
    """read_file refuses binary content (a NUL byte in the first 8 KiB) and text that is not UTF-8."""


class ReadOnlyError(ToolError, PermissionError):
    """A writing tool was called on a read-only workspace."""

    def __init__(self, tool: str) -> None:
        super().__init__(f"workspace is read-only; '{tool}' is not permitted")
        self.tool = tool


class FilePermissionError(ToolError, PermissionError):
    """The file's (or its directory's) permission bits deny the read or write; nothing was changed.

    A write never replaces a file its mode says the tools' user may not write, although the atomic
    rename would allow it (see docs/DEVTOOLS.md, "File permissions").
    """


class BashDisabledError(ToolError, PermissionError):
    """``bash`` was called on a workspace that does not allow it."""

    def __init__(self) -> None:
        super().__init__("bash execution is disabled for this workspace")


class NotReadError(ToolError):
    """edit_file on a file that was not read (or written) in this workspace first."""

    def __init__(self, path: str) -> None:
        super().__init__(f"file '{path}' must be read with read_file before it can be edited")
        self.path = path


class NoMatchError(ToolError):
    """edit_file: ``old_string`` does not occur in the file."""

    def __init__(self, path: str) -> None:
        super().__init__(f"no occurrence of the target string was found in '{path}'")
        self.path = path


class AmbiguousMatchError(ToolError):
    """edit_file: ``old_string`` occurs more than once and ``replace_all`` was not set."""

    def __init__(self, path: str, count: int) -> None:
        super().__init__(
            f"the target string occurs {count} times in '{path}'; pass replace_all=true or provide a more "
            "specific string"
        )
        self.path = path
        self.count = count


class StaleReadError(ToolError):
    """edit_file: the file changed on disk (size, mtime or inode) after it was last read."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"file '{path}' changed on disk after it was last read; read it again with read_file before "
            "editing it"
        )
        self.path = path


class PatternTimeoutError(ToolError, TimeoutError):
    """grep: the regular expression took too long (catastrophic backtracking) and was stopped."""
