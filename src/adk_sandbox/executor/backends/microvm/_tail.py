"""The bounded tail of a VM's output: the guest's serial console and QEMU's own messages.

The guest can write to its console without end (``/dev/ttyS0`` is uid 0's, no capability needed), so what
the host keeps of it is bounded: QEMU writes the console to a pipe (``-chardev stdio``, its stdout), a
thread here reads it at once and keeps the last :data:`TAIL_BYTES` in memory (:class:`BoundedTail`). Nothing
of it is written to a file. QEMU's and the share's server's stderr go the same way. Depth: docs/MICROVM.md,
"The console".
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

__all__ = ["TAIL_BYTES", "BoundedTail", "TailReader"]

#: The most bytes of one output the host keeps (its last ones): ample for the few lines an error quotes.
TAIL_BYTES = 64 * 1024
#: The most bytes taken from the pipe at once.
_CHUNK = 64 * 1024
#: After a short read the reader waits this long, so that a trickle (one byte per write, as the emulated
#: UART writes) wakes it ~50 times a second, not once per byte; the pipe holds what comes meanwhile (and a
#: guest that fills it waits, as on a slow serial line).
_TRICKLE_PAUSE = 0.02


class BoundedTail:
    """The last ``limit`` bytes of what was fed, and how many were fed in all (thread-safe)."""

    def __init__(self, limit: int = TAIL_BYTES) -> None:
        if limit <= 0:
            raise ValueError("a tail keeps at least one byte")
        self.limit = limit
        self._kept = bytearray()
        self._seen = 0
        self._cut = False  # bytes were dropped before the kept ones: its first line may be partial
        self._lock = threading.Lock()

    def feed(self, data: bytes) -> None:
        """Add ``data``, dropping the oldest bytes beyond the limit."""
        with self._lock:
            self._seen += len(data)
            if len(data) >= self.limit:
                self._cut = self._cut or len(self._kept) + len(data) > self.limit
                self._kept[:] = data[-self.limit :]
                return
            self._kept += data
            excess = len(self._kept) - self.limit
            if excess > 0:
                del self._kept[:excess]
                self._cut = True

    @property
    def seen(self) -> int:
        """How many bytes were fed in all (kept or not)."""
        with self._lock:
            return self._seen

    def data(self) -> bytes:
        """The kept bytes (at most ``limit``)."""
        with self._lock:
            return bytes(self._kept)

    def lines(self, count: int) -> list[str]:
        """The last ``count`` lines that are not blank (a line cut by the limit is left out)."""
        with self._lock:
            data, cut = bytes(self._kept), self._cut
        if cut and b"\n" in data:
            data = data.split(b"\n", 1)[1]
        lines = [line for line in data.decode(errors="replace").splitlines() if line.strip()]
        return lines[-count:] if count > 0 else []


class TailReader:
    """A thread reading ``fd`` (a pipe's read end, taken over and closed here) into a :class:`BoundedTail`.

    It reads until every writer has closed the pipe (QEMU and its wrapper are gone), so a writer is never
    left blocked on a full pipe while the reader lives; if reading fails, the pipe is closed (a writer then
    gets EPIPE, not a wait).
    """

    def __init__(self, fd: int, name: str, limit: int = TAIL_BYTES) -> None:
        self.tail = BoundedTail(limit)
        self._fd = fd
        self._thread = threading.Thread(target=self._drain, name=name, daemon=True)
        self._thread.start()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the pipe's end; True once everything written was read."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _drain(self) -> None:
        try:
            while True:
                try:
                    chunk = os.read(self._fd, _CHUNK)
                except OSError:
                    return
                if not chunk:
                    return
                self.tail.feed(chunk)
                if len(chunk) < _CHUNK // 16:
                    time.sleep(_TRICKLE_PAUSE)
        finally:
            with contextlib.suppress(OSError):
                os.close(self._fd)
