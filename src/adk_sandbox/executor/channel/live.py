"""Programs that run while the caller talks to them, over the agent channel: :class:`Process` and its base.

A command of ``execute`` runs to its end while the host collects its capped output. A **live** program is
started and then written to and read from as it runs: ``session.spawn`` (:class:`Process`: stdin, stdout,
stderr) and ``session.open_pty`` (:class:`.terminal.Terminal`). Their output is **paced, not capped**
(RUN ``"paced"`` or ``"pty"``, :mod:`.frames`): the agent sends at most :data:`.frames.PTY_WINDOW` bytes
ahead of what the caller read, the reader returns CREDIT as it takes bytes, so a program nobody reads
stops only itself and the agent's one stream stays free for every other command. :class:`LiveChannel` is
that part, written once.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from adk_sandbox.executor.channel.frames import PTY_WINDOW, FrameType, encode
from adk_sandbox.executor.errors import InvalidRequestError, SandboxFailedError, validation_problems
from adk_sandbox.executor.types import ExecRequest

if TYPE_CHECKING:
    from adk_sandbox.executor.channel.agent_transport import _Agent, _Channel

__all__ = ["KEPT_BY_WAIT", "LiveChannel", "Process", "ProcessOutput", "live_request"]

#: Bytes of input per STDIN frame.
_WRITE_CHUNK = 64 * 1024
#: The reader returns CREDIT once it took this much (a quarter of the window: never a stall, few frames).
_CREDIT_EVERY = PTY_WINDOW // 4
#: How long :meth:`LiveChannel.close` waits for the agent to confirm the program's end.
_CLOSE_SECONDS = 5.0
#: Output :meth:`LiveChannel.wait` keeps for later reads (the last bytes of each stream).
KEPT_BY_WAIT = 1024 * 1024
_SEND_SECONDS = 10.0


def live_request(
    argv: list[str] | tuple[str, ...],
    *,
    user: str | None,
    cwd: str | None,
    env: dict[str, str],
    timeout: float,
    what: str,
) -> ExecRequest:
    """What a live program runs as, checked as a command's request; :class:`InvalidRequestError` if not."""
    try:
        return ExecRequest(argv=tuple(argv), user=user, cwd=cwd, env=env, timeout=timeout)
    except ValidationError as exc:
        problems = validation_problems(exc)
        raise InvalidRequestError(f"invalid {what} request: {problems}; nothing was started") from None


class LiveChannel:
    """A running program's channel: its paced output, its end, its close (see the module docstring).

    Thread-safe: one thread reads while others write. Use it as a context manager or :meth:`close` it.
    """

    def __init__(
        self,
        agent: _Agent,
        number: int,
        channel: _Channel,
        *,
        on_close: Callable[[Any], None] | None = None,
    ) -> None:
        self._agent = agent
        self._number = number
        self._channel = channel
        self._on_close = on_close
        self._read_lock = threading.Lock()
        #: Output taken from the channel, not yet returned (``wait`` keeps it here), by stream.
        self._pending = {"stdout": bytearray(), "stderr": bytearray()}
        self._taken = 0  # bytes taken since the last CREDIT
        self._exit: dict[str, Any] | None = None
        self._failure: str | None = None
        self._closed = False

    # -- state --------------------------------------------------------------------------------------------
    @property
    def exit_code(self) -> int | None:
        """The program's exit status once it ended (128 + N when signal N killed it); None while it runs."""
        body = self._exit
        if body is None:
            return None
        if body.get("exit_code") is not None:
            return int(body["exit_code"])
        return 128 + int(body["signal"]) if body.get("signal") is not None else None

    @property
    def timed_out(self) -> bool:
        """True when the program was killed at the end of its ``timeout``."""
        return bool(self._exit and self._exit.get("timed_out"))

    @property
    def running(self) -> bool:
        """True until the program's end was read (or it was closed)."""
        return self._exit is None and self._failure is None and not self._closed

    # -- input, output, end ---------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        """Send ``data`` to the program's input."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidRequestError(
                f"the program takes bytes, not {type(data).__name__}; encode text first"
            )
        self._check_open()
        data = bytes(data)
        frames = [encode(FrameType.STDIN, self._number, data[i : i + _WRITE_CHUNK])
                  for i in range(0, len(data), _WRITE_CHUNK)]  # fmt: skip
        if frames:
            self._agent.send(b"".join(frames), time.monotonic() + _SEND_SECONDS)

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the program's end; its exit status (see :attr:`exit_code`).

        Output that comes meanwhile is kept for later reads (the last :data:`KEPT_BY_WAIT` bytes of each
        stream). :class:`TimeoutError` when it still runs after ``timeout`` seconds.
        """
        until = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        with self._read_lock:
            while self._exit is None and self._failure is None:
                self._take(until, wait=True)
                for kept in self._pending.values():
                    del kept[: max(len(kept) - KEPT_BY_WAIT, 0)]
            if self._exit is None:
                raise SandboxFailedError(self._failure or "the program's channel ended")
        return self.exit_code

    def close(self) -> None:
        """End the program (its whole tree) if it still runs, and forget it; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._exit is None and self._failure is None:
                until = time.monotonic() + _CLOSE_SECONDS
                self._agent.send(encode(FrameType.KILL, self._number), until)
                with self._read_lock:
                    while self._exit is None and self._failure is None and time.monotonic() < until:
                        try:
                            self._take(until, wait=True)
                        except TimeoutError:
                            break
                        for kept in self._pending.values():
                            kept.clear()
        except SandboxFailedError:
            pass  # the agent is gone, and the program with it
        finally:
            self._agent.close_channel(self._number)
            if self._on_close is not None:
                self._on_close(self)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- inside ---------------------------------------------------------------------------------------
    def _collect(self, timeout: float | None) -> dict[str, bytes] | None:
        """What came since the last call, by stream, as soon as any came; None once the program ended.

        :class:`TimeoutError` when nothing came in ``timeout`` seconds; :class:`SandboxFailedError` when
        the agent broke.
        """
        until = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        with self._read_lock:
            if not any(self._pending.values()) and self._exit is None and self._failure is None:
                self._take(until, wait=True)
                self._take(None, wait=False)  # and whatever else is already here, in one piece
            if any(self._pending.values()):
                taken = {name: bytes(data) for name, data in self._pending.items()}
                for data in self._pending.values():
                    data.clear()
                return taken
            if self._failure is not None:
                raise SandboxFailedError(self._failure)
            return None

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidRequestError("this program's channel is closed")
        if self._exit is not None:
            raise InvalidRequestError(f"the program has exited (status {self.exit_code})")
        if self._failure is not None:
            raise SandboxFailedError(self._failure)

    def _send(self, kind: FrameType, body: dict[str, Any]) -> None:
        self._agent.send(encode(kind, self._number, body), time.monotonic() + _SEND_SECONDS)

    def _take(self, until: float | None, *, wait: bool) -> None:
        """One event (``wait``: the next, by ``until``) or every event already queued, into the state.

        The caller holds the read lock. :class:`TimeoutError` when waiting found nothing by ``until``.
        """
        while True:
            try:
                if wait:
                    left = None if until is None else until - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError("the program wrote nothing in the time given")
                    kind, value = self._channel.events.get(timeout=0.5 if left is None else min(left, 0.5))
                else:
                    kind, value = self._channel.events.get_nowait()
            except queue.Empty:
                if not wait:
                    return
                if self._agent.broken is not None and self._channel.events.empty():
                    self._failure = f"{self._agent.broken}; the program is gone"
                    return
                continue
            self._event(kind, value)
            if wait:
                return

    def _event(self, kind: str, value: Any) -> None:
        if kind in ("stdout", "stderr"):
            self._pending[kind] += value
            self._taken += len(value)
            if self._taken >= _CREDIT_EVERY:
                taken, self._taken = self._taken, 0
                try:
                    self._send(FrameType.CREDIT, {"bytes": taken})
                except SandboxFailedError as exc:
                    self._failure = str(exc)
        elif kind == "exit":
            self._exit = value
        elif kind in ("error", "refused"):
            self._failure = f"the program could not be started: {value}"
        elif kind == "broken":
            self._failure = f"{value}; the program is gone"


class ProcessOutput(tuple[bytes, bytes]):
    """What a :class:`Process` wrote since the last read: ``(stdout, stderr)``, also by name."""

    __slots__ = ()

    def __new__(cls, stdout: bytes, stderr: bytes) -> ProcessOutput:
        """The two streams' bytes."""
        return super().__new__(cls, (stdout, stderr))

    @property
    def stdout(self) -> bytes:
        """Bytes written to stdout."""
        return self[0]

    @property
    def stderr(self) -> bytes:
        """Bytes written to stderr."""
        return self[1]


class Process(LiveChannel):
    """A program started by ``session.spawn``: write its stdin while it runs, read its output as it comes.

    :meth:`write` and :meth:`close_stdin` feed it; :meth:`read` returns what it wrote since the last read
    (empty, with :attr:`running` False, once it ended); :meth:`wait`, :meth:`kill` (its whole tree, as
    :meth:`close`).
    """

    def __init__(self, argv: tuple[str, ...], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.argv = argv

    def read(self, timeout: float | None = None) -> ProcessOutput:
        """What the program wrote since the last read, as soon as any came; empty once it ended.

        :class:`TimeoutError` when nothing came in ``timeout`` seconds (None: wait for output or the end).
        """
        taken = self._collect(timeout)
        return ProcessOutput(b"", b"") if taken is None else ProcessOutput(taken["stdout"], taken["stderr"])

    def close_stdin(self) -> None:
        """End the program's input (it reads end-of-file once it has read what was written)."""
        self._check_open()
        self._agent.send(encode(FrameType.STDIN, self._number), time.monotonic() + _SEND_SECONDS)

    def kill(self) -> None:
        """Kill the program's whole tree now (its exit status then says so); the same as :meth:`close`."""
        self.close()
