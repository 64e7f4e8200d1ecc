"""The agent channel's framing (protocol version 1): a table of frames, and the decoder fuzzed."""

from __future__ import annotations

import contextlib
import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from executor.backends.docker._frames import (
    HEADER,
    HOST_TO_AGENT,
    MAX_PAYLOAD,
    FrameDecoder,
    FrameType,
    ProtocolError,
    encode,
)

HELLO = encode(FrameType.HELLO, 0, {"protocol": 1, "pid": 7, "subreaper": True})
EXIT = {"exit_code": 0, "signal": None, "timed_out": False, "stdout_dropped": 0, "stderr_dropped": 3}


def raw(kind: int, channel: int, payload: bytes, flags: int = 0, reserved: int = 0) -> bytes:
    return struct.pack(">BBHII", kind, flags, reserved, channel, len(payload)) + payload


def test_a_session_decodes_in_order_whatever_the_chunking() -> None:
    stream = (
        HELLO
        + encode(FrameType.STDOUT, 1, b"out")
        + encode(FrameType.STDERR, 2, b"")
        + encode(FrameType.EXIT, 1, EXIT)
        + encode(FrameType.ERROR, 2, {"message": "no such program"})
        + encode(FrameType.PONG, 0, {})
    )
    whole = FrameDecoder().feed(stream)
    assert [(f.type, f.channel) for f in whole] == [
        (FrameType.HELLO, 0),
        (FrameType.STDOUT, 1),
        (FrameType.STDERR, 2),
        (FrameType.EXIT, 1),
        (FrameType.ERROR, 2),
        (FrameType.PONG, 0),
    ]
    assert whole[1].data == b"out"
    assert whole[3].body == EXIT
    decoder = FrameDecoder()
    byte_by_byte = [frame for i in range(len(stream)) for frame in decoder.feed(stream[i : i + 1])]
    assert byte_by_byte == whole


@pytest.mark.parametrize(
    ("stream", "message"),
    [
        (encode(FrameType.STDOUT, 1, b"x"), "before HELLO"),
        (HELLO + HELLO, "second HELLO"),
        (HELLO + raw(42, 1, b""), "unknown frame type"),
        (HELLO + raw(4, 1, b"", flags=1), "must be 0"),
        (HELLO + raw(4, 1, b"", reserved=1), "must be 0"),
        (HELLO + struct.pack(">BBHII", 4, 0, 0, 1, MAX_PAYLOAD + 1), "exceeds"),
        (HELLO + raw(6, 1, b"[1, 2]"), "not an object"),
        (HELLO + raw(6, 1, b"\xff\xfe"), "not valid JSON"),
        (HELLO + raw(6, 1, b"{bad json"), "not valid JSON"),
        (HELLO + raw(6, 1, b'{"exit_code": NaN}'), "not valid JSON"),
        (HELLO + raw(6, 1, json.dumps({**EXIT, "exit_code": "0"}).encode()), "exit_code"),
        (HELLO + raw(6, 1, json.dumps({**EXIT, "exit_code": 999}).encode()), "exit_code"),
        (HELLO + raw(6, 1, json.dumps({**EXIT, "timed_out": 1}).encode()), "timed_out"),
        (HELLO + raw(6, 1, json.dumps({**EXIT, "stdout_dropped": -1}).encode()), "stdout_dropped"),
        (HELLO + raw(10, 1, b"{}"), "message"),
        (HELLO + raw(2, 1, b"{}"), "not allowed in this direction"),  # RUN: host to agent only
        (HELLO + raw(4, 0, b"x"), "on channel 0"),
        (HELLO + raw(9, 3, b"{}"), "on channel 3"),
        (raw(1, 0, b'{"protocol": 2, "pid": 1, "subreaper": true}'), "protocol"),
        (raw(1, 0, b'{"protocol": 1, "pid": "1", "subreaper": true}'), "pid"),
        (HELLO + raw(6, 1, b"[" * 100_000), "not valid JSON"),
    ],
)
def test_protocol_errors(stream: bytes, message: str) -> None:
    decoder = FrameDecoder()
    with pytest.raises(ProtocolError, match=message):
        decoder.feed(stream)
    with pytest.raises(ProtocolError):  # failed for good
        decoder.feed(HELLO)


def test_the_agent_side_accepts_host_frames() -> None:
    decoder = FrameDecoder(HOST_TO_AGENT)
    frames = decoder.feed(encode(FrameType.RUN, 5, {"argv": ["true"]}) + encode(FrameType.KILL, 5))
    assert [(f.type, f.body) for f in frames] == [(FrameType.RUN, {"argv": ["true"]}), (FrameType.KILL, {})]


def test_encode_refuses_oversized_payloads() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        encode(FrameType.STDOUT, 1, b"x" * (MAX_PAYLOAD + 1))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=20), st.booleans())
def test_arbitrary_bytes_only_ever_give_a_protocol_error(chunks: list[bytes], after_hello: bool) -> None:
    decoder = FrameDecoder()
    if after_hello:
        decoder.feed(HELLO)
    try:
        for chunk in chunks:
            decoder.feed(chunk)
            assert decoder.buffered <= HEADER.size + MAX_PAYLOAD
    except ProtocolError:
        pass


frame_strategy = st.one_of(
    st.tuples(
        st.sampled_from([FrameType.STDOUT, FrameType.STDERR]),
        st.integers(1, 2**32 - 1),
        st.binary(max_size=200),
    ),
    st.tuples(st.just(FrameType.EXIT), st.integers(1, 9), st.just(EXIT)),
    st.tuples(st.just(FrameType.PONG), st.just(0), st.dictionaries(st.text(max_size=5), st.integers())),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(frame_strategy, max_size=15), st.integers(1, 64), st.binary(max_size=64))
def test_valid_streams_round_trip_and_a_corrupted_tail_never_crashes(
    frames: list[tuple[FrameType, int, bytes | dict[str, object]]], cut: int, garbage: bytes
) -> None:
    stream = HELLO + b"".join(encode(kind, channel, payload) for kind, channel, payload in frames)
    decoder = FrameDecoder()
    decoded = []
    for i in range(0, len(stream), cut):
        decoded += decoder.feed(stream[i : i + cut])
    assert len(decoded) == len(frames) + 1
    for frame, (kind, channel, payload) in zip(decoded[1:], frames, strict=True):
        assert (frame.type, frame.channel) == (kind, channel)
        assert (frame.data if isinstance(payload, bytes) else frame.body) == payload
    with contextlib.suppress(ProtocolError):
        decoder.feed(garbage)
    assert decoder.buffered <= HEADER.size + MAX_PAYLOAD
