"""The agent channel's framing (protocol version 1): a table of frames, and the decoder fuzzed."""

from __future__ import annotations

import contextlib
import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adk_sandbox.executor.channel.frames import (
    CONNECTION_BASE,
    HEADER,
    HOST_TO_AGENT,
    MAX_CREDIT,
    MAX_PAYLOAD,
    PROXY_VERSION,
    WINDOW,
    FrameDecoder,
    FrameType,
    ProtocolError,
    encode,
    split_entries,
    validate_result_for,
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
        (HELLO + raw(6, 1, json.dumps({**EXIT, "oom_kills": -1}).encode()), "oom_kills"),
        (HELLO + raw(6, 1, json.dumps({**EXIT, "oom_kills": True}).encode()), "oom_kills"),
        (HELLO + raw(6, 1, json.dumps({**EXIT, "oom_kills": "1"}).encode()), "oom_kills"),
        (HELLO + raw(12, 1, b"[]"), "not an object"),
        (HELLO + raw(12, 1, b'{"error": "ENOENT"}'), "RESULT error"),
        (HELLO + raw(12, 1, b'{"error": {"errno": "2", "name": "ENOENT", "message": ""}}'), "RESULT error"),
        (HELLO + raw(12, 1, b'{"error": {"errno": true, "name": "ENOENT", "message": ""}}'), "RESULT error"),
        (HELLO + raw(12, 1, b'{"error": {"errno": 2, "name": 2, "message": ""}}'), "RESULT error"),
        (HELLO + raw(12, 1, b'{"error": {"errno": 2, "name": "ENOENT"}}'), "RESULT error"),
        (HELLO + raw(12, 1, b'{"error": null}'), "RESULT error"),
        (HELLO + raw(12, 0, b"{}"), "on channel 0"),
        (HELLO + raw(11, 1, b"{}"), "not allowed in this direction"),  # FILE: host to agent only
        (raw(1, 0, b'{"protocol": 1, "pid": 1, "subreaper": true, "agent": 1}'), "agent"),
        (raw(1, 0, b'{"protocol": 1, "pid": 1, "subreaper": true, "ops": "read"}'), "ops"),
        (raw(1, 0, b'{"protocol": 1, "pid": 1, "subreaper": true, "ops": ["read", 2]}'), "ops"),
    ],
)
def test_protocol_errors(stream: bytes, message: str) -> None:
    decoder = FrameDecoder()
    with pytest.raises(ProtocolError, match=message):
        decoder.feed(stream)
    with pytest.raises(ProtocolError):  # failed for good
        decoder.feed(HELLO)


def test_the_optional_keys_are_accepted_and_may_be_absent() -> None:
    hello = {"protocol": 1, "pid": 7, "subreaper": False, "agent": "static", "ops": ["read", "stat"]}
    stream = (
        encode(FrameType.HELLO, 0, hello)
        + encode(FrameType.EXIT, 1, {**EXIT, "oom_kills": 2})
        + encode(FrameType.EXIT, 2, {**EXIT, "oom_kills": None})
        + encode(FrameType.EXIT, 3, EXIT)
        + encode(FrameType.STDOUT, 4, b"data")
        + encode(FrameType.RESULT, 4, {"size": 4})
        + encode(FrameType.RESULT, 5, {"error": {"errno": 2, "name": "ENOENT", "message": "No such file"}})
    )
    frames = FrameDecoder().feed(stream)
    assert frames[0].body == hello
    assert [f.body.get("oom_kills") for f in frames[1:4] if f.body is not None] == [2, None, None]
    assert frames[5].body == {"size": 4}
    assert frames[6].body is not None and frames[6].body["error"]["name"] == "ENOENT"


STAT = {"type": "file", "size": 3, "mode": 0o644, "mtime": 1.5, "uid": 1000, "gid": 1000}
ERROR_RESULT = {"error": {"errno": 13, "name": "EACCES", "message": "Permission denied"}}


@pytest.mark.parametrize(
    ("op", "body", "data"),
    [
        ("read", {"size": 10}, b"0123"),
        ("read", ERROR_RESULT, b""),
        ("write", {"size": 0}, b""),
        ("stat", STAT, b""),
        ("stat", {**STAT, "type": "symlink", "mtime": 2}, b""),
        ("list", {"count": 0}, b""),
        ("list", {"count": 3}, b"fa\0d\xff\xfe\0l.x\0"),
        ("mkdir", {}, b""),
        ("remove", ERROR_RESULT, b""),
        ("rename", {}, b""),
    ],
)
def test_results_that_fit_their_op(op: str, body: dict[str, object], data: bytes) -> None:
    validate_result_for(op, body, data)


@pytest.mark.parametrize(
    ("op", "body", "data", "message"),
    [
        ("read", {}, b"", "size"),
        ("read", {"size": -1}, b"", "size"),
        ("write", {"size": "3"}, b"", "size"),
        ("write", {"size": 3}, b"x", "sent data"),
        ("stat", {**STAT, "type": "fifo"}, b"", "type"),
        ("stat", {**STAT, "uid": None}, b"", "uid"),
        ("stat", {**STAT, "mtime": True}, b"", "mtime"),
        ("list", {"count": 2}, b"fa\0", "count"),
        ("list", {"count": 1}, b"fa", "NUL"),
        ("list", {"count": 1}, b"xa\0", "entry"),
        ("list", {"count": 1}, b"f\0", "entry"),
        ("list", {"count": 1}, b"d..\0", "entry"),
        ("list", {"count": 1}, b"fa/b\0", "entry"),
        ("mkdir", ERROR_RESULT, b"junk", "sent data"),
    ],
)
def test_results_that_do_not_fit_their_op(
    op: str, body: dict[str, object], data: bytes, message: str
) -> None:
    with pytest.raises(ProtocolError, match=message):
        validate_result_for(op, body, data)


def test_list_entries_keep_non_utf8_names() -> None:
    assert split_entries(b"f\xff\xfename\0ll\n\0o.x\0") == [
        ("f", b"\xff\xfename"),
        ("l", b"l\n"),
        ("o", b".x"),
    ]


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
    st.tuples(
        st.just(FrameType.EXIT),
        st.integers(1, 9),
        st.builds(lambda n: {**EXIT, "oom_kills": n}, st.none() | st.integers(0, 2**40)),
    ),
    st.tuples(
        st.just(FrameType.RESULT),
        st.integers(1, 9),
        st.one_of(
            st.dictionaries(st.text(max_size=5).filter(lambda k: k != "error"), st.integers(), max_size=3),
            st.builds(
                lambda n, name, msg: {"error": {"errno": n, "name": name, "message": msg}},
                st.integers(0, 4095),
                st.text(max_size=10),
                st.text(max_size=30),
            ),
        ),
    ),
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


result_like = st.one_of(
    st.dictionaries(st.text(max_size=6), st.none() | st.booleans() | st.integers() | st.text(max_size=5)),
    st.fixed_dictionaries(
        {
            "error": st.one_of(
                st.none(),
                st.integers(),
                st.dictionaries(
                    st.sampled_from(["errno", "name", "message", "x"]),
                    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                ),
            )
        }
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    result_like,
    st.sampled_from(["read", "write", "stat", "list", "mkdir", "remove", "rename"]),
    st.binary(max_size=40),
)
def test_fuzzed_results_are_accepted_only_when_well_formed(
    body: dict[str, object], op: str, data: bytes
) -> None:
    """A RESULT decodes only when its error is well formed; checking it against an op never crashes."""
    decoder = FrameDecoder()
    decoder.feed(HELLO)
    try:
        frames = decoder.feed(encode(FrameType.RESULT, 1, body))
    except ProtocolError:
        error = body.get("error")
        assert "error" in body and not (
            isinstance(error, dict)
            and type(error.get("errno")) is int
            and isinstance(error.get("name"), str)
            and isinstance(error.get("message"), str)
        )
        return
    assert frames[0].body == body
    with contextlib.suppress(ProtocolError):
        validate_result_for(op, body, data)


# -- connections (the proxy endpoint) --------------------------------------------------------------------
CONN = CONNECTION_BASE + 5


def test_connection_frames_decode_on_connection_channels() -> None:
    stream = (
        encode(FrameType.HELLO, 0, {"protocol": 1, "pid": 7, "subreaper": True, "proxy": PROXY_VERSION})
        + encode(FrameType.RESULT, 1, {"port": 3128})
        + encode(FrameType.OPEN, CONN, {"listener": 1})
        + encode(FrameType.DATA, CONN, b"CONNECT a:443 HTTP/1.1\r\n\r\n")
        + encode(FrameType.DATA, CONN, b"")
        + encode(FrameType.CREDIT, CONN, {"bytes": WINDOW})
        + encode(FrameType.CLOSE, CONN, {"error": "reset"})
    )
    frames = FrameDecoder().feed(stream)
    assert [f.type for f in frames[2:]] == [
        FrameType.OPEN,
        FrameType.DATA,
        FrameType.DATA,
        FrameType.CREDIT,
        FrameType.CLOSE,
    ]
    assert frames[3].data.startswith(b"CONNECT") and frames[4].data == b""
    host_side = FrameDecoder(HOST_TO_AGENT).feed(
        encode(FrameType.LISTEN, 3, {"port": 0})
        + encode(FrameType.DATA, CONN, b"HTTP/1.1 200 OK\r\n\r\n")
        + encode(FrameType.CREDIT, CONN, {"bytes": 1})
        + encode(FrameType.CLOSE, CONN, {})
    )
    assert [(f.type, f.channel) for f in host_side] == [
        (FrameType.LISTEN, 3),
        (FrameType.DATA, CONN),
        (FrameType.CREDIT, CONN),
        (FrameType.CLOSE, CONN),
    ]


@pytest.mark.parametrize(
    ("stream", "message"),
    [
        (HELLO + raw(14, 7, b'{"listener": 1}'), "on a host channel"),  # OPEN in the host's space
        (HELLO + raw(15, 7, b"x"), "on a host channel"),
        (HELLO + raw(16, 7, b'{"bytes": 1}'), "on a host channel"),
        (HELLO + raw(6, CONN, json.dumps(EXIT).encode()), "on a connection channel"),
        (HELLO + raw(12, CONN, b"{}"), "on a connection channel"),
        (HELLO + raw(14, CONN, b'{"listener": 0}'), "OPEN listener"),
        (HELLO + raw(14, CONN, b'{"listener": "1"}'), "OPEN listener"),
        (HELLO + raw(14, CONN, json.dumps({"listener": CONN}).encode()), "OPEN listener"),
        (HELLO + raw(16, CONN, b'{"bytes": 0}'), "CREDIT bytes"),
        (HELLO + raw(16, CONN, b'{"bytes": true}'), "CREDIT bytes"),
        (HELLO + raw(16, CONN, json.dumps({"bytes": MAX_CREDIT + 1}).encode()), "CREDIT bytes"),
        (HELLO + raw(17, CONN, b'{"error": 5}'), "CLOSE error"),
        (HELLO + raw(17, CONN, b"[]"), "not an object"),
        (HELLO + raw(13, 1, b'{"port": 1}'), "not allowed in this direction"),  # LISTEN: host to agent
        (raw(1, 0, b'{"protocol": 1, "pid": 1, "subreaper": true, "proxy": "1"}'), "proxy"),
        (raw(1, 0, b'{"protocol": 1, "pid": 1, "subreaper": true, "proxy": -1}'), "proxy"),
    ],
)
def test_connection_protocol_errors(stream: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        FrameDecoder().feed(stream)


@pytest.mark.parametrize("port", [-1, 65536, "80", None, 1.5])
def test_a_listen_port_out_of_range_is_refused(port: object) -> None:
    with pytest.raises(ProtocolError, match="LISTEN port"):
        FrameDecoder(HOST_TO_AGENT).feed(encode(FrameType.LISTEN, 1, {"port": port}))
