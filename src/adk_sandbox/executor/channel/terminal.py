"""A terminal in the sandbox, carried over the agent channel: :class:`Terminal` (``session.open_pty``).

The agent opens a pseudo-terminal for one command (RUN ``"pty"``, :mod:`.frames` "Terminals"): the command
runs in its own session with the terminal as its controlling one, so line editing, job control, Ctrl-C and
full-screen programs behave as in a person's terminal. Its output is paced rather than capped
(:mod:`.live`): a terminal nobody reads stops only itself.

Bytes are bytes: what the program writes reaches :meth:`Terminal.read` unchanged, escape sequences
included. Whatever shows them to a person must filter them (``adk-sandbox shell`` does:
:mod:`adk_sandbox.executor.terminal_filter`).
"""

from __future__ import annotations

from adk_sandbox.executor.channel.frames import MAX_PTY_SIDE, FrameType
from adk_sandbox.executor.channel.live import LiveChannel, live_request
from adk_sandbox.executor.errors import InvalidRequestError
from adk_sandbox.executor.types import ExecRequest

__all__ = ["DEFAULT_SHELL", "Terminal", "check_signal", "check_size", "terminal_request"]

#: The program a terminal runs when none is given: bash when the image has it, else sh, interactive.
DEFAULT_SHELL = ("/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -i; fi; exec sh -i")


def check_size(rows: object, cols: object) -> tuple[int, int]:
    """``(rows, cols)`` when both are integers 1..:data:`.frames.MAX_PTY_SIDE`; else InvalidRequestError."""
    for name, value in (("rows", rows), ("cols", cols)):
        if not (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_PTY_SIDE):
            raise InvalidRequestError(
                f"a terminal's {name} must be an integer 1..{MAX_PTY_SIDE}, not {value!r}"
            )
    return int(rows), int(cols)  # type: ignore[call-overload]


def check_signal(sig: object) -> int:
    """``sig`` when it is an integer 1..64 (a signal number); else InvalidRequestError."""
    if not (isinstance(sig, int) and not isinstance(sig, bool) and 1 <= sig <= 64):
        raise InvalidRequestError(f"a signal is an integer 1..64, not {sig!r}")
    return int(sig)


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
    return live_request(
        argv if argv is not None else DEFAULT_SHELL,
        user=user,
        cwd=cwd,
        env={"TERM": "xterm-256color", **(env or {})},
        timeout=timeout,
        what="terminal",
    )


class Terminal(LiveChannel):
    """A program on a terminal in the sandbox: write keystrokes, read what it shows, resize, signal.

    Made by ``session.open_pty(...)``. Thread-safe: one thread may :meth:`read` while others
    :meth:`write`, :meth:`resize` or :meth:`signal`. Use it as a context manager or :meth:`close` it; the
    session's close ends every terminal it opened. :meth:`write` sends keystrokes (byte 3 is Ctrl-C, byte
    4 Ctrl-D at a line's start); :meth:`wait` and :meth:`close` are :class:`.live.LiveChannel`'s.
    """

    def read(self, timeout: float | None = None) -> bytes:
        """What the program showed since the last read, as soon as there is some; ``b""`` once it ended.

        ``timeout`` seconds at most (None: until output or the end comes); when nothing came in that time,
        :class:`TimeoutError`. :class:`SandboxFailedError` when the sandbox's agent broke meanwhile.
        """
        taken = self._collect(timeout)
        return b"" if taken is None else taken["stdout"]

    def resize(self, rows: int, cols: int) -> None:
        """Set the terminal's size (its foreground program gets SIGWINCH)."""
        rows, cols = check_size(rows, cols)
        self._check_open()
        self._send(FrameType.RESIZE, {"rows": rows, "cols": cols})

    def signal(self, sig: int) -> None:
        """Send signal ``sig`` (1..64) to the terminal's foreground process group, as its keys would."""
        sig = check_signal(sig)
        self._check_open()
        self._send(FrameType.SIGNAL, {"signal": sig})
