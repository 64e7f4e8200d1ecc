"""Capped, streaming, UTF-8-safe output capture: the one place every backend collects output.

:class:`OutputCapture` keeps at most ``max_bytes`` per stream (cut on a UTF-8 boundary; with
``keep_tail`` a head and a sliding tail) and hands whole lines to ``on_output``; :func:`start_pipe_reader`
drains two host pipes in one thread. See docs/DESIGN.md, section "Output capture", and
docs/docker/configuration.md, "Keeping the tail of long output".
"""

from __future__ import annotations

import codecs
import contextlib
import os
import selectors
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from adk_sandbox.executor.types import Stream

__all__ = [
    "CHUNK_SIZE",
    "CapturedStream",
    "OutputCapture",
    "PipeReader",
    "omission_line",
    "start_pipe_reader",
    "utf8_safe_cut",
]

CHUNK_SIZE = 64 * 1024
"""Bytes read per system call; also the most a reader holds beyond what it keeps."""

# After finish()'s grace period, at most this many more reads per stream take what is already buffered.
_FINAL_DRAIN_ROUNDS = 16

# A partial line longer than this is delivered to on_output without waiting for its newline, so a
# program printing one endless line still streams.
_MAX_PENDING_LINE = 64 * 1024


def utf8_safe_cut(data: bytes | bytearray, limit: int) -> int:
    """Return the largest ``n <= limit`` such that ``data[:n]`` does not end inside a UTF-8 character.

    Only a character straddling ``limit`` is dropped whole; invalid input is cut at ``limit`` (at most 3
    bytes are examined, the longest continuation run of a valid character).
    """
    if len(data) <= limit:
        return len(data)
    cut = limit
    # Step back over continuation bytes (0b10xxxxxx) to the lead byte of the straddling character.
    while cut > 0 and limit - cut < 3 and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    if cut < limit and cut + _sequence_length(data[cut]) > limit:
        return cut  # a lead byte whose character does not fit: drop the character whole
    return limit  # a boundary already, or invalid UTF-8 here anyway: keep every byte the cap allows


def _sequence_length(lead: int) -> int:
    """Length of the UTF-8 sequence a lead byte announces; 0 for ASCII and bytes that cannot lead."""
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return 0


def omission_line(count: int, after: bytes | str) -> str:
    """The line that stands between a kept head and a kept tail: ``[... N bytes omitted ...]``.

    Starts on a line of its own (a newline first unless ``after`` ends with one), so a model or a parser
    never reads the end of one line glued to a line from much later.
    """
    newline = "" if not after or after[-1:] in ("\n", b"\n") else "\n"
    return f"{newline}[... {count} bytes omitted ...]\n"


@dataclass
class CapturedStream:
    """The kept part of one stream and whether anything was dropped.

    ``data`` is the kept head; ``tail`` the kept end of the stream (only with ``keep_tail``), and
    ``omitted`` counts the bytes dropped between them (or after the head, without a tail).
    """

    data: bytes
    truncated: bool
    total_bytes: int
    tail: bytes = b""
    tail_kept: bool = False
    """True when the capture kept a tail (``keep_tail``), even an empty one."""

    @property
    def omitted(self) -> int:
        """Bytes produced and not kept."""
        return self.total_bytes - len(self.data) - len(self.tail)

    @property
    def text(self) -> str:
        """The kept bytes decoded as UTF-8, invalid sequences replaced (lossy, never raises).

        With a kept tail and bytes dropped before it, the omission line (:func:`omission_line`) joins the
        head and the tail.
        """
        head = self.data.decode("utf-8", errors="replace")
        if not self.tail_kept:
            return head
        tail = self.tail.decode("utf-8", errors="replace")
        if self.omitted <= 0:
            return head + tail
        return head + omission_line(self.omitted, head) + tail


class _StreamState:
    def __init__(self) -> None:
        self.kept = bytearray()
        self.full = False
        self.total = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.pending_line = ""
        self.tail: deque[bytes] = deque()
        self.tail_len = 0

    def keep_tail(self, chunk: bytes, room: int) -> None:
        """Add ``chunk`` to the tail window of ``room`` bytes, dropping from its front what no longer fits."""
        if len(chunk) >= room:
            self.tail.clear()
            self.tail.append(chunk[len(chunk) - room :])
            self.tail_len = room
            return
        self.tail.append(chunk)
        self.tail_len += len(chunk)
        while self.tail_len > room:
            excess = self.tail_len - room
            first = self.tail[0]
            if len(first) <= excess:
                self.tail.popleft()
                self.tail_len -= len(first)
            else:
                self.tail[0] = first[excess:]
                self.tail_len -= excess

    def tail_bytes(self) -> bytes:
        """The tail window, starting on a character: up to 3 leading continuation bytes are dropped."""
        tail = b"".join(self.tail)
        start = 0
        while start < min(3, len(tail)) and (tail[start] & 0xC0) == 0x80:
            start += 1
        return tail[start:]


class OutputCapture:
    """Collects stdout and stderr under a per-stream byte cap. Thread-safe.

    ``on_output(stream, text)`` is called with whole lines (newline included) of the kept output, in
    order per stream, never concurrently; a final partial line is delivered by :meth:`finish`.

    ``keep_tail`` splits the cap: :attr:`head_bytes` from the start, :attr:`tail_bytes` (half the cap,
    rounded down) from the end. The tail is only known at the end, so ``on_output`` receives it (after
    the omission line) from :meth:`finish`: what was streamed is always exactly the result's text.
    """

    def __init__(
        self,
        max_bytes: int,
        on_output: Callable[[Stream, str], None] | None = None,
        *,
        keep_tail: bool = False,
    ) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self._max_bytes = max_bytes
        self._tail_bytes = max_bytes // 2 if keep_tail else 0
        self._keep_tail = keep_tail
        self._on_output = on_output
        self._lock = threading.Lock()
        self._streams: dict[Stream, _StreamState] = {
            "stdout": _StreamState(),
            "stderr": _StreamState(),
        }
        self._finished = False

    @property
    def max_bytes(self) -> int:
        """The per-stream cap (head and tail together)."""
        return self._max_bytes

    @property
    def head_bytes(self) -> int:
        """Bytes kept from the start of each stream."""
        return self._max_bytes - self._tail_bytes

    @property
    def tail_bytes(self) -> int:
        """Bytes kept from the end of each stream (0 without ``keep_tail``)."""
        return self._tail_bytes

    def note_dropped(self, stream: Stream, count: int) -> None:
        """Count ``count`` bytes of ``stream`` dropped before reaching this capture (a cap at the source)."""
        if count > 0:
            with self._lock:
                self._streams[stream].total += count

    def feed(self, stream: Stream, chunk: bytes) -> None:
        """Add a raw chunk of ``stream``; what exceeds the cap is counted and dropped."""
        if not chunk:
            return
        with self._lock:
            state = self._streams[stream]
            state.total += len(chunk)
            if state.full:
                if self._tail_bytes:
                    state.keep_tail(chunk, self._tail_bytes)
                return
            room = self.head_bytes - len(state.kept)
            rest = b""
            if len(chunk) > room:
                before, held = bytes(state.kept[-3:]), len(state.kept)
                kept = self._cut_at_cap(state, chunk, room)
                # What the head does not keep starts the tail window, with the bytes of a character the
                # cut took back out of the head, so a stream that fits in the cap loses nothing.
                taken_back = held - len(state.kept)
                rest = (before[len(before) - taken_back :] if taken_back else b"") + chunk[len(kept) :]
                chunk = kept
                state.full = True
            state.kept += chunk
            self._deliver(stream, state, state.decoder.decode(chunk))
            if rest and self._tail_bytes:
                state.keep_tail(rest, self._tail_bytes)

    @staticmethod
    def _cut_at_cap(state: _StreamState, chunk: bytes, room: int) -> bytes:
        # The character straddling the cap may have started in an earlier chunk, so the cut is computed
        # over the kept tail plus the new bytes; a partial character already kept is removed again.
        tail = bytes(state.kept[-3:])
        keep = utf8_safe_cut(tail + chunk[: room + 1], len(tail) + room) - len(tail)
        if keep < 0:
            del state.kept[keep:]
            state.decoder.reset()  # it was holding exactly those bytes of the incomplete character
            return b""
        return chunk[:keep]

    def finish(self) -> dict[Stream, CapturedStream]:
        """Flush partial lines to ``on_output`` and return both streams. Idempotent."""
        with self._lock:
            if not self._finished:
                self._finished = True
                for stream, state in self._streams.items():
                    self._deliver(stream, state, state.decoder.decode(b"", final=True))
                    if state.pending_line:
                        self._emit(stream, state.pending_line)
                        state.pending_line = ""
                    self._deliver_tail(stream, state)
            return {stream: self._captured(state) for stream, state in self._streams.items()}

    def _captured(self, state: _StreamState) -> CapturedStream:
        tail = state.tail_bytes() if self._keep_tail else b""
        return CapturedStream(
            data=bytes(state.kept),
            truncated=state.total > len(state.kept) + len(tail),
            total_bytes=state.total,
            tail=tail,
            tail_kept=self._keep_tail,
        )

    def _deliver_tail(self, stream: Stream, state: _StreamState) -> None:
        """Stream the omission line and the tail at the end (what follows the streamed head)."""
        if not self._keep_tail:
            return
        captured = self._captured(state)
        text = captured.text[len(captured.data.decode("utf-8", errors="replace")) :]
        self._deliver(stream, state, text)
        if state.pending_line:
            self._emit(stream, state.pending_line)
            state.pending_line = ""

    def _deliver(self, stream: Stream, state: _StreamState, text: str) -> None:
        if self._on_output is None or not text:
            return
        text = state.pending_line + text
        last_newline = text.rfind("\n")
        if last_newline == -1:
            complete, rest = "", text
        else:
            complete, rest = text[: last_newline + 1], text[last_newline + 1 :]
        if len(rest) > _MAX_PENDING_LINE:
            complete, rest = complete + rest, ""
        state.pending_line = rest
        if complete:
            # Only "\n" ends a line (str.splitlines would also split at \r, \x0b, \x1c, \u2028, ...).
            *lines, overlong = complete.split("\n")
            for line in lines:
                self._emit(stream, line + "\n")
            if overlong:  # an over-long partial line, delivered without waiting for its newline
                self._emit(stream, overlong)

    def _emit(self, stream: Stream, text: str) -> None:
        if self._on_output is not None:
            self._on_output(stream, text)


class PipeReader:
    """A background thread draining a process's stdout and stderr pipes into an :class:`OutputCapture`."""

    def __init__(self, pipes: dict[Stream, int], capture: OutputCapture) -> None:
        self._pipes = pipes
        self._capture = capture
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="adk-sandbox-output", daemon=True)

    def start(self) -> None:
        """Start reading."""
        self._thread.start()

    def finish(self, grace: float) -> bool:
        """Wait up to ``grace`` seconds for both pipes to reach end-of-file, then stop reading.

        Returns True when both streams ended. False means some process outside the killed tree still holds
        a pipe open (only possible without an enforcer); whatever it had written is kept, and the reader
        stops instead of waiting on it forever.
        """
        self._thread.join(grace)
        ended = not self._thread.is_alive()
        if not ended:
            self._stop.set()
            self._thread.join()
        return ended

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        try:
            for stream, fd in self._pipes.items():
                os.set_blocking(fd, False)
                selector.register(fd, selectors.EVENT_READ, stream)
            drain_rounds_left = _FINAL_DRAIN_ROUNDS
            while selector.get_map():
                stopping = self._stop.is_set()
                if stopping:
                    # Bounded: a leftover writer that never stops must not keep the reader (and the
                    # caller waiting in finish()) busy forever.
                    drain_rounds_left -= 1
                events = selector.select(timeout=0 if stopping else 0.1)
                if stopping and (not events or drain_rounds_left <= 0):
                    break
                for key, _ in events:
                    self._read_available(selector, key.fd, key.data)
        except BaseException as exc:  # surfaced by the backend; a reader thread must never die silently
            self.error = exc
        finally:
            selector.close()
            for fd in self._pipes.values():
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _read_available(self, selector: selectors.BaseSelector, fd: int, stream: Stream) -> None:
        try:
            chunk = os.read(fd, CHUNK_SIZE)
        except BlockingIOError:
            return
        if chunk:
            self._capture.feed(stream, chunk)
        else:
            selector.unregister(fd)


def start_pipe_reader(pipes: dict[Stream, int], capture: OutputCapture) -> PipeReader:
    """Start draining ``pipes`` (raw fds, closed by the reader when done) into ``capture``."""
    reader = PipeReader(pipes, capture)
    reader.start()
    return reader
