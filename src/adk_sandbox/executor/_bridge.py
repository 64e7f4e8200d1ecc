"""The one sync-to-async bridge: every tool runs its blocking work through :func:`run_blocking`.

Each call gets a thread of its own (an idle one kept from an earlier call, at most :data:`IDLE_THREADS`
for :data:`IDLE_SECONDS`), never the loop's default executor, and cancelling the awaiting task waits for
the kill (at most :data:`CANCEL_WAIT_SECONDS`). See docs/DESIGN.md, section "One sync-to-async bridge".
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["CANCEL_WAIT_SECONDS", "IDLE_SECONDS", "IDLE_THREADS", "run_blocking"]

T = TypeVar("T")

CANCEL_WAIT_SECONDS = 30.0
"""How long a cancelled call is waited for before ``CancelledError`` is raised anyway.

A backend normally returns within milliseconds of its cancel event (a Docker session within about a
second: it kills inside the container); the bound only keeps a broken backend from holding a cancelled
task forever. Past it the call is left to finish in its (daemon) thread, and a warning is logged.
"""

IDLE_THREADS = 8
"""How many threads, idle after a call, are kept for the next calls (more idle ones end at once)."""

IDLE_SECONDS = 30.0
"""How long an idle thread waits for its next call before it ends."""

log = logging.getLogger(__name__)

# A job runs the call and returns the delivery of its outcome, made once the thread is idle again.
_Job = tuple[Callable[[], Callable[[], None]], str]

# The inboxes of idle threads, the most recently idle last (it is taken first: its stack is warm).
_idle: list[queue.SimpleQueue[_Job]] = []
_idle_lock = threading.Lock()


def _forget_idle_threads() -> None:
    # A forked child has none of its parent's threads: a job handed to one of their inboxes would never run.
    global _idle_lock  # noqa: PLW0603 - the parent's lock may have been held by a thread that is gone
    _idle_lock = threading.Lock()
    _idle.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_idle_threads)


def _start(job: Callable[[], Callable[[], None]], name: str) -> None:
    """Run ``job`` in a thread doing nothing else: an idle one named ``name`` for now, or a new one."""
    with _idle_lock:
        inbox = _idle.pop() if _idle else None
    if inbox is not None:
        inbox.put((job, name))
        return
    inbox = queue.SimpleQueue()
    inbox.put((job, name))
    threading.Thread(target=_serve, args=(inbox,), name=name, daemon=True).start()


def _serve(inbox: queue.SimpleQueue[_Job]) -> None:
    thread = threading.current_thread()
    while True:
        job, thread.name = inbox.get()
        deliver = job()  # never raises: run_blocking's work() returns the hand-over of every outcome
        del job  # the call's closure (and its result) is not kept alive by an idle thread
        thread.name = "adk-sandbox-idle"
        # Idle *before* the outcome is handed over: the awaiting task's next call, which may come at once,
        # then finds this thread (its job waits in the inbox until the loop below comes back for it).
        with _idle_lock:
            keep = len(_idle) < IDLE_THREADS
            if keep:
                _idle.append(inbox)
        deliver()
        del deliver
        if not keep:
            return
        try:
            inbox.put(inbox.get(timeout=IDLE_SECONDS))  # back in, for the get at the top of the loop
        except queue.Empty:
            with _idle_lock:
                if inbox in _idle:  # nobody took this thread meanwhile: it ends
                    _idle.remove(inbox)
                    return
            # Taken just as the wait ended: its job is on the way (the get at the top waits for it).


async def run_blocking(
    call: Callable[[threading.Event], T],
    *,
    cancel: threading.Event | None = None,
    name: str = "adk-sandbox-call",
    cancel_wait: float = CANCEL_WAIT_SECONDS,
) -> T:
    """Run ``call(cancel)`` in a thread of its own and return its result (or raise its exception).

    ``call`` receives ``cancel``, a ``threading.Event`` (a new one unless given: a caller may also set it
    itself, e.g. when nobody listens to the output any more); a call that starts an execution passes it
    to ``SandboxBackend.execute``, others may ignore it. When the awaiting task is cancelled the event is
    set and the call is waited for (at most ``cancel_wait`` seconds, repeated cancellations included)
    before ``CancelledError`` propagates: what the call started has been stopped by then. A result or
    exception the call produces after the cancel is discarded.
    """
    loop = asyncio.get_running_loop()
    event = cancel if cancel is not None else threading.Event()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]  # None only with an error

    def post(result: T | None, error: BaseException | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody awaits the result any more
            loop.call_soon_threadsafe(settle, result, error)

    def work() -> Callable[[], None]:
        try:
            result = call(event)
        except BaseException as exc:  # handed to the awaiting task, which re-raises it
            return functools.partial(post, None, exc)
        return functools.partial(post, result, None)

    _start(work, name)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        event.set()
        await _wait_for_stop(future, cancel_wait, name)
        raise


async def _wait_for_stop(future: asyncio.Future[Any], timeout: float, name: str) -> None:
    """Wait until the cancelled call has returned, at most ``timeout`` seconds, whatever cancels arrive."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not future.done():
        remaining = deadline - loop.time()
        if remaining <= 0:
            log.warning(
                "%s did not return within %.0f s of its cancel; not waiting for it any longer", name, timeout
            )
            return
        try:
            await asyncio.wait([future], timeout=remaining)
        except asyncio.CancelledError:
            continue  # cancelled again while stopping: the command must still be dead before we return
    if not future.cancelled():
        future.exception()  # retrieved, so asyncio does not report it as never retrieved
