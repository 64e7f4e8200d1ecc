"""bash: a shell command in the workspace root, through the workspace's sandbox backend, streamed."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from pydantic import Field

from devtools.errors import BashDisabledError
from devtools.tools._common import ToolArgs
from devtools.workspace import Workspace
from executor import ExecRequest, ExecResult, IsolationClass, Language, SandboxBackend, Stream

__all__ = ["DESCRIPTION", "BashArgs", "ProgressCallback", "bash"]

ProgressCallback = Callable[[Stream, str], "Awaitable[None] | None"]
"""``on_progress(stream, chunk)``: whole lines of output while a command runs, on the event loop.

A plain function is called; a coroutine function is awaited. Calls are made one at a time, in order.
"""

DESCRIPTION = (
    "Run a shell command (`sh -c`) in the workspace root and return its exit code, stdout and stderr. "
    "`timeout_secs` is capped by the workspace's limit; on timeout the whole process tree is killed and "
    "the output so far is returned with `timed_out: true`. Output is capped per stream (`truncated`). "
    "The environment holds only a few allowlisted variables."
)


class BashArgs(ToolArgs):
    """Arguments of bash."""

    command: str = Field(min_length=1, description="The command line, run with `sh -c`.")
    timeout_secs: Annotated[float, Field(gt=0)] | None = Field(
        default=None,
        description="Seconds before the command is killed (default and ceiling: the workspace's).",
    )


async def bash(ws: Workspace, args: BashArgs, on_progress: ProgressCallback | None = None) -> dict[str, Any]:
    """Run bash.

    Cancelling the awaiting task kills the command's process tree, delivers the output so far to
    ``on_progress``, and then re-raises ``CancelledError``.
    """
    if not ws.allow_bash:
        raise BashDisabledError
    # Blocking: a container session may start here, and its capabilities decide the environment.
    backend, starts_in_root, env = await asyncio.to_thread(_prepare, ws)
    timeout = min(args.timeout_secs or ws.bash_timeout, ws.bash_timeout)
    request = ExecRequest(
        language=Language.COMMAND,
        code=args.command if starts_in_root else ws.bash_prefix() + args.command,
        timeout=timeout,
        env=env,
        max_output_bytes=ws.max_output_bytes,
    )
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

    # A thread of its own rather than the loop's default executor: a few long commands must not use up
    # the executor's workers that the file tools (asyncio.to_thread) need meanwhile.
    worker: asyncio.Future[tuple[ExecResult, IsolationClass]] = loop.create_future()

    def work() -> None:
        try:
            outcome = (backend.execute(request, on_output, cancel=cancel), backend.isolation())
        except BaseException as exc:  # handed to the awaiting task, which re-raises it
            loop.call_soon_threadsafe(_settle, worker, None, exc)
        else:
            loop.call_soon_threadsafe(_settle, worker, outcome, None)

    threading.Thread(target=work, name="adk-sandbox-bash", daemon=True).start()
    cancelled = False
    while True:
        try:
            result, isolation = await asyncio.shield(worker)
            break
        except asyncio.CancelledError:
            if worker.done() and not worker.cancelled():
                result, isolation = worker.result()
                cancelled = True
                break
            # The awaiting task was cancelled: kill the command, then wait for the backend to return.
            cancel.set()
            cancelled = True
    if pump is not None:
        queue.put_nowait(None)  # every chunk was queued before the worker's result arrived
        await pump
    if cancelled:
        raise asyncio.CancelledError
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


def _prepare(ws: Workspace) -> tuple[SandboxBackend, bool, dict[str, str]]:
    backend, starts_in_root = ws.bash_backend()
    return backend, starts_in_root, ws.command_env(backend)


def _settle(
    future: asyncio.Future[tuple[ExecResult, IsolationClass]],
    outcome: tuple[ExecResult, IsolationClass] | None,
    error: BaseException | None,
) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    elif outcome is not None:
        future.set_result(outcome)


def _stop_on_failure(task: asyncio.Task[None], cancel: threading.Event) -> None:
    if not task.cancelled() and task.exception() is not None:
        cancel.set()


async def _pump(queue: asyncio.Queue[tuple[Stream, str] | None], on_progress: ProgressCallback) -> None:
    while (item := await queue.get()) is not None:
        outcome = on_progress(*item)
        if inspect.isawaitable(outcome):
            await outcome
