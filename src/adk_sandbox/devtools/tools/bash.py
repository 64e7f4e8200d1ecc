"""bash: a shell command in the workspace root, through the workspace's sandbox backend, streamed."""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BeforeValidator, Field
from pydantic_core import PydanticCustomError

from adk_sandbox.devtools.errors import BashDisabledError
from adk_sandbox.devtools.tools._common import CommandText, ToolArgs
from adk_sandbox.devtools.workspace import Workspace
from adk_sandbox.executor import ExecRequest, ExecResult, IsolationClass, Language, Stream
from adk_sandbox.executor._bridge import run_blocking
from adk_sandbox.executor.tool_protocol import ProgressCallback

__all__ = ["DESCRIPTION", "BashArgs", "ProgressCallback", "bash"]

DESCRIPTION = (
    "Run a shell command (`sh -c`) in the workspace root and return its exit code, stdout and stderr. "
    "`timeout_secs` is capped by the workspace's limit; on timeout the whole process tree is killed and "
    "the output so far is returned with `timed_out: true`. Output is capped per stream (`truncated`). "
    "The environment holds only a few allowlisted variables."
)


def _not_nan(value: object) -> object:
    # NaN fails every comparison, so `gt=0` alone would answer "should be greater than 0".
    if isinstance(value, float) and math.isnan(value):
        raise PydanticCustomError("nan_seconds", "is NaN, not a number of seconds; pass e.g. 60")
    return value


class BashArgs(ToolArgs):
    """Arguments of bash."""

    command: CommandText = Field(min_length=1, description="The command line, run with `sh -c`.")
    timeout_secs: Annotated[float, Field(gt=0), BeforeValidator(_not_nan)] | None = Field(
        default=None,
        description="Seconds before the command is killed (default and ceiling: the workspace's).",
    )


async def bash(ws: Workspace, args: BashArgs, on_progress: ProgressCallback | None = None) -> dict[str, Any]:
    """Run bash.

    The blocking part (opening the workspace's session, asking its capabilities, the command) runs in a
    thread of its own through ``adk_sandbox.executor``'s one bridge (``run_blocking``). Cancelling the
    awaiting task kills the command's process tree, waits until it is dead, delivers the output so far to
    ``on_progress``, and then re-raises ``CancelledError``.
    """
    if not ws.allow_bash:
        raise BashDisabledError
    loop = asyncio.get_running_loop()
    cancel = threading.Event()
    queue: asyncio.Queue[tuple[Stream, str] | None] = asyncio.Queue()
    pump: asyncio.Task[None] | None = None
    on_output: Callable[[Stream, str], None] | None = None
    if on_progress is not None:
        pump = asyncio.ensure_future(_pump(queue, on_progress))
        # A failing callback stops the command: nobody is watching it any more.
        pump.add_done_callback(lambda task: _stop_on_failure(task, cancel))

        def on_output(stream: Stream, chunk: str) -> None:  # from the backend's reader thread
            loop.call_soon_threadsafe(queue.put_nowait, (stream, chunk))

    def work(stop: threading.Event) -> tuple[ExecResult, IsolationClass]:
        # All of it blocks: a container session may start here, and its capabilities decide the env.
        backend, starts_in_root = ws.bash_backend()
        request = ExecRequest(
            language=Language.COMMAND,
            code=args.command if starts_in_root else ws.bash_prefix() + args.command,
            timeout=min(args.timeout_secs or ws.bash_timeout, ws.bash_timeout),
            env=ws.command_env(backend),
            max_output_bytes=ws.max_output_bytes,
        )
        return backend.execute(request, on_output, cancel=stop), backend.isolation()

    try:
        result, isolation = await run_blocking(work, cancel=cancel, name="adk-sandbox-bash")
    finally:
        if pump is not None:
            # Every chunk was queued before the call returned; on cancellation too, the output so far is
            # delivered before CancelledError goes on.
            queue.put_nowait(None)
            await pump
    return {
        "command": args.command,
        "exit_code": result.exit_code,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "truncated": result.stdout_truncated or result.stderr_truncated,
        "timed_out": result.timed_out,
        "duration_ms": result.duration_ms,
        "isolation": isolation.value,
    }


def _stop_on_failure(task: asyncio.Task[None], cancel: threading.Event) -> None:
    if not task.cancelled() and task.exception() is not None:
        cancel.set()


async def _pump(queue: asyncio.Queue[tuple[Stream, str] | None], on_progress: ProgressCallback) -> None:
    while (item := await queue.get()) is not None:
        outcome = on_progress(*item)
        if inspect.isawaitable(outcome):
            await outcome
