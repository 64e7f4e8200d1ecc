"""adk-sandbox devtools: a contained workspace and the six agent tools on top of :mod:`adk_sandbox.executor`.

:class:`Workspace` and :class:`DevToolset`: file tools run on the host and open everything through a
descriptor of the root; ``bash`` runs through the workspace's sandbox backend. Framework adapters live in
:mod:`adk_sandbox.devtools.adapters`. Depth: docs/DEVTOOLS.md.
"""

from adk_sandbox.devtools.errors import (
    AmbiguousMatchError,
    BashDisabledError,
    BinaryFileError,
    FilePermissionError,
    InvalidArgumentsError,
    InvalidPathError,
    NoMatchError,
    NotReadError,
    NotRegularFileError,
    PathEscapeError,
    PathNotFoundError,
    PatternTimeoutError,
    ReadOnlyError,
    StaleReadError,
    ToolError,
    UnknownToolError,
)
from adk_sandbox.devtools.tools.bash import ProgressCallback
from adk_sandbox.devtools.toolset import DevToolset, Tool
from adk_sandbox.devtools.workspace import DEFAULT_ENV_ALLOWLIST, SessionFactory, Workspace

__all__ = [
    "DEFAULT_ENV_ALLOWLIST",
    "AmbiguousMatchError",
    "BashDisabledError",
    "BinaryFileError",
    "DevToolset",
    "FilePermissionError",
    "InvalidArgumentsError",
    "InvalidPathError",
    "NoMatchError",
    "NotReadError",
    "NotRegularFileError",
    "PathEscapeError",
    "PathNotFoundError",
    "PatternTimeoutError",
    "ProgressCallback",
    "ReadOnlyError",
    "SessionFactory",
    "StaleReadError",
    "Tool",
    "ToolError",
    "UnknownToolError",
    "Workspace",
]
