"""DevToolset: the tools a workspace permits, with JSON schemas, run from an event loop."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from devtools.errors import BashDisabledError, InvalidArgumentsError, ReadOnlyError, UnknownToolError
from devtools.tools import bash as bash_tool
from devtools.tools import edit_file as edit_tool
from devtools.tools import glob as glob_tool
from devtools.tools import grep as grep_tool
from devtools.tools import read_file as read_tool
from devtools.tools import write_file as write_tool
from devtools.tools._common import ToolArgs
from devtools.tools.bash import ProgressCallback
from devtools.workspace import Workspace
from executor._bridge import run_blocking

__all__ = ["DevToolset", "Tool"]


@dataclass(frozen=True)
class Tool:
    """One tool as an agent framework sees it: name, description and the JSON schema of its arguments."""

    name: str
    description: str
    args_model: type[ToolArgs] = field(repr=False)
    parameters: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "parameters", self.args_model.model_json_schema())


_BlockingRunner = Callable[[Workspace, Any], dict[str, Any]]

_READ_TOOLS = (
    (Tool("read_file", read_tool.DESCRIPTION, read_tool.ReadFileArgs), read_tool.read_file),
    (Tool("glob", glob_tool.DESCRIPTION, glob_tool.GlobArgs), glob_tool.glob),
    (Tool("grep", grep_tool.DESCRIPTION, grep_tool.GrepArgs), grep_tool.grep),
)
_WRITE_TOOLS = (
    (Tool("write_file", write_tool.DESCRIPTION, write_tool.WriteFileArgs), write_tool.write_file),
    (Tool("edit_file", edit_tool.DESCRIPTION, edit_tool.EditFileArgs), edit_tool.edit_file),
)
_BASH = Tool("bash", bash_tool.DESCRIPTION, bash_tool.BashArgs)
_RUNNERS: dict[str, _BlockingRunner] = {tool.name: run for tool, run in (*_READ_TOOLS, *_WRITE_TOOLS)}
_ALL = {tool.name: tool for tool in (*(t for t, _ in _READ_TOOLS), *(t for t, _ in _WRITE_TOOLS), _BASH)}


class DevToolset:
    """The tools a workspace permits, in a fixed order.

    read_file, glob, grep; then write_file, edit_file if the workspace is writable; then bash if allowed.
    Tools it does not permit are not listed, and are refused if called anyway.
    """

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace
        tools = [tool for tool, _ in _READ_TOOLS]
        if workspace.writable:
            tools += [tool for tool, _ in _WRITE_TOOLS]
        if workspace.allow_bash:
            tools.append(_BASH)
        self.tools: tuple[Tool, ...] = tuple(tools)

    async def run(
        self, name: str, args: Mapping[str, Any], on_progress: ProgressCallback | None = None
    ) -> dict[str, Any]:
        """Validate ``args`` and run tool ``name``; returns its result dict, raises a ``ToolError``.

        Blocking work runs in a thread of its own per call (``executor``'s one bridge, ``run_blocking``).
        ``on_progress(stream, chunk)`` receives bash output while the command runs (other tools ignore it).
        """
        tool = _ALL.get(name)
        if tool is None:
            available = ", ".join(t.name for t in self.tools)
            raise UnknownToolError(f"unknown tool '{name}'; available tools: {available}")
        if name in ("write_file", "edit_file") and not self.workspace.writable:
            raise ReadOnlyError(name)
        if name == "bash" and not self.workspace.allow_bash:
            raise BashDisabledError
        parsed = validate_args(tool, args)
        if name == "bash":
            if not isinstance(parsed, bash_tool.BashArgs):  # pragma: no cover - the model is fixed above
                raise TypeError(parsed)
            return await bash_tool.bash(self.workspace, parsed, on_progress)
        run = _RUNNERS[name]
        # The same bridge as bash: a thread of its own, so long commands never delay a file tool. A
        # cancelled file tool is waited for (it takes no cancel event), so a write has finished or not
        # started when CancelledError arrives, never half-done behind the caller's back.
        return await run_blocking(lambda _cancel: run(self.workspace, parsed), name=f"adk-sandbox-{name}")


def validate_args(tool: Tool, args: object) -> ToolArgs:
    """Parse ``args`` with the tool's model; failures become one message naming each field and why."""
    if not isinstance(args, Mapping):
        raise InvalidArgumentsError(
            f"arguments for {tool.name} must be a JSON object, got {type(args).__name__}"
        )
    try:
        return tool.args_model.model_validate(dict(args))
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"]) or "(arguments)"
            if error["type"] == "missing":
                problems.append(f"missing required argument '{where}'")
            elif error["type"] == "extra_forbidden":
                problems.append(f"unknown argument '{where}'")
            else:
                problems.append(f"argument '{where}': {error['msg']}")
        accepted = ", ".join(tool.args_model.model_fields)
        raise InvalidArgumentsError(
            f"invalid arguments for {tool.name}: {'; '.join(problems)} (accepted arguments: {accepted})"
        ) from None
