"""The calls that run inside a session, and the hold that waits for them: :class:`CallGate`.

A snapshot, a fork, a pause and a checkpoint need the sandbox with no command or file operation running in
it: they hold the gate, which waits for the running calls (up to a limit, else refuses with nothing done)
and keeps new ones back until the hold ends. One place for this, above every engine
(:class:`~adk_sandbox.executor.channel.session.ChannelSession` counts its calls through it).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from adk_sandbox.executor.errors import InvalidRequestError

__all__ = ["CallGate"]


class CallGate:
    """Counts the calls running inside a session; :meth:`held` waits for them and keeps new ones back."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._running = 0
        self._holding = False
        self._hold = threading.Lock()  # one hold at a time (a snapshot and a pause of the same session)

    @contextlib.contextmanager
    def counted(self) -> Iterator[None]:
        """A call that runs inside: it waits while the gate is held, and is waited for by a hold."""
        with self._condition:
            while self._holding:
                self._condition.wait()
            self._running += 1
        try:
            yield
        finally:
            with self._condition:
                self._running -= 1
                self._condition.notify_all()

    @contextlib.contextmanager
    def held(self, wait_seconds: float, purpose: str) -> Iterator[None]:
        """No call runs inside (new ones wait); refused when running ones do not end in ``wait_seconds``.

        :class:`InvalidRequestError` says ``purpose`` ("a snapshot is taken") and that nothing was done.
        """
        with self._hold:
            deadline = time.monotonic() + wait_seconds
            with self._condition:
                self._holding = True
                try:
                    while self._running:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise InvalidRequestError(
                                f"{self._running} command(s) of this session still ran after "
                                f"{wait_seconds:g} s; {purpose} while none runs. Nothing was done: wait for "
                                "them (or give a larger wait_seconds)"
                            )
                        self._condition.wait(left)
                except BaseException:
                    self._holding = False
                    self._condition.notify_all()
                    raise
            try:
                yield
            finally:
                with self._condition:
                    self._holding = False
                    self._condition.notify_all()
