"""The one sync-to-async bridge: every tool runs its blocking work through :func:`run_blocking`.

``executor`` is synchronous (SPEC §1) and the tools are awaited from an agent's event loop, so each tool
call hands its blocking work to a thread. Two properties decide how, and ``asyncio.to_thread`` has
neither:

* **A thread of its own per call, not the loop's default executor.** That executor has a handful of
  workers (``min(32, cpus + 4)``: six on a 2-core machine); six long ``bash`` or ``sandbox_exec`` calls
  would hold all of them, and a ``read_file`` issued meanwhile would wait for one of them to end. A
  thread start costs about 0.1 ms (docs/DESIGN.md has the numbers), a command at least a millisecond.
* **Cancellation waits for the kill.** Cancelling the awaiting task sets the call's ``threading.Event``
  (every backend kills the execution's whole process tree when it is set) and then waits, bounded by
  :data:`CANCEL_WAIT_SECONDS`, for the call to return, so when ``CancelledError`` reaches the caller the
  process tree is already gone. ``to_thread`` raises at once and leaves the command running behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["CANCEL_WAIT_SECONDS", "run_blocking"]

T = TypeVar("T")

CANCEL_WAIT_SECONDS = 30.0
"""How long a cancelled call is waited for before ``CancelledError`` is raised anyway.

A backend normally returns within milliseconds of its cancel event (a Docker session within about a
second: it kills inside the container); the bound only keeps a broken backend from holding a cancelled
task forever. Past it the call is left to finish in its (daemon) thread, and a warning is logged.
"""

log = logging.getLogger(__name__)


async def run_blocking(
    call: Callable[[threading.Event], T],
    *,
    cancel: threading.Event | None = None,
    name: str = "adk-sandbox-call",
    cancel_wait: float = CANCEL_WAIT_SECONDS,
) -> T:
    """Run ``call(cancel)`` in a new thread and return its result (or raise its exception).

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

    def work() -> None:
        try:
            result = call(event)
        except BaseException as exc:  # handed to the awaiting task, which re-raises it
            post(None, exc)
        else:
            post(result, None)

    threading.Thread(target=work, name=name, daemon=True).start()
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
