"""A terminal on the host: :class:`HostTerminal`, what ``ProcessBackend.open_pty`` returns.

A pseudo-terminal of the host (no agent channel) with the methods and errors of a session's
:class:`~adk_sandbox.executor.channel.terminal.Terminal`; its close, timeout and end kill the program's
whole session. See docs/terminals.md, section "Terminals on the host and under bubblewrap".
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import math
import os
import select
import signal
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Callable, Sequence

from adk_sandbox.executor._proctree import has_exited, kill_session, wait_for_exit_unreaped
from adk_sandbox.executor.channel.terminal import check_signal, check_size
from adk_sandbox.executor.errors import InvalidRequestError, SandboxFailedError

__all__ = ["HostTerminal"]

#: How long :meth:`HostTerminal.write` waits for a program that reads no input.
_WRITE_SECONDS = 10.0
_READ = 64 * 1024


class HostTerminal:
    """A program on a pseudo-terminal of the host: write keystrokes, read what it shows, resize, signal.

    Thread-safe as a channel's terminal is: one thread may :meth:`read` while others write, resize or
    signal. Use it as a context manager or :meth:`close` it.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str],
        cwd: str,
        size: tuple[int, int],
        timeout: float,
        new_session: bool,
        on_close: Callable[[HostTerminal], None] | None = None,
    ) -> None:
        """Start ``argv`` on a new terminal of ``size``; ``new_session`` makes it lead its own group."""
        self._master, slave = os.openpty()
        try:
            _set_size(slave, size)
            self._proc = subprocess.Popen(
                list(argv),
                stdin=slave,
                stdout=slave,
                stderr=slave,
                env=env,
                cwd=cwd,
                close_fds=True,
                start_new_session=new_session,
            )
        except OSError as exc:
            os.close(self._master)
            raise SandboxFailedError(f"could not start {argv[0]!r} on a terminal: {exc}") from exc
        finally:
            os.close(slave)
        os.set_blocking(self._master, False)
        self._on_close = on_close
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._closed = False
        self._eof = False
        self._timed_out = False
        self._timer = threading.Timer(max(timeout, 0.0), self._expire)
        self._timer.daemon = True
        self._timer.start()

    # -- state --------------------------------------------------------------------------------------------
    @property
    def exit_code(self) -> int | None:
        """The program's exit status once it ended (128 + N when signal N killed it); None while it runs."""
        if not self._reaped():
            return None
        code = self._proc.returncode
        return 128 - code if code < 0 else code

    @property
    def timed_out(self) -> bool:
        """True when the program was killed at the end of its ``timeout``."""
        return self._timed_out

    @property
    def running(self) -> bool:
        """True until the program ended (or the terminal was closed)."""
        return not self._closed and not self._reaped()

    # -- input, output, control -------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        """Send keystrokes (byte 3 is Ctrl-C, byte 4 Ctrl-D at a line's start)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidRequestError(
                f"the program takes bytes, not {type(data).__name__}; encode text first"
            )
        self._check_open()
        view = memoryview(bytes(data))
        until = time.monotonic() + _WRITE_SECONDS
        while view:
            left = until - time.monotonic()
            if left <= 0 or not select.select([], [self._master], [], left)[1]:
                raise TimeoutError(f"the program read no input for {_WRITE_SECONDS:.0f} s")
            try:
                view = view[os.write(self._master, view) :]
            except BlockingIOError:
                continue
            except OSError as exc:
                raise SandboxFailedError(f"the terminal is gone: {exc}") from exc

    def read(self, timeout: float | None = None) -> bytes:
        """What the program showed since the last read, as soon as there is some; ``b""`` once it ended.

        ``timeout`` seconds at most (None: until output or the end comes); :class:`TimeoutError` when
        nothing came in that time.
        """
        until = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        with self._read_lock:
            while not self._eof:
                if self._closed:
                    return b""
                left = 0.5 if until is None else min(max(until - time.monotonic(), 0.0), 0.5)
                if select.select([self._master], [], [], left)[0]:
                    try:
                        data = os.read(self._master, _READ)
                    except BlockingIOError:
                        continue
                    except OSError as exc:
                        # EIO: every holder of the terminal's other side is gone (the program and its
                        # children): everything it wrote was read.
                        if exc.errno != errno.EIO:
                            raise SandboxFailedError(f"the terminal is gone: {exc}") from exc
                        data = b""
                    if data:
                        return data
                    self._eof = True
                elif until is not None and time.monotonic() >= until:
                    raise TimeoutError("the program wrote nothing in the time given")
            return b""

    def resize(self, rows: int, cols: int) -> None:
        """Set the terminal's size (its foreground program gets SIGWINCH)."""
        size = check_size(rows, cols)
        self._check_open()
        _set_size(self._master, size)

    def signal(self, sig: int) -> None:
        """Send signal ``sig`` (1..64) to the terminal's foreground process group, as its keys would."""
        sig = check_signal(sig)
        self._check_open()
        # The foreground group is always one of the program's session (the kernel refuses any other).
        with contextlib.suppress(OSError):
            os.killpg(os.tcgetpgrp(self._master), sig)

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the program's end; its exit status. :class:`TimeoutError` if it runs past ``timeout``."""
        until = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        # In steps: select() takes no infinite timeout, and a wait without one has no end.
        while not wait_for_exit_unreaped(self._proc, min(until or math.inf, time.monotonic() + 60)):
            if until is not None and time.monotonic() >= until:
                raise TimeoutError(f"the program still runs after {timeout} s")
        return self.exit_code

    def close(self) -> None:
        """End the program (its whole group) if it still runs, and the terminal; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._timer.cancel()
        with self._lock:
            if self._proc.returncode is None:
                self._kill()  # before the reaping: the pid still names the session
                self._proc.wait()
        with self._read_lock:
            os.close(self._master)
        if self._on_close is not None:
            self._on_close(self)

    def __enter__(self) -> HostTerminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- inside ---------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise InvalidRequestError("this terminal is closed")
        if self._reaped():
            raise InvalidRequestError(f"the program has exited (status {self.exit_code})")

    def _reaped(self) -> bool:
        """Whether the program ended; at its end what it left in its group is killed, then it is reaped.

        Killed before the reaping, while its pid (the group's id) is still reserved: never another group.
        """
        with self._lock:
            if self._proc.returncode is not None:
                return True
            if not has_exited(self._proc.pid):
                return False
            self._timer.cancel()
            self._kill()
            self._proc.wait()
            return True

    def _kill(self) -> None:
        """SIGKILL the program's session, and the program itself: it may not have made its session yet."""
        kill_session(self._proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._proc.pid, signal.SIGKILL)

    def _expire(self) -> None:
        with self._lock:
            if self._proc.returncode is None:
                self._timed_out = True
                self._kill()


def _set_size(fd: int, size: tuple[int, int]) -> None:
    rows, cols = size
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
