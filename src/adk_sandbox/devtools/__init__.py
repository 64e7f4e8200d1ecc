r"""adk-sandbox devtools: a contained workspace and the six agent tools on top of :mod:`adk_sandbox.executor`.

>>> import asyncio, tempfile
>>> from devtools import DevToolset, Workspace
>>> with Workspace(tempfile.mkdtemp()) as ws:
...     tools = DevToolset(ws)
...     _ = asyncio.run(tools.run("write_file", {"path": "a.txt", "content": "hi\n"}))
...     asyncio.run(tools.run("read_file", {"path": "a.txt"}))["content"]
'     1\thi\n'

File tools run on the host and open everything through a descriptor of the root (see docs/DEVTOOLS.md);
``bash`` runs through the workspace's sandbox backend.
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
