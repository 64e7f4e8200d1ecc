"""The one sync-to-async bridge (``adk_sandbox.executor._bridge.run_blocking``): pure logic with plain
blocking calls.

The real kills on cancellation (``sandbox_exec``, ``code_exec``, ``bash`` on a ProcessBackend) are in
``tests/integration/test_tool_bridge.py``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import signal
import threading
import time

import pytest

from adk_sandbox.executor._bridge import run_blocking


def test_the_result_and_the_exception_of_the_call_reach_the_caller() -> None:
    assert asyncio.run(run_blocking(lambda cancel: 42)) == 42

    def fails(cancel: threading.Event) -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        asyncio.run(run_blocking(fails))


def test_the_call_runs_in_a_thread_of_its_own_not_the_default_executor() -> None:
    """A default executor whose only worker is busy does not delay the call."""
    release = threading.Event()

    async def main() -> tuple[str, float]:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=1))
        busy = loop.run_in_executor(None, release.wait, 10)
        started = time.monotonic()
        name = await run_blocking(lambda cancel: threading.current_thread().name, name="adk-sandbox-probe")
        elapsed = time.monotonic() - started
        release.set()
        await busy
        return name, elapsed

    name, elapsed = asyncio.run(main())
    assert name == "adk-sandbox-probe"
    assert elapsed < 1.0


def test_cancelling_sets_the_event_and_waits_until_the_call_has_returned() -> None:
    returned = threading.Event()

    def stops_slowly(cancel: threading.Event) -> str:
        assert cancel.wait(10), "the cancel event was never set"
        time.sleep(0.3)  # the kill takes a while: the caller must not see CancelledError before it ends
        returned.set()
        return "result after the cancel: discarded"

    async def main() -> None:
        task = asyncio.create_task(run_blocking(stops_slowly))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert returned.is_set()

    asyncio.run(main())


def test_repeated_cancels_still_wait_for_the_call() -> None:
    returned = threading.Event()

    def stops_slowly(cancel: threading.Event) -> None:
        cancel.wait(10)
        time.sleep(0.4)
        returned.set()

    async def main() -> None:
        task = asyncio.create_task(run_blocking(stops_slowly))
        await asyncio.sleep(0.05)
        for _ in range(5):
            task.cancel()
            await asyncio.sleep(0.05)
        with pytest.raises(asyncio.CancelledError):
            await task
        assert returned.is_set()

    asyncio.run(main())


def test_the_wait_after_a_cancel_is_bounded(caplog: pytest.LogCaptureFixture) -> None:
    def ignores_the_cancel(cancel: threading.Event) -> None:
        time.sleep(3)

    async def main() -> float:
        task = asyncio.create_task(run_blocking(ignores_the_cancel, name="stubborn", cancel_wait=0.2))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - started

    with caplog.at_level(logging.WARNING, logger="adk_sandbox.executor._bridge"):
        assert asyncio.run(main()) < 1.5
    assert "stubborn did not return within" in caplog.text


def test_a_caller_given_event_is_the_one_the_call_receives() -> None:
    mine = threading.Event()

    def call(cancel: threading.Event) -> bool:
        return cancel is mine

    assert asyncio.run(run_blocking(call, cancel=mine)) is True


def test_a_call_failing_after_a_cancel_raises_cancelled_not_its_error() -> None:
    def fails_when_cancelled(cancel: threading.Event) -> None:
        cancel.wait(10)
        raise RuntimeError("killed")

    async def main() -> None:
        task = asyncio.create_task(run_blocking(fails_when_cancelled))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_a_timeout_around_the_call_is_a_timeout_error_raised_after_the_call_returned() -> None:
    returned = threading.Event()

    def stops_slowly(cancel: threading.Event) -> None:
        cancel.wait(10)
        time.sleep(0.2)
        returned.set()

    async def main() -> None:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await run_blocking(stops_slowly)
        assert returned.is_set()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(run_blocking(stops_slowly), 0.1)

    asyncio.run(main())


def test_a_thread_idle_after_its_call_serves_the_next_call() -> None:
    """Consecutive calls reuse one thread (no thread start per call) and each sees its own name."""

    async def main() -> list[tuple[threading.Thread, str]]:
        seen = []
        for name in ("adk-sandbox-one", "adk-sandbox-two", "adk-sandbox-three"):
            seen.append(
                await run_blocking(
                    lambda cancel: (threading.current_thread(), threading.current_thread().name), name=name
                )
            )
        return seen

    seen = asyncio.run(main())
    assert seen[0][0] is seen[1][0] is seen[2][0]
    assert [name for _, name in seen] == ["adk-sandbox-one", "adk-sandbox-two", "adk-sandbox-three"]


def test_calls_at_the_same_time_never_share_a_thread() -> None:
    """With idle threads kept, a call still never waits for another one: each runs in a thread of its own."""
    both_in = threading.Barrier(2, timeout=5)

    def meets(cancel: threading.Event) -> threading.Thread:
        both_in.wait()  # a shared thread would run one call after the other: the barrier would time out
        return threading.current_thread()

    async def main() -> list[threading.Thread]:
        await run_blocking(lambda cancel: None)  # one idle thread exists
        return list(await asyncio.gather(run_blocking(meets), run_blocking(meets)))

    first, second = asyncio.run(main())
    assert first is not second


def test_a_forked_child_does_not_hand_calls_to_its_parents_idle_threads() -> None:
    """The parent's idle threads do not exist in a child: a call there starts a thread and returns."""
    asyncio.run(run_blocking(lambda cancel: None))  # this process now has an idle thread
    pid = os.fork()
    if pid == 0:  # the child: dies by SIGALRM if the call is handed to a thread that is not there
        signal.alarm(10)
        try:
            code = 0 if asyncio.run(run_blocking(lambda cancel: 7)) == 7 else 1
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status), f"the child's call hung (status {status:#x})"
    assert os.WEXITSTATUS(status) == 0
