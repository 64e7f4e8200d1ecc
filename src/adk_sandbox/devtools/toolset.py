"""DevToolset: the tools a workspace permits, with JSON schemas, run from an event loop."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from adk_sandbox.devtools.errors import BashDisabledError, ReadOnlyError
from adk_sandbox.devtools.tools import bash as bash_tool
from adk_sandbox.devtools.tools import edit_file as edit_tool
from adk_sandbox.devtools.tools import glob as glob_tool
from adk_sandbox.devtools.tools import grep as grep_tool
from adk_sandbox.devtools.tools import read_file as read_tool
from adk_sandbox.devtools.tools import write_file as write_tool
from adk_sandbox.devtools.tools._common import ToolArgs
from adk_sandbox.devtools.workspace import Workspace
from adk_sandbox.executor._bridge import run_blocking
from adk_sandbox.executor.tool_protocol import AgentTool, ProgressCallback, find_tool

__all__ = ["DevToolset", "Tool"]

_BlockingRunner = Callable[[Workspace, Any], dict[str, Any]]


class Tool(AgentTool):
    """One workspace tool, bound to its workspace: an :class:`~adk_sandbox.executor.tool_protocol.AgentTool`.

    ``await tool.run(arguments, on_progress)`` validates and runs it; failures raise a ``ToolError``.
    """

    def __init__(
        self, workspace: Workspace, name: str, description: str, args_model: type[ToolArgs],
        runner: _BlockingRunner | None,
    ) -> None:  # fmt: skip
        self.workspace = workspace
        self.name = name
        self.description = description
        self.args_model = args_model
        self._runner = runner  # None: bash, which streams and is async of its own

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"

    async def _run(self, arguments: Any, on_progress: ProgressCallback | None) -> dict[str, Any]:
        if self._runner is None:
            if not self.workspace.allow_bash:
                raise BashDisabledError
            return await bash_tool.bash(self.workspace, arguments, on_progress)
        if self.name in _WRITING and not self.workspace.writable:
            raise ReadOnlyError(self.name)
        run = self._runner
        # The same bridge as bash: a thread of its own, so long commands never delay a file tool. A
        # cancelled file tool is waited for (it takes no cancel event), so a write has finished or not
        # started when CancelledError arrives, never half-done behind the caller's back.
        workspace = self.workspace
        return await run_blocking(lambda _cancel: run(workspace, arguments), name=f"adk-sandbox-{self.name}")


_READ_TOOLS = (
    ("read_file", read_tool.DESCRIPTION, read_tool.ReadFileArgs, read_tool.read_file),
    ("glob", glob_tool.DESCRIPTION, glob_tool.GlobArgs, glob_tool.glob),
    ("grep", grep_tool.DESCRIPTION, grep_tool.GrepArgs, grep_tool.grep),
)
_WRITE_TOOLS = (
    ("write_file", write_tool.DESCRIPTION, write_tool.WriteFileArgs, write_tool.write_file),
    ("edit_file", edit_tool.DESCRIPTION, edit_tool.EditFileArgs, edit_tool.edit_file),
)
_BASH = ("bash", bash_tool.DESCRIPTION, bash_tool.BashArgs, None)
_WRITING = frozenset(name for name, *_ in _WRITE_TOOLS)


class DevToolset:
    """The tools a workspace permits, in a fixed order.

    read_file, glob, grep; then write_file, edit_file if the workspace is writable; then bash if allowed.
    Tools it does not permit are not listed, and are refused if called anyway. Each is a :class:`Tool`
    (an ``AgentTool``), what the adapters for agent frameworks take.
    """

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace
        every = {spec[0]: Tool(workspace, *spec) for spec in (*_READ_TOOLS, *_WRITE_TOOLS, _BASH)}
        names = [name for name, *_ in _READ_TOOLS]
        if workspace.writable:
            names += [name for name, *_ in _WRITE_TOOLS]
        if workspace.allow_bash:
            names.append("bash")
        self.tools: tuple[Tool, ...] = tuple(every[name] for name in names)
        self._every = every

    async def run(
        self, name: str, args: Mapping[str, Any], on_progress: ProgressCallback | None = None
    ) -> dict[str, Any]:
        """Validate ``args`` and run tool ``name``; returns its result dict, raises a ``ToolError``.

        Blocking work runs in a thread of its own per call (``adk_sandbox.executor``'s one bridge,
        ``run_blocking``).
        ``on_progress(stream, chunk)`` receives bash output while the command runs (other tools ignore it).
        """
        if name not in self._every:
            find_tool(self.tools, name)  # no tool at all: raises UnknownToolError naming the available ones
        # Refused before the arguments are read: a read-only workspace says so, whatever was passed.
        if name in _WRITING and not self.workspace.writable:
            raise ReadOnlyError(name)
        if name == "bash" and not self.workspace.allow_bash:
            raise BashDisabledError
        return await self._every[name].run(args, on_progress)
