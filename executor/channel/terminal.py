"""A terminal in the sandbox, carried over the agent channel: :class:`Terminal` (``session.open_pty``).

The agent opens a pseudo-terminal for one command (RUN ``"pty"``, :mod:`.frames` "Terminals"): the command
runs in its own session with the terminal as its controlling one, so line editing, job control, Ctrl-C and
full-screen programs behave as in a person's terminal. Its output is flow-controlled rather than capped:
the agent sends at most :data:`.frames.PTY_WINDOW` bytes ahead of what :meth:`Terminal.read` took, so a
terminal nobody reads stops only itself, and the agent's one stream stays free for everything else.

Bytes are bytes: what the program writes reaches :meth:`Terminal.read` unchanged, escape sequences
included. Whatever shows them to a person must filter them (``adk-sandbox shell`` does:
:mod:`adk_sandbox.executor.terminal_filter`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from adk_sandbox.executor.channel.frames import MAX_PTY_SIDE, PTY_WINDOW, FrameType, encode
from adk_sandbox.executor.errors import InvalidRequestError, SandboxFailedError
from adk_sandbox.executor.types import ExecRequest

if TYPE_CHECKING:
    from adk_sandbox.executor.channel.agent_transport import _Agent, _Channel

__all__ = ["DEFAULT_SHELL", "KEPT_BY_WAIT", "Terminal", "check_size", "terminal_request"]

#: The program a terminal runs when none is given: bash when the image has it, else sh, interactive.
DEFAULT_SHELL = ("/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -i; fi; exec sh -i")
#: Bytes of keystrokes per STDIN frame.
_WRITE_CHUNK = 64 * 1024
#: The reader returns CREDIT once it took this much (a quarter of the window: never a stall, few frames).
_CREDIT_EVERY = PTY_WINDOW // 4
#: How long :meth:`Terminal.close` waits for the agent to confirm the program's end.
_CLOSE_SECONDS = 5.0
#: Output :meth:`Terminal.wait` keeps for later :meth:`Terminal.read` calls (its last bytes).
KEPT_BY_WAIT = 1024 * 1024
_SEND_SECONDS = 10.0


def check_size(rows: object, cols: object) -> tuple[int, int]:
    """``(rows, cols)`` when both are integers 1..:data:`.frames.MAX_PTY_SIDE`; else InvalidRequestError."""
    for name, value in (("rows", rows), ("cols", cols)):
        if not (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_PTY_SIDE):
            raise InvalidRequestError(
                f"a terminal's {name} must be an integer 1..{MAX_PTY_SIDE}, not {value!r}"
            )
    return int(rows), int(cols)  # type: ignore[call-overload]


def terminal_request(
    argv: list[str] | tuple[str, ...] | None,
    *,
    user: str | None,
    cwd: str | None,
    env: dict[str, str] | None,
    timeout: float,
) -> ExecRequest:
    """What a terminal's program runs as, checked as a command's request; :class:`InvalidRequestError` if not.

    No ``argv``: :data:`DEFAULT_SHELL`. ``TERM`` is ``xterm-256color`` unless ``env`` gives it.
    """
    try:
        return ExecRequest(
            argv=tuple(argv) if argv is not None else DEFAULT_SHELL,
            user=user,
            cwd=cwd,
            env={"TERM": "xterm-256color", **(env or {})},
            timeout=timeout,
        )
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise InvalidRequestError(f"invalid terminal request: {problems}; nothing was opened") from None


class Terminal:
    """A program on a terminal in the sandbox: write keystrokes, read what it shows, resize, signal.

    Made by ``session.open_pty(...)``. Thread-safe: one thread may :meth:`read` while others
    :meth:`write`, :meth:`resize` or :meth:`signal`. Use it as a context manager or :meth:`close` it; the
    session's close ends every terminal it opened.
    """

    def __init__(
        self,
        agent: _Agent,
        number: int,
        channel: _Channel,
        *,
        on_close: Callable[[Terminal], None] | None = None,
    ) -> None:
        self._agent = agent
        self._number = number
        self._channel = channel
        self._on_close = on_close
        self._read_lock = threading.Lock()
        self._pending = bytearray()  # taken from the channel, not yet returned (wait keeps output here)
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
    def running(self) -> bool:
        """True until the program's end was read (or the terminal closed)."""
        return self._exit is None and self._failure is None and not self._closed

    # -- keystrokes and screen -------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        """Send ``data`` as keystrokes (byte 3 is Ctrl-C, byte 4 Ctrl-D at a line's start)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidRequestError(f"a terminal takes bytes, not {type(data).__name__}; encode text first")
        self._check_open()
        data = bytes(data)
        frames = [encode(FrameType.STDIN, self._number, data[i : i + _WRITE_CHUNK])
                  for i in range(0, len(data), _WRITE_CHUNK)]  # fmt: skip
        if frames:
            self._agent.send(b"".join(frames), time.monotonic() + _SEND_SECONDS)

    def read(self, timeout: float | None = None) -> bytes:
        """What the program wrote since the last read, as soon as there is some; ``b""`` once it ended.

        ``timeout`` seconds at most (None: until output or the end comes); when nothing came in that time,
        :class:`TimeoutError`. :class:`SandboxFailedError` when the sandbox's agent broke meanwhile.
        """
        until = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        with self._read_lock:
            if not self._pending and self._exit is None and self._failure is None:
                self._take(until, wait=True)
                self._take(None, wait=False)  # and whatever else is already here, in one piece
            if self._pending:
                data = bytes(self._pending)
                self._pending.clear()
                return data
            if self._failure is not None:
                raise SandboxFailedError(self._failure)
            return b""

    def resize(self, rows: int, cols: int) -> None:
        """Set the terminal's size (its foreground program gets SIGWINCH)."""
        rows, cols = check_size(rows, cols)
        self._check_open()
        self._send(FrameType.RESIZE, {"rows": rows, "cols": cols})

    def signal(self, sig: int) -> None:
        """Send signal ``sig`` (1..64) to the terminal's foreground process group, as its keys would."""
        if not (isinstance(sig, int) and not isinstance(sig, bool) and 1 <= int(sig) <= 64):
            raise InvalidRequestError(f"a signal is an integer 1..64, not {sig!r}")
        self._check_open()
        self._send(FrameType.SIGNAL, {"signal": int(sig)})

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the program's end; its exit status (see :attr:`exit_code`).

        Output that comes meanwhile is kept for :meth:`read` (its last :data:`KEPT_BY_WAIT` bytes).
        :class:`TimeoutError` when it still runs after ``timeout`` seconds.
        """
        until = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        with self._read_lock:
            while self._exit is None and self._failure is None:
                self._take(until, wait=True)
                if len(self._pending) > KEPT_BY_WAIT:
                    del self._pending[: len(self._pending) - KEPT_BY_WAIT]
            if self._exit is None:
                raise SandboxFailedError(self._failure or "the terminal ended")
        return self.exit_code

    def close(self) -> None:
        """End the program (its whole tree) if it still runs, and forget the terminal; idempotent."""
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
                        self._pending.clear()
        except SandboxFailedError:
            pass  # the agent is gone, and the program with it
        finally:
            self._agent.close_channel(self._number)
            if self._on_close is not None:
                self._on_close(self)

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- inside ---------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise InvalidRequestError("this terminal is closed; open a new one")
        if self._exit is not None:
            raise InvalidRequestError(f"the terminal's program has exited (status {self.exit_code})")
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
                        raise TimeoutError("the terminal wrote nothing in the time given")
                    kind, value = self._channel.events.get(timeout=0.5 if left is None else min(left, 0.5))
                else:
                    kind, value = self._channel.events.get_nowait()
            except queue.Empty:
                if not wait:
                    return
                if self._agent.broken is not None and self._channel.events.empty():
                    self._failure = f"{self._agent.broken}; the terminal's program is gone"
                    return
                continue
            self._event(kind, value)
            if wait:
                return

    def _event(self, kind: str, value: Any) -> None:
        if kind == "stdout":
            self._pending += value
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
            self._failure = f"the terminal could not be opened: {value}"
        elif kind == "broken":
            self._failure = f"{value}; the terminal's program is gone"
