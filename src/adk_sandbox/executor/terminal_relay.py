"""A person's terminal joined to a terminal in a sandbox: what ``adk-sandbox shell`` and ``attach`` run.

:func:`relay` puts this terminal in raw mode, keeps the sandbox's terminal at its size and copies the
program's output back through :class:`~adk_sandbox.executor.terminal_filter.TerminalFilter` (unless told
not to); the sandbox's side is any :class:`TerminalLike`. See docs/terminals.md, sections "Terminals,
live processes and attach" and "What reaches a person's terminal".
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import termios
import threading
import tty
from collections.abc import Callable
from typing import Any, Protocol

from adk_sandbox.executor.terminal_filter import RESTORE, TerminalFilter

__all__ = ["TerminalLike", "relay"]

#: Bytes of keystrokes read from this terminal at once.
_KEYS = 64 * 1024
#: How often the keyboard loop looks whether the program ended (seconds).
_TICK = 0.2


class TerminalLike(Protocol):
    """What :func:`relay` needs of the sandbox's terminal (see ``executor/channel/terminal.py``)."""

    @property
    def exit_code(self) -> int | None:
        """The program's exit status once it ended."""
        ...

    def write(self, data: bytes) -> None:
        """Send keystrokes."""
        ...

    def read(self, timeout: float | None = None) -> bytes:
        """What the program showed (``b""`` at its end)."""
        ...

    def resize(self, rows: int, cols: int) -> None:
        """Set the terminal's size."""
        ...

    def close(self) -> None:
        """End the program if it runs."""
        ...


def relay(terminal: TerminalLike, *, stdin: int = 0, stdout: int = 1, filtered: bool = True) -> int:
    """Join ``terminal`` to this process's terminal until its program ends; its exit status.

    ``stdin`` and ``stdout`` are descriptors (this process's terminal by default). A ``stdin`` that is no
    terminal is read as it is, and its end sends Ctrl-D (a shell then ends as at a keyboard's end).
    ``filtered`` False copies every byte the sandbox sends, escape sequences included: only for output
    that does not reach a person's terminal.
    """
    screen = TerminalFilter() if filtered else None
    ended = threading.Event()
    failure: list[BaseException] = []

    def show() -> None:
        try:
            while data := terminal.read():
                shown = screen.feed(data) if screen is not None else data
                _write_all(stdout, shown)
            if screen is not None:
                _write_all(stdout, screen.flush())
                if os.isatty(stdout):  # modes the program left on (mouse, alternate screen...) are undone
                    _write_all(stdout, RESTORE)
        except BaseException as exc:
            failure.append(exc)
        finally:
            ended.set()
            with contextlib.suppress(OSError):
                os.write(wake_w, b"x")

    wake_r, wake_w = os.pipe()
    resized = threading.Event()
    saved = _raw(stdin)
    previous = _follow_size(stdout, resized, wake_w)
    shower = threading.Thread(target=show, name="adk-sandbox-terminal", daemon=True)
    try:
        _resize_to(terminal, stdout)
        shower.start()
        _type(terminal, stdin, wake_r, ended, lambda: _resized(terminal, stdout, resized))
        shower.join()
    finally:
        if saved is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
        if previous is not None:
            signal.signal(signal.SIGWINCH, previous)
        terminal.close()
        os.close(wake_r)
        os.close(wake_w)
    if failure:
        raise failure[0]
    if screen is not None and screen.dropped:
        print(
            f"adk-sandbox: {screen.dropped} control sequence(s) from the sandbox were not passed to this "
            f"terminal (they could answer, set the clipboard or the title; the last: {screen.last_dropped})",
            file=sys.stderr,
        )
    code = terminal.exit_code
    return code if code is not None else 1


def _type(
    terminal: TerminalLike, stdin: int, wake: int, ended: threading.Event, on_wake: Callable[[], object]
) -> None:
    """Keystrokes to the sandbox until its program ends (``on_wake`` when the wake pipe says so)."""
    keyboard_open = True
    while not ended.is_set():
        watched = [wake, stdin] if keyboard_open else [wake]
        ready, _, _ = select.select(watched, [], [], _TICK)
        if wake in ready:
            with contextlib.suppress(OSError):
                os.read(wake, 512)
            on_wake()
        if stdin not in ready:
            continue
        try:
            keys = os.read(stdin, _KEYS)
        except OSError:
            keys = b""
        if not keys:
            keyboard_open = False
            keys = b"\x04"  # the keyboard's end: Ctrl-D, as a terminal would send at a line's start
        with contextlib.suppress(Exception):  # the program may have ended meanwhile: the loop sees it
            terminal.write(keys)


def _raw(fd: int) -> Any:
    """Put the terminal ``fd`` in raw mode; its previous settings (None: not a terminal)."""
    if not os.isatty(fd):
        return None
    saved = termios.tcgetattr(fd)
    tty.setraw(fd, termios.TCSADRAIN)
    return saved


def _resize_to(terminal: TerminalLike, fd: int) -> None:
    with contextlib.suppress(OSError):
        size = os.get_terminal_size(fd)
        terminal.resize(max(size.lines, 1), max(size.columns, 1))


def _resized(terminal: TerminalLike, fd: int, resized: threading.Event) -> None:
    if not resized.is_set():
        return
    resized.clear()
    with contextlib.suppress(Exception):
        _resize_to(terminal, fd)


def _follow_size(fd: int, resized: threading.Event, wake: int) -> Any:
    """On SIGWINCH, say so (``resized``, the wake pipe); the handler it replaced.

    The keyboard loop resizes, never the handler, which could interrupt a write to the sandbox that holds
    its lock.
    """
    if not os.isatty(fd) or threading.current_thread() is not threading.main_thread():
        return None

    def changed(_signum: int, _frame: object) -> None:
        resized.set()
        with contextlib.suppress(OSError):
            os.write(wake, b"w")

    return signal.signal(signal.SIGWINCH, changed)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
