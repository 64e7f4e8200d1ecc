"""An MCP server over stdio for the project's tools (extra ``mcp``; started by ``adk-sandbox mcp``).

Every ``AgentTool`` becomes one MCP tool (its schema unchanged, every call through ``call_tool``) on the
SDK's low-level ``Server`` (:func:`build_server`); :func:`serve` runs it until stdin closes or
SIGTERM/SIGHUP; :func:`workspace_tools` builds the tools ``adk-sandbox mcp`` serves and owns what they open.
See docs/INTEGRATIONS.md, section "MCP".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server

from adk_sandbox.devtools.toolset import DevToolset
from adk_sandbox.devtools.workspace import Workspace
from adk_sandbox.executor.errors import InvalidRequestError
from adk_sandbox.executor.tool_protocol import (
    AgentTool,
    ProgressCallback,
    UnknownToolError,
    call_tool,
    find_tool,
)
from adk_sandbox.executor.types import Stream

if TYPE_CHECKING:
    from adk_sandbox.executor.backends.factory import BackendConfig

__all__ = [
    "MAX_MESSAGE_BYTES",
    "SERVER_NAME",
    "build_server",
    "list_tools",
    "main",
    "run_server",
    "serve",
    "tool_result",
    "workspace_tools",
]

_log = logging.getLogger(__name__)

SERVER_NAME = "adk-sandbox"
"""The name the server reports in ``serverInfo``."""

_SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # a host stopping its server, a terminal closing


def list_tools(tools: Sequence[AgentTool]) -> list[types.Tool]:
    """The MCP tool definitions: name, description and the tool's JSON schema as ``inputSchema``, as is."""
    return [types.Tool(name=t.name, description=t.description, input_schema=t.parameters) for t in tools]


def tool_result(ok: bool, payload: dict[str, Any]) -> types.CallToolResult:
    """A call's MCP result: ``payload`` as JSON text and as ``structuredContent``; ``isError`` if not ok."""
    text = json.dumps(payload, ensure_ascii=False)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=payload, is_error=not ok
    )


def _progress_sender(ctx: ServerRequestContext[Any]) -> ProgressCallback | None:
    """A callback sending each output chunk as a progress notification, or None without a progressToken."""
    if not ctx.meta or ctx.meta.get("progress_token") is None:
        return None  # the client asked for no progress: the output is not even collected for it
    sent = 0
    broken = False

    async def send(stream: Stream, chunk: str) -> None:
        nonlocal sent, broken
        if broken or not chunk:
            return  # an empty chunk would repeat a progress value (it must increase)
        sent += 1
        try:
            # report_progress addresses the request's own token (and its stream on HTTP transports).
            await ctx.session.report_progress(sent, None, chunk)
        except Exception:
            # The client went away mid-command: the command still finishes (or is cancelled with the
            # request), its output stays in the result; only the live copy is given up.
            broken = True
            _log.warning("sending progress for a tool call failed; no more progress for it", exc_info=True)

    return send


def build_server(tools: Sequence[AgentTool], *, instructions: str | None = None) -> Server[Any]:
    """A low-level MCP server listing ``tools`` and calling them through ``call_tool``.

    An unknown tool name is a tool error result (``isError``) naming the available tools, so the model
    can correct itself, as with a bad argument.
    """
    definitions = list_tools(tools)

    async def on_list_tools(
        _ctx: ServerRequestContext[Any], _params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=definitions)

    async def on_call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        try:
            tool = find_tool(tools, params.name)
        except UnknownToolError as exc:
            return tool_result(False, {"status": "error", "message": str(exc)})
        # Missing arguments are an empty object, which the tool's own validation then judges.
        outcome = await call_tool(tool, params.arguments or {}, _progress_sender(ctx))
        return tool_result(outcome.ok, outcome.payload)

    return Server(
        SERVER_NAME,
        version=_version(),
        instructions=instructions,
        on_list_tools=on_list_tools,
        on_call_tool=on_call_tool,
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415 - only when serving

    try:
        return version("adk-sandbox")
    except PackageNotFoundError:
        return ""


async def serve(server: Server[Any]) -> int | None:
    """Serve ``server`` over this process's stdin/stdout until the client closes stdin.

    SIGTERM and SIGHUP end it the same way (the running calls are cancelled, which kills their
    commands); returns the signal number that ended it, or None when stdin closed.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None  # noqa: S101 - always inside a task when awaited
    received: list[int] = []

    def stop(signum: int) -> None:
        if not received:
            received.append(signum)
            task.cancel()

    previous = {signum: signal.getsignal(signum) for signum in _SHUTDOWN_SIGNALS}
    for signum in _SHUTDOWN_SIGNALS:
        loop.add_signal_handler(signum, stop, signum)
    try:
        async with contextlib.AsyncExitStack() as stack:
            stdin = await stack.enter_async_context(_stdin_lines())
            streams = await stack.enter_async_context(stdio_server(stdin=cast("Any", stdin)))
            read_stream, write_stream = streams
            await server.run(read_stream, write_stream, server.create_initialization_options())
    except asyncio.CancelledError:
        if not received:
            raise
    finally:
        for signum, handler in previous.items():
            loop.remove_signal_handler(signum)  # which leaves SIG_DFL: put back the caller's handler
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
    return received[0] if received else None


MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""The longest line (one JSON-RPC message) read from stdin; a longer one is answered as a parse error."""


class _StdinLines:
    """The lines of stdin for the SDK's ``stdio_server``, read by the event loop rather than a thread.

    The SDK's own reader blocks a worker thread in ``readline``, and cancelling waits for that thread:
    a SIGTERM while the host keeps stdin open would hang the server with its container running.
    """

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    def __aiter__(self) -> _StdinLines:
        return self

    async def __anext__(self) -> str:
        try:
            line = await self._reader.readline()
        except ValueError:  # longer than MAX_MESSAGE_BYTES: the reader dropped it
            return "{}"  # not a JSON-RPC message: the SDK reports it and reads on
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", errors="replace")


@contextlib.asynccontextmanager
async def _stdin_lines() -> AsyncIterator[_StdinLines | None]:
    """Standard input as :class:`_StdinLines`, fd 0 pointed at the null device meanwhile (as the SDK does).

    None when stdin is not a pipe, socket or terminal (a regular file: its reads end, the SDK's
    reader is fine).
    """
    loop = asyncio.get_running_loop()
    wire = os.dup(0)
    reader = asyncio.StreamReader(limit=MAX_MESSAGE_BYTES)
    try:
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(wire, "rb", buffering=0)
        )
    except ValueError:
        os.close(wire)
        yield None
        return
    # Nothing else in this process may read the wire; a stray reader would tear messages.
    null = os.open(os.devnull, os.O_RDONLY)
    saved = os.dup(0)
    os.dup2(null, 0)
    os.close(null)
    try:
        yield _StdinLines(reader)
    finally:
        transport.close()
        os.dup2(saved, 0)
        os.close(saved)


@contextlib.contextmanager
def workspace_tools(
    root: str | os.PathLike[str],
    *,
    config: BackendConfig | None = None,
    read_only: bool = False,
    code_exec: bool = False,
) -> Iterator[list[AgentTool]]:
    """The tools ``adk-sandbox mcp`` serves for ``root``, and everything they open closed on exit.

    Writable (default): read_file, glob, grep, write_file, edit_file, bash, sandbox_exec, and ``terminal``
    where the session opens terminals (:mod:`adk_sandbox.executor.terminal_tool`). The three share one
    session with ``root`` mounted (one container or VM, started here so a broken engine or image fails the
    start, not the first call); file tools work on the host through the workspace's containment.
    ``config`` is any backend's config (:data:`~.backends.factory.BackendConfig`;
    default: Docker's) and makes the sandbox (image, limits, and its ``network``: a NetworkPolicy,
    ``--allow-host``, lets commands reach the names it allows through the sandbox's proxy); on a remote
    engine the workspace travels as a mirror.
    ``read_only``: read_file, glob and grep only, and no container at all: a server for exploring is given
    nothing that writes, and a command could write. ``code_exec`` adds the Rust tool on its own backend,
    the same settings with the image ``adk-sandbox/rust`` (a backend without images refuses it).
    """
    from adk_sandbox.executor.backends.docker import DockerConfig  # noqa: PLC0415 - docker-py loads lazily
    from adk_sandbox.executor.backends.docker.images import RUST_IMAGE  # noqa: PLC0415
    from adk_sandbox.executor.backends.factory import make_backend  # noqa: PLC0415
    from adk_sandbox.executor.terminal_tool import TerminalTool  # noqa: PLC0415
    from adk_sandbox.executor.tools import CodeTool, SandboxTool  # noqa: PLC0415

    settings = config or DockerConfig()
    if code_exec and "image" not in type(settings).model_fields:
        raise InvalidRequestError(f"code_exec runs the Rust image: the {settings.type} backend has no image")

    with contextlib.ExitStack() as stack:
        tools: list[AgentTool] = []
        if read_only:
            workspace = stack.enter_context(Workspace.read_only(root))
            tools += DevToolset(workspace).tools
        else:
            backend = stack.enter_context(make_backend(settings))
            workspace = stack.enter_context(Workspace(root, sandbox=backend))
            session, _in_root = workspace.bash_backend()  # starts the container now
            tools += DevToolset(workspace).tools
            # The workspace owns the session; the tool runs in it and closes nothing.
            tools.append(stack.enter_context(SandboxTool(session)))
            if getattr(session, "open_pty", None) is not None:  # a session on the agent channel
                tools.append(stack.enter_context(TerminalTool(session)))
        if code_exec:
            rust_settings = settings.model_copy(update={"image": RUST_IMAGE})
            rust = stack.enter_context(make_backend(rust_settings))
            tools.append(stack.enter_context(CodeTool(rust)))
        yield tools


def run_server(tools: Sequence[AgentTool], *, instructions: str | None = None) -> int | None:
    """Serve ``tools`` until stdin closes or a shutdown signal; the signal number, or None (blocking)."""
    return asyncio.run(serve(build_server(tools, instructions=instructions)))


class _Terminated(BaseException):
    """A shutdown signal while the tools are being opened (before the server's own handlers exist)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _ShutdownHandler:
    """The handler of :data:`_SHUTDOWN_SIGNALS` around the server (which has its own while it serves).

    While the tools open, the first signal unwinds the start like an error (removing a container that
    is starting); once the server has stopped, and after that first signal, signals are ignored: what
    follows is the cleanup that removes the containers, which a second signal must not cut short.
    """

    def __init__(self) -> None:
        self.closing = False

    def __call__(self, signum: int, _frame: object) -> None:
        if self.closing:
            return
        self.closing = True
        raise _Terminated(signum)


def main(
    root: str | os.PathLike[str],
    *,
    config: BackendConfig | None = None,
    read_only: bool = False,
    code_exec: bool = False,
) -> int:
    """``adk-sandbox mcp``: open the tools of :func:`workspace_tools`, serve them, close them; exit status.

    0 when the client closed stdin, 128+N after signal N; a signal while the container starts also
    removes it (the signal unwinds the start like an error).
    """
    handler = _ShutdownHandler()
    previous = {signum: signal.signal(signum, handler) for signum in _SHUTDOWN_SIGNALS}
    try:
        with workspace_tools(root, config=config, read_only=read_only, code_exec=code_exec) as tools:
            mode = "read-only" if read_only else "writable"
            _log.info("serving %s over stdio (%s workspace %s)", ", ".join(t.name for t in tools), mode, root)
            signum = run_server(tools)
            handler.closing = True  # leaving the block removes the containers
    except _Terminated as exc:
        signum = exc.signum
    finally:
        for number, before in previous.items():
            signal.signal(number, before)
    return 0 if signum is None else 128 + signum
