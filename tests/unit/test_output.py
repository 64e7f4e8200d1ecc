"""Unit tests of the capped, streaming, UTF-8-safe output capture (``adk_sandbox.executor._output``)."""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adk_sandbox.executor._output import (
    CHUNK_SIZE,
    OutputCapture,
    PipeReader,
    start_pipe_reader,
    utf8_safe_cut,
)
from adk_sandbox.executor.types import Stream

E_ACUTE = "\u00e9"  # 2 bytes: c3 a9
EURO = "\u20ac"  # 3 bytes: e2 82 ac
GRIN = "\U0001f600"  # 4 bytes: f0 9f 98 80
MULTIBYTE_CHARS = [E_ACUTE, EURO, GRIN]

MiB = 1024 * 1024

# Text for property tests: any code point, with newlines and the other characters str.splitlines()
# treats as line breaks made frequent, so line handling is exercised.
LINE_BREAKS = "\n\n\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
TEXT = st.text(alphabet=st.one_of(st.characters(codec="utf-8"), st.sampled_from(LINE_BREAKS)), max_size=200)


# --------------------------------------------------------------------------------------------------
# helpers


class Recorder:
    """An ``on_output`` callback that records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[Stream, str]] = []
        self.overlapping_calls = 0
        self._lock = threading.Lock()
        self._in_call = threading.Lock()

    def __call__(self, stream: Stream, text: str) -> None:
        assert isinstance(text, str)
        assert text, "on_output must never be called with an empty chunk"
        if not self._in_call.acquire(blocking=False):
            self.overlapping_calls += 1  # called concurrently with another call
            self._in_call.acquire()
        try:
            with self._lock:
                self.calls.append((stream, text))
        finally:
            self._in_call.release()

    def chunks(self, stream: Stream) -> list[str]:
        with self._lock:
            return [text for s, text in self.calls if s == stream]

    def text(self, stream: Stream) -> str:
        return "".join(self.chunks(stream))


def kept_prefix(text: str, cap: int) -> bytes:
    """The longest prefix of ``text``'s UTF-8 encoding, on a character boundary, of at most ``cap`` bytes."""
    out = bytearray()
    for char in text:
        encoded = char.encode()
        if len(out) + len(encoded) > cap:
            break
        out += encoded
    return bytes(out)


def split_at(data: bytes, points: Sequence[int]) -> list[bytes]:
    """Split ``data`` at the given offsets (any order, duplicates and out-of-range values ignored)."""
    cuts = sorted({p for p in points if 0 < p < len(data)})
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def feed_all(capture: OutputCapture, stream: Stream, pieces: Sequence[bytes]) -> None:
    for piece in pieces:
        capture.feed(stream, piece)


def byte_by_byte(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def assert_whole_lines(chunks: Sequence[str]) -> None:
    """Every chunk but the last one ends with a newline."""
    for chunk in chunks[:-1]:
        assert chunk.endswith("\n"), f"chunk {chunk!r} delivered before its line ended (all: {chunks!r})"


# --------------------------------------------------------------------------------------------------
# utf8_safe_cut


UTF8_SAFE_CUT_TABLE = [
    # (id, data, limit, expected)
    ("ascii-cut", b"hello world", 5, 5),
    ("ascii-limit-zero", b"hello", 0, 0),
    ("ascii-exact-length", b"hello", 5, 5),
    ("shorter-than-limit", b"hello", 10, 5),
    ("empty", b"", 0, 0),
    ("empty-positive-limit", b"", 4, 0),
    # 2-byte character at offset 1: a | c3 a9 | b
    ("2byte-before", b"a\xc3\xa9b", 1, 1),
    ("2byte-straddle", b"a\xc3\xa9b", 2, 1),
    ("2byte-exact-boundary", b"a\xc3\xa9b", 3, 3),
    # 3-byte character at offset 1: a | e2 82 ac | b
    ("3byte-straddle-after-1", b"a\xe2\x82\xacb", 2, 1),
    ("3byte-straddle-after-2", b"a\xe2\x82\xacb", 3, 1),
    ("3byte-exact-boundary", b"a\xe2\x82\xacb", 4, 4),
    # 4-byte character at offset 1: a | f0 9f 98 80 | b
    ("4byte-straddle-after-1", b"a\xf0\x9f\x98\x80b", 2, 1),
    ("4byte-straddle-after-2", b"a\xf0\x9f\x98\x80b", 3, 1),
    ("4byte-straddle-after-3", b"a\xf0\x9f\x98\x80b", 4, 1),
    ("4byte-exact-boundary", b"a\xf0\x9f\x98\x80b", 5, 5),
    # a multi-byte character at the very start, straddling the limit: nothing can be kept
    ("3byte-at-start", b"\xe2\x82\xac", 2, 0),
    ("4byte-at-start", b"\xf0\x9f\x98\x80", 3, 0),
    # a multi-byte character ending exactly at the end of the data, limit == len
    ("multibyte-ends-at-limit", "ab\u20ac".encode(), 5, 5),
    # consecutive multi-byte characters: only the straddling one is dropped
    ("two-euros-straddle", "\u20ac\u20ac".encode(), 5, 3),
    ("two-euros-boundary", "\u20ac\u20ac".encode(), 3, 3),
    # invalid input is cut at the limit
    ("invalid-ff-bytes", b"\xff\xfe\xfd\xfc", 2, 2),
    ("invalid-long-continuation-run", b"\x80\x80\x80\x80\x80\x80", 4, 4),
    ("invalid-truncated-lead-then-ascii", b"a\xc3b", 2, 2),
    ("invalid-lone-lead-after-limit", b"ab\xe2", 2, 2),
    # invalid continuation bytes after a complete character: that character does not straddle the
    # limit and must not be dropped ("only a character straddling limit is dropped whole")
    ("invalid-continuation-after-ascii", b"a\x80\x80", 2, 2),
    ("invalid-continuation-after-2byte", b"\xc3\xa9\x80", 2, 2),
    ("invalid-continuation-run-after-ascii", b"ab\x80\x80\x80\x80", 4, 4),
]


@pytest.mark.parametrize(
    ("data", "limit", "expected"),
    [pytest.param(data, limit, expected, id=name) for name, data, limit, expected in UTF8_SAFE_CUT_TABLE],
)
def test_utf8_safe_cut_table(data: bytes, limit: int, expected: int) -> None:
    assert utf8_safe_cut(data, limit) == expected
    assert utf8_safe_cut(bytearray(data), limit) == expected


@given(text=st.text(), extra=st.integers(min_value=0, max_value=8), data=st.data())
def test_utf8_safe_cut_valid_input_keeps_largest_prefix(text: str, extra: int, data: st.DataObject) -> None:
    encoded = text.encode()
    limit = data.draw(st.integers(min_value=0, max_value=len(encoded) + extra))
    n = utf8_safe_cut(encoded, limit)
    assert encoded[:n] == kept_prefix(text, limit)
    encoded[:n].decode("utf-8")  # strict: never ends inside a character


def _sequence_length(lead: int) -> int:
    if lead & 0xE0 == 0xC0:
        return 2
    if lead & 0xF0 == 0xE0:
        return 3
    if lead & 0xF8 == 0xF0:
        return 4
    return 1


@given(data=st.binary(max_size=12), limit=st.integers(min_value=0, max_value=14))
def test_utf8_safe_cut_only_drops_a_character_straddling_the_limit(data: bytes, limit: int) -> None:
    n = utf8_safe_cut(data, limit)
    assert max(0, min(limit, len(data)) - 3) <= n <= min(limit, len(data))
    if n < min(limit, len(data)):
        # What was dropped before the limit must be the start of one multi-byte character that the
        # limit cuts through; a complete character (or stray bytes) is never dropped.
        assert _sequence_length(data[n]) > limit - n, (data, limit, n)


# --------------------------------------------------------------------------------------------------
# OutputCapture: cap, truncation, totals


def test_max_bytes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        OutputCapture(0)
    with pytest.raises(ValueError, match="max_bytes"):
        OutputCapture(-1)


def test_cap_is_independent_per_stream() -> None:
    capture = OutputCapture(10)
    capture.feed("stdout", b"x" * 100)
    capture.feed("stderr", b"short")
    capture.feed("stdout", b"y" * 50)
    capture.feed("stderr", b"12345")  # exactly fills stderr's own cap
    result = capture.finish()

    assert result["stdout"].data == b"x" * 10
    assert result["stdout"].truncated is True
    assert result["stdout"].total_bytes == 150

    assert result["stderr"].data == b"short12345"
    assert result["stderr"].truncated is False
    assert result["stderr"].total_bytes == 10


def test_stderr_capped_does_not_affect_stdout() -> None:
    capture = OutputCapture(4)
    capture.feed("stderr", b"e" * 1000)
    capture.feed("stdout", b"ok\n")
    result = capture.finish()
    assert result["stdout"].data == b"ok\n"
    assert result["stdout"].truncated is False
    assert result["stderr"].data == b"eeee"
    assert result["stderr"].truncated is True
    assert result["stderr"].total_bytes == 1000


def test_exactly_the_cap_is_not_truncated_one_more_byte_is() -> None:
    capture = OutputCapture(8)
    capture.feed("stdout", b"1234")
    capture.feed("stdout", b"5678")
    assert capture.finish()["stdout"].truncated is False

    capture = OutputCapture(8)
    capture.feed("stdout", b"1234")
    capture.feed("stdout", b"5678")
    capture.feed("stdout", b"9")
    result = capture.finish()["stdout"]
    assert result.data == b"12345678"
    assert result.truncated is True
    assert result.total_bytes == 9


def test_total_bytes_counts_everything_across_many_chunks() -> None:
    capture = OutputCapture(100)
    for _ in range(1000):
        capture.feed("stdout", b"0123456789")
    result = capture.finish()
    assert result["stdout"].total_bytes == 10_000
    assert result["stdout"].data == b"0123456789" * 10
    assert result["stdout"].truncated is True
    assert result["stderr"].total_bytes == 0
    assert result["stderr"].data == b""
    assert result["stderr"].truncated is False


def test_empty_chunks_are_ignored() -> None:
    recorder = Recorder()
    capture = OutputCapture(4, recorder)
    capture.feed("stdout", b"")
    capture.feed("stdout", b"ab")
    capture.feed("stdout", b"")
    result = capture.finish()
    assert result["stdout"].data == b"ab"
    assert result["stdout"].total_bytes == 2
    assert recorder.calls == [("stdout", "ab")]


def test_text_is_lossy_utf8() -> None:
    capture = OutputCapture(100)
    capture.feed("stdout", b"bad \xff byte\n")
    assert capture.finish()["stdout"].text == "bad \ufffd byte\n"


# --------------------------------------------------------------------------------------------------
# OutputCapture: a character straddling the cap is dropped whole, however it was chunked


def _straddle_cases() -> Iterator[object]:
    for char in MULTIBYTE_CHARS:
        width = len(char.encode())
        for prefix_len in (0, 1, 5):
            for over in range(1, width):  # the cap falls inside the character
                yield pytest.param(
                    char, prefix_len, prefix_len + over, id=f"{width}byte-prefix{prefix_len}-cap+{over}"
                )


def _feeding_modes(data: bytes) -> Iterator[tuple[str, list[bytes]]]:
    yield "one-chunk", [data]
    yield "byte-by-byte", byte_by_byte(data)
    for point in range(1, len(data)):
        yield f"split-at-{point}", split_at(data, [point])


@pytest.mark.parametrize(("char", "prefix_len", "cap"), list(_straddle_cases()))
def test_straddling_character_is_dropped_whole(char: str, prefix_len: int, cap: int) -> None:
    text = "p" * prefix_len + char + "tail"
    data = text.encode()
    for mode, pieces in _feeding_modes(data):
        recorder = Recorder()
        capture = OutputCapture(cap, recorder)
        feed_all(capture, "stdout", pieces)
        result = capture.finish()["stdout"]
        assert result.data == b"p" * prefix_len, mode
        assert result.truncated is True, mode
        assert result.total_bytes == len(data), mode
        assert recorder.text("stdout") == "p" * prefix_len, mode


@pytest.mark.parametrize("char", MULTIBYTE_CHARS)
def test_character_ending_exactly_at_the_cap_is_kept(char: str) -> None:
    data = ("ab" + char + "more").encode()
    cap = 2 + len(char.encode())
    for mode, pieces in _feeding_modes(data):
        recorder = Recorder()
        capture = OutputCapture(cap, recorder)
        feed_all(capture, "stdout", pieces)
        result = capture.finish()["stdout"]
        assert result.data == ("ab" + char).encode(), mode
        assert result.truncated is True, mode
        assert recorder.text("stdout") == "ab" + char, mode


def test_partial_character_fed_in_earlier_chunks_byte_by_byte_is_removed() -> None:
    # The first three bytes of the 4-byte character fill the cap exactly, in separate chunks; only
    # the fourth byte (the next chunk) shows the character straddles the cap.
    recorder = Recorder()
    capture = OutputCapture(4, recorder)  # room for 'x' + 3 of GRIN's 4 bytes
    for piece in byte_by_byte(("x" + GRIN).encode()):
        capture.feed("stdout", piece)
    result = capture.finish()["stdout"]
    assert result.data == b"x"
    assert result.text == "x"
    assert result.truncated is True
    assert result.total_bytes == 5
    assert recorder.text("stdout") == "x"


@settings(max_examples=300, deadline=None)
@given(
    text=TEXT,
    cap_extra=st.integers(min_value=-50, max_value=20),
    split_points=st.lists(st.integers(min_value=0, max_value=1000), max_size=30),
    use_on_output=st.booleans(),
)
def test_kept_output_is_the_largest_valid_prefix(
    text: str, cap_extra: int, split_points: list[int], use_on_output: bool
) -> None:
    data = text.encode()
    cap = max(1, len(data) + cap_extra)
    recorder = Recorder()
    capture = OutputCapture(cap, recorder if use_on_output else None)
    feed_all(capture, "stdout", split_at(data, split_points))
    result = capture.finish()["stdout"]

    expected = kept_prefix(text, cap)
    assert result.data == expected
    assert len(result.data) <= cap
    assert result.data.decode("utf-8") == result.text  # strictly valid: no replacement characters
    assert result.total_bytes == len(data)
    assert result.truncated == (len(data) > cap)
    if use_on_output:
        assert recorder.text("stdout") == result.text
        assert recorder.chunks("stderr") == []


@settings(max_examples=300, deadline=None)
@given(
    text=TEXT,
    cap_extra=st.integers(min_value=-50, max_value=20),
    split_points=st.lists(st.integers(min_value=0, max_value=1000), max_size=30),
)
def test_on_output_receives_whole_lines_only(text: str, cap_extra: int, split_points: list[int]) -> None:
    data = text.encode()
    cap = max(1, len(data) + cap_extra)
    recorder = Recorder()
    capture = OutputCapture(cap, recorder)
    feed_all(capture, "stdout", split_at(data, split_points))
    result = capture.finish()["stdout"]

    chunks = recorder.chunks("stdout")
    assert "".join(chunks) == result.text
    assert_whole_lines(chunks)


def test_lines_are_split_only_at_newline() -> None:
    # A carriage return (progress bars), form feed, vertical tab or U+2028 does not end a line.
    recorder = Recorder()
    capture = OutputCapture(1000, recorder)
    line = "progress 10%\rprogress 20%\rdone\x0bpage\x0cnext\u2028same line\x85too\n"
    capture.feed("stdout", line.encode())
    assert recorder.chunks("stdout") == [line]
    capture.finish()
    assert recorder.chunks("stdout") == [line]


# --------------------------------------------------------------------------------------------------
# OutputCapture: streaming to on_output


def test_on_output_gets_lines_as_they_complete() -> None:
    recorder = Recorder()
    capture = OutputCapture(1000, recorder)
    capture.feed("stdout", b"hel")
    assert recorder.calls == []
    capture.feed("stdout", b"lo\nwor")
    assert recorder.chunks("stdout") == ["hello\n"]
    capture.feed("stdout", b"ld\nline3\nline4\npart")
    assert "".join(recorder.chunks("stdout")) == "hello\nworld\nline3\nline4\n"
    assert_whole_lines([*recorder.chunks("stdout"), ""])
    result = capture.finish()
    assert recorder.text("stdout") == "hello\nworld\nline3\nline4\npart"
    assert recorder.chunks("stdout")[-1].endswith("part")
    assert result["stdout"].text == recorder.text("stdout")


def test_on_output_line_split_inside_a_multibyte_character() -> None:
    recorder = Recorder()
    capture = OutputCapture(1000, recorder)
    data = f"caf{E_ACUTE} {EURO}{GRIN}\n".encode()
    for piece in byte_by_byte(data):
        capture.feed("stdout", piece)
    assert recorder.chunks("stdout") == [f"caf{E_ACUTE} {EURO}{GRIN}\n"]


def test_interleaved_streams_keep_per_stream_order() -> None:
    recorder = Recorder()
    capture = OutputCapture(MiB, recorder)
    expected: dict[Stream, str] = {"stdout": "", "stderr": ""}
    for i in range(200):
        stream: Stream = "stdout" if i % 3 else "stderr"
        line = f"{stream} line {i}\n"
        # feed each line in two pieces, so a stream's partial line waits while the other stream moves on
        capture.feed(stream, line[:4].encode())
        other: Stream = "stderr" if stream == "stdout" else "stdout"
        capture.feed(other, f"{other} {i}\n".encode())
        capture.feed(stream, line[4:].encode())
        expected[stream] += line
        expected[other] += f"{other} {i}\n"
    result = capture.finish()
    for s in ("stdout", "stderr"):
        assert result[s].text == expected[s]
        assert recorder.text(s) == expected[s]
        assert_whole_lines(recorder.chunks(s))
        assert all(chunk.endswith("\n") for chunk in recorder.chunks(s))


def test_concurrent_feeding_from_two_threads() -> None:
    recorder = Recorder()
    capture = OutputCapture(MiB, recorder)
    lines = 2000

    def writer(stream: Stream) -> None:
        for i in range(lines):
            capture.feed(stream, f"{stream} {i}\n".encode())

    threads = [threading.Thread(target=writer, args=(s,)) for s in ("stdout", "stderr")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    result = capture.finish()
    for s in ("stdout", "stderr"):
        expected = "".join(f"{s} {i}\n" for i in range(lines))
        assert result[s].text == expected
        assert recorder.text(s) == expected
    assert recorder.overlapping_calls == 0


def test_on_output_never_sees_bytes_past_the_cap() -> None:
    recorder = Recorder()
    capture = OutputCapture(12, recorder)
    capture.feed("stdout", b"line one\nline two\nline three\n")
    capture.feed("stdout", b"and more\n")
    result = capture.finish()["stdout"]
    assert result.data == b"line one\nlin"
    assert recorder.text("stdout") == "line one\nlin"
    assert recorder.chunks("stdout") == ["line one\n", "lin"]


def test_on_output_never_sees_a_character_straddling_the_cap() -> None:
    recorder = Recorder()
    capture = OutputCapture(3, recorder)
    for piece in byte_by_byte(f"a{EURO}b\n".encode()):
        capture.feed("stdout", piece)
    result = capture.finish()["stdout"]
    assert result.data == b"a"
    assert recorder.text("stdout") == "a"
    assert "\ufffd" not in recorder.text("stdout")


def test_on_output_matches_kept_text_for_invalid_utf8_at_the_cap() -> None:
    # Invalid bytes straddling the cap: whatever the kept bytes are, on_output must have seen exactly
    # their (lossy) decoding, and the complete ASCII characters before the cap must be kept.
    recorder = Recorder()
    capture = OutputCapture(3, recorder)
    capture.feed("stdout", b"ab")
    capture.feed("stdout", b"\x80\x80")
    result = capture.finish()["stdout"]
    assert result.data.startswith(b"ab")
    assert result.total_bytes == 4
    assert recorder.text("stdout") == result.text


def test_finish_flushes_partial_line_and_is_idempotent() -> None:
    recorder = Recorder()
    capture = OutputCapture(100, recorder)
    capture.feed("stdout", b"done\nno newline")
    capture.feed("stderr", b"err tail")
    assert recorder.calls == [("stdout", "done\n")]

    first = capture.finish()
    assert recorder.chunks("stdout") == ["done\n", "no newline"]
    assert recorder.chunks("stderr") == ["err tail"]
    calls_after_first = list(recorder.calls)

    second = capture.finish()
    assert recorder.calls == calls_after_first
    assert second == first
    assert second["stdout"].text == "done\nno newline"
    assert second["stderr"].text == "err tail"


def test_finish_without_on_output() -> None:
    capture = OutputCapture(5)
    capture.feed("stdout", b"hello world")
    result = capture.finish()
    assert result["stdout"].data == b"hello"
    assert capture.finish() == result


def test_very_long_line_without_newline_is_delivered_before_finish() -> None:
    recorder = Recorder()
    capture = OutputCapture(MiB, recorder)
    total = 300 * 1024
    for _ in range(total // 4096):
        capture.feed("stdout", b"x" * 4096)
    delivered_before_finish = len(recorder.text("stdout"))
    # at most one pending (not yet delivered) partial line of bounded size
    assert delivered_before_finish > 0
    assert total - delivered_before_finish <= 64 * 1024 + 4096
    result = capture.finish()
    assert recorder.text("stdout") == "x" * total
    assert result["stdout"].text == "x" * total


# --------------------------------------------------------------------------------------------------
# PipeReader over real pipes


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def test_pipe_reader_two_writers_in_order_per_stream() -> None:
    recorder = Recorder()
    capture = OutputCapture(MiB, recorder)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    reader = start_pipe_reader({"stdout": out_r, "stderr": err_r}, capture)
    lines = 3000
    start = threading.Barrier(2)

    def writer(fd: int, name: str) -> None:
        try:
            start.wait(10)
            for i in range(lines):
                # sometimes a line in two writes, so the reader sees partial lines
                line = f"{name} line {i:05d}\n".encode()
                if i % 7 == 0:
                    _write_all(fd, line[:5])
                    _write_all(fd, line[5:])
                else:
                    _write_all(fd, line)
        finally:
            os.close(fd)

    threads = [
        threading.Thread(target=writer, args=(out_w, "out")),
        threading.Thread(target=writer, args=(err_w, "err")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    assert reader.finish(60) is True
    assert reader.error is None

    result = capture.finish()
    for stream, name in (("stdout", "out"), ("stderr", "err")):
        expected = "".join(f"{name} line {i:05d}\n" for i in range(lines))
        assert result[stream].text == expected
        assert result[stream].truncated is False
        assert recorder.text(stream) == expected
        assert all(chunk.endswith("\n") for chunk in recorder.chunks(stream))


FLOOD_BYTES = 300_000_000
FLOOD_CAP = 4 * 1024


def _flood_with_subprocess(write_fd: int) -> tuple[Callable[[], bool], Callable[[], None]]:
    proc = subprocess.Popen(["head", "-c", str(FLOOD_BYTES), "/dev/zero"], stdout=write_fd)

    def wait() -> bool:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            return False
        return proc.returncode == 0

    def kill() -> None:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    return wait, kill


def _flood_with_thread(write_fd: int) -> tuple[Callable[[], bool], Callable[[], None]]:
    block = b"\0" * MiB
    done = threading.Event()

    def run() -> None:
        remaining = FLOOD_BYTES
        try:
            while remaining:
                n = min(remaining, len(block))
                _write_all(write_fd, block[:n] if n < len(block) else block)
                remaining -= n
            done.set()
        except OSError:
            pass
        finally:
            os.close(write_fd)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def wait() -> bool:
        thread.join(60)
        return done.is_set()

    def kill() -> None:
        pass  # the thread ends with a broken pipe once the reader closed its end

    return wait, kill


@pytest.mark.parametrize("writer", ["subprocess", "thread"])
def test_pipe_reader_flood_is_drained_with_flat_memory(writer: str) -> None:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    os.close(err_w)  # stderr: immediate end of file
    capture = OutputCapture(FLOOD_CAP)

    tracemalloc.start()
    kill: Callable[[], None] | None = None
    try:
        baseline, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        started = time.monotonic()
        reader = start_pipe_reader({"stdout": out_r, "stderr": err_r}, capture)
        if writer == "subprocess":
            wait, kill = _flood_with_subprocess(out_w)
            os.close(out_w)  # the child holds the only write end now
        else:
            wait, kill = _flood_with_thread(out_w)  # the thread closes out_w when done

        assert wait(), "the writer blocked: the reader did not drain the pipe"
        assert reader.finish(60) is True
        elapsed = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        if kill is not None:
            kill()

    assert elapsed < 60
    assert reader.error is None
    result = capture.finish()
    assert result["stdout"].total_bytes == FLOOD_BYTES
    assert result["stdout"].truncated is True
    assert result["stdout"].data == b"\0" * FLOOD_CAP
    assert result["stderr"].total_bytes == 0
    assert peak - baseline < 16 * MiB, f"memory grew by {(peak - baseline) / MiB:.1f} MiB"


def test_pipe_reader_finish_returns_when_a_writer_never_closes() -> None:
    capture = OutputCapture(MiB)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    reader = start_pipe_reader({"stdout": out_r, "stderr": err_r}, capture)
    try:
        os.close(err_w)  # stderr ends normally
        _write_all(out_w, b"early\n")
        _write_all(out_w, b"just before finish\n")
        grace = 0.3
        started = time.monotonic()
        ended = reader.finish(grace)
        elapsed = time.monotonic() - started
    finally:
        os.close(out_w)

    assert ended is False
    assert elapsed >= grace * 0.9  # it did wait for the grace period
    assert elapsed < 10  # ...but did not hang on the still-open pipe
    assert reader.error is None
    result = capture.finish()
    assert result["stdout"].text == "early\njust before finish\n"
    assert result["stderr"].text == ""


def test_pipe_reader_finish_returns_while_a_writer_keeps_writing() -> None:
    capture = OutputCapture(FLOOD_CAP)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    reader = start_pipe_reader({"stdout": out_r, "stderr": err_r}, capture)
    proc = subprocess.Popen(["cat", "/dev/zero"], stdout=out_w)
    os.close(out_w)
    outcome: list[bool] = []
    finisher = threading.Thread(target=lambda: outcome.append(reader.finish(0.3)), daemon=True)
    try:
        finisher.start()
        finisher.join(30)
        assert not finisher.is_alive(), "PipeReader.finish hung on a pipe that never stops producing"
    finally:
        proc.kill()
        proc.wait()
        os.close(err_w)
        finisher.join(30)
    assert outcome == [False]
    assert capture.finish()["stdout"].data == b"\0" * FLOOD_CAP


def test_pipe_reader_closes_its_read_ends() -> None:
    capture = OutputCapture(MiB)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    reader = PipeReader({"stdout": out_r, "stderr": err_r}, capture)
    reader.start()
    try:
        _write_all(out_w, b"x\n")
        os.close(err_w)
        assert reader.finish(0.2) is False  # stdout is still open on our side
        with pytest.raises(BrokenPipeError):
            os.write(out_w, b"after the reader stopped\n")
    finally:
        _close_quietly(out_w)
    assert capture.finish()["stdout"].text == "x\n"


def test_pipe_reader_reads_in_bounded_chunks() -> None:
    # The reader never reads more than CHUNK_SIZE per call: chunks handed to the capture are bounded.
    sizes: list[int] = []

    class SpyCapture(OutputCapture):
        def feed(self, stream: Stream, chunk: bytes) -> None:
            sizes.append(len(chunk))
            super().feed(stream, chunk)

    capture = SpyCapture(FLOOD_CAP)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    os.close(err_w)
    reader = start_pipe_reader({"stdout": out_r, "stderr": err_r}, capture)
    writer = threading.Thread(target=lambda: (_write_all(out_w, b"y" * (4 * MiB)), os.close(out_w)))
    writer.start()
    writer.join(60)
    assert not writer.is_alive()
    assert reader.finish(60) is True
    assert sum(sizes) == 4 * MiB
    assert max(sizes) <= CHUNK_SIZE
    assert capture.finish()["stdout"].total_bytes == 4 * MiB


# -- keep_tail: the head and the end of a stream ------------------------------------------------------


def captured_with_tail(chunks: Sequence[bytes], cap: int) -> tuple[str, list[str], bool, int]:
    got: list[str] = []
    capture = OutputCapture(cap, lambda _stream, text: got.append(text), keep_tail=True)
    for chunk in chunks:
        capture.feed("stdout", chunk)
    stream = capture.finish()["stdout"]
    return stream.text, got, stream.truncated, stream.omitted


def test_keep_tail_keeps_the_first_and_the_last_half_with_an_omission_line() -> None:
    data = b"".join(b"line %04d\n" % i for i in range(1000))  # 10 bytes a line
    text, streamed, truncated, omitted = captured_with_tail(
        [data[i : i + 777] for i in range(0, len(data), 777)], 100
    )
    assert text == (
        "line 0000\nline 0001\nline 0002\nline 0003\nline 0004\n"
        "[... 9900 bytes omitted ...]\n"
        "line 0995\nline 0996\nline 0997\nline 0998\nline 0999\n"
    )
    assert truncated and omitted == 9900
    assert "".join(streamed) == text  # on_output saw exactly the result, the tail at the end
    assert all(part.endswith("\n") for part in streamed)


def test_keep_tail_without_overflow_keeps_everything_and_adds_no_line() -> None:
    text, streamed, truncated, omitted = captured_with_tail([b"x" * 60, b"y" * 40], 100)
    assert text == "x" * 60 + "y" * 40 and not truncated and omitted == 0
    assert "".join(streamed) == text


def test_keep_tail_omission_line_starts_on_its_own_line() -> None:
    text, _, _, _ = captured_with_tail([b"a" * 200], 10)
    assert text == "aaaaa\n[... 190 bytes omitted ...]\naaaaa"


def test_keep_tail_never_splits_a_character_and_loses_none_that_fit() -> None:
    # A 3-byte character straddles the head boundary (cap 10: head 5, tail 5) and everything fits.
    text, _, truncated, _ = captured_with_tail([b"abcd" + EURO.encode() + b"xy"], 10)
    assert text == "abcd" + EURO + "xy" and not truncated
    # Far beyond the cap, the tail starts on a character boundary.
    text, _, truncated, _ = captured_with_tail([(EURO * 100).encode()], 10)
    assert truncated and text.endswith("\n" + EURO) and "\ufffd" not in text, text


@given(st.binary(max_size=3000), st.integers(min_value=1, max_value=300), st.lists(st.integers(0, 3000)))
@settings(max_examples=200, deadline=None)
def test_keep_tail_is_a_head_and_a_suffix_of_what_was_fed(data: bytes, cap: int, splits: list[int]) -> None:
    capture = OutputCapture(cap, keep_tail=True)
    points = sorted({0, len(data), *[p for p in splits if p <= len(data)]})
    for start, end in itertools.pairwise(points):
        capture.feed("stdout", data[start:end])
    stream = capture.finish()["stdout"]
    assert len(stream.data) <= cap - cap // 2 and len(stream.tail) <= cap // 2
    assert data.startswith(stream.data) and data.endswith(stream.tail)
    assert stream.total_bytes == len(data) and stream.omitted == len(data) - len(stream.data) - len(
        stream.tail
    )
    if len(data) <= cap and b"\x80" not in data and all(b < 0x80 for b in data):
        assert stream.data + stream.tail == data and not stream.truncated


def test_keep_tail_flood_holds_only_the_window() -> None:
    capture = OutputCapture(64 * 1024, keep_tail=True)
    chunk = b"z" * CHUNK_SIZE
    tracemalloc.start()
    try:
        for _ in range(2000):  # 128 MiB
            capture.feed("stdout", chunk)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    stream = capture.finish()["stdout"]
    assert len(stream.data) + len(stream.tail) == 64 * 1024 and stream.omitted == 2000 * CHUNK_SIZE - 65536
    assert peak < 4 * 1024 * 1024, peak


def test_head_mode_is_unchanged_by_the_tail_option() -> None:
    capture = OutputCapture(10)
    capture.feed("stdout", b"a" * 50)
    stream = capture.finish()["stdout"]
    assert stream.text == "a" * 10 and stream.tail == b"" and stream.omitted == 40
