"""The pods/exec channel: the v4/v5 codec, and the bridge under the agent channel, against recorded frames.

The stub websocket replays server messages recorded in tests/unit/fixtures/k8s/exec_recordings.json
(written from the channel.k8s.io protocol as the kubernetes client's ws_client.py implements it) and
records what the client sends. The last test runs a command through the agent channel's real
``AgentTransport`` over the bridge, with a stub server that answers like an agent.
"""

from __future__ import annotations

import json
import queue
import time
from pathlib import Path
from typing import Any

import pytest

from adk_sandbox.executor._output import OutputCapture
from adk_sandbox.executor.backends.kubernetes._channel import (
    ChannelProtocol,
    ChannelProtocolError,
    decode,
    encode_close,
    encode_stdin,
    negotiated,
    parse_status,
)
from adk_sandbox.executor.backends.kubernetes._exec import ExecBridge
from adk_sandbox.executor.channel.agent_transport import AgentTransport
from adk_sandbox.executor.channel.frames import HOST_TO_AGENT, FrameDecoder, FrameType, encode
from adk_sandbox.executor.channel.static_agent import AgentLaunch
from adk_sandbox.executor.channel.transport import PreparedCommand

RECORDINGS = json.loads((Path(__file__).parent / "fixtures" / "k8s" / "exec_recordings.json").read_text())


class StubWebSocket:
    """Replays server messages (``script``), or answers through ``on_send``; records what it is sent."""

    def __init__(self, subprotocol: str | None, script: list[bytes] = (), on_send: Any = None) -> None:  # type: ignore[assignment]
        self.subprotocol = subprotocol
        self.sent: list[bytes] = []
        self.closed = False
        self._inbox: queue.Queue[bytes | None] = queue.Queue()
        for message in script:
            self._inbox.put(message)
        self._on_send = on_send

    def push(self, message: bytes | None) -> None:
        self._inbox.put(message)

    def send_binary(self, data: bytes) -> None:
        if self.closed:
            raise ConnectionError("closed")
        self.sent.append(data)
        if self._on_send is not None:
            self._on_send(self, data)

    def recv_message(self) -> bytes | None:
        return self._inbox.get()

    def close(self) -> None:
        self.closed = True
        self._inbox.put(None)


def read_all(bridge: ExecBridge) -> dict[int, bytes]:
    """What the bridge gives the agent channel to its end, by stream number (1 stdout, 2 stderr)."""
    streams: dict[int, bytes] = {}
    while (pieces := bridge.read()) is not None:
        for stream, piece in pieces:
            number = 1 if stream == "stdout" else 2
            streams[number] = streams.get(number, b"") + piece
    return streams


# -- the codec -----------------------------------------------------------------------------------------
def test_negotiation_prefers_nothing_but_what_the_server_chose() -> None:
    assert negotiated("v5.channel.k8s.io") is ChannelProtocol.V5
    assert negotiated("v4.channel.k8s.io") is ChannelProtocol.V4
    for other in (None, "", "channel.k8s.io", "base64.channel.k8s.io", "v3.channel.k8s.io"):
        with pytest.raises(ChannelProtocolError, match="subprotocol"):
            negotiated(other)


def test_encoding() -> None:
    assert encode_stdin(b"abc") == b"\x00abc"
    assert encode_close(ChannelProtocol.V5) == b"\xff\x00"
    with pytest.raises(ValueError, match="cannot close"):
        encode_close(ChannelProtocol.V4)


@pytest.mark.parametrize(
    ("message", "protocol", "kind", "stream", "data"),
    [
        (b"\x01hi", ChannelProtocol.V4, "data", 1, b"hi"),
        (b"\x02err", ChannelProtocol.V5, "data", 2, b"err"),
        (b"\xff\x01", ChannelProtocol.V5, "close", 1, b""),
    ],
)
def test_decoding(message: bytes, protocol: ChannelProtocol, kind: str, stream: int, data: bytes) -> None:
    decoded = decode(message, protocol)
    assert decoded is not None
    assert (decoded.kind, decoded.stream, decoded.data) == (kind, stream, data)


@pytest.mark.parametrize(
    ("message", "protocol"),
    [
        (b"", ChannelProtocol.V5),
        (b"\xff\x00", ChannelProtocol.V4),  # v4 has no close message
        (b"\xff", ChannelProtocol.V5),
        (b"\xff\x00\x01", ChannelProtocol.V5),
        (b"\x00stdin-echo", ChannelProtocol.V5),  # the server never writes stdin
        (b"\x04{}", ChannelProtocol.V5),
        (b"\x03not json", ChannelProtocol.V4),
        (b'\x03{"status": "Maybe"}', ChannelProtocol.V4),
    ],
)
def test_decoding_refuses(message: bytes, protocol: ChannelProtocol) -> None:
    with pytest.raises(ChannelProtocolError):
        decode(message, protocol)


def test_empty_stream_messages_are_skipped() -> None:
    assert decode(b"\x01", ChannelProtocol.V4) is None
    assert decode(b"\x02", ChannelProtocol.V5) is None


def test_status_parsing() -> None:
    assert parse_status(b'{"metadata":{},"status":"Success"}').exit_code == 0
    failed = parse_status(
        b'{"status":"Failure","reason":"NonZeroExitCode","message":"exit code 42",'
        b'"details":{"causes":[{"reason":"ExitCode","message":"42"}]}}'
    )
    assert (failed.success, failed.exit_code) == (False, 42)
    internal = parse_status(b'{"status":"Failure","reason":"InternalError","message":"no python3"}')
    assert (internal.exit_code, internal.message) == (None, "no python3")


# -- the bridge against recorded traffic -------------------------------------------------------------
@pytest.mark.parametrize("case", sorted(RECORDINGS))
def test_bridge_replays_recorded_traffic(case: str) -> None:
    recording = RECORDINGS[case]
    ws = StubWebSocket(recording["subprotocol"], [bytes.fromhex(m) for m in recording["server"]] + [None])
    bridge = ExecBridge(ws)
    streams = read_all(bridge)
    assert streams.get(1, b"") == bytes.fromhex(recording["stdout"])
    if recording["stderr"] is not None:
        assert streams.get(2, b"") == bytes.fromhex(recording["stderr"])
    else:  # the process never started: the status message is what the agent channel quotes
        assert b"executable file not found" in streams[2]
    assert bridge.status is not None
    assert (bridge.status.success, bridge.status.exit_code) == (
        recording["status"]["success"],
        recording["status"]["exit_code"],
    )
    assert bridge.failure is None
    bridge.close()
    bridge.join(5)


@pytest.mark.parametrize(
    ("subprotocol", "last"),
    [("v5.channel.k8s.io", [b"\x00RUN", b"\xff\x00"]), ("v4.channel.k8s.io", [b"\x00RUN"])],
)
def test_closing_the_channel_closes_stdin_on_v5_and_the_connection_on_both(
    subprotocol: str, last: list[bytes]
) -> None:
    ws = StubWebSocket(subprotocol)
    bridge = ExecBridge(ws)
    bridge.write(b"RUN", time.monotonic() + 5)
    time.sleep(0.2)  # the writer forwards it before the end
    bridge.shutdown()
    bridge.close()
    bridge.join(5)
    assert ws.sent == last  # v5's close of stdin (the agent sees EOF and ends its commands); v4 cannot say it
    assert ws.closed


def test_a_broken_frame_ends_the_stream_with_a_reason() -> None:
    ws = StubWebSocket("v4.channel.k8s.io", [b"\x01ok", b"\xff\x00"])
    bridge = ExecBridge(ws)
    assert read_all(bridge) == {1: b"ok"}
    assert bridge.failure is not None and "stream 255" in bridge.failure
    bridge.close()
    bridge.join(5)


# -- the agent channel over the bridge ---------------------------------------------------------------
#: A stand-in's launch: the loader's argv, then the binary's bytes on stdin before the first frame.
LAUNCH = AgentLaunch(["/bin/sh", "-c", "LOADER", "adk-sandbox-agent-loader", "13"], b"\x7fELF stand-in")


def _agent_stub(subprotocol: str) -> StubWebSocket:
    """A server whose process answers like the agent: HELLO at once, then STDOUT + EXIT for each RUN.

    The binary's bytes come first on its stdin (what the loader reads): they are checked and skipped.
    """
    decoder = FrameDecoder(HOST_TO_AGENT, expect_hello=False)
    binary = bytearray()

    def on_send(ws: StubWebSocket, message: bytes) -> None:
        if message[0] != 0:
            return  # v5's close of stdin
        data = message[1:]
        if len(binary) < len(LAUNCH.preamble):
            taken = len(LAUNCH.preamble) - len(binary)
            binary.extend(data[:taken])
            data = data[taken:]
            assert bytes(binary) == LAUNCH.preamble[: len(binary)]
        for frame in decoder.feed(data):
            if frame.type == FrameType.RUN and frame.body is not None:
                text = " ".join(frame.body["argv"]).encode() + b" in " + frame.body["cwd"].encode()
                ws.push(b"\x01" + encode(FrameType.STDOUT, frame.channel, text))
                exit_body = {"exit_code": 7, "signal": None, "timed_out": False, "stdout_dropped": 0,
                             "stderr_dropped": 0, "oom_kills": 0}  # fmt: skip
                ws.push(b"\x01" + encode(FrameType.EXIT, frame.channel, exit_body))

    ws = StubWebSocket(subprotocol, on_send=on_send)
    ws.push(b"\x01")  # the opening empty message
    hello = {"protocol": 1, "pid": 9, "subreaper": True, "setid": "refused"}  # the filter, as asked
    ws.push(b"\x01" + encode(FrameType.HELLO, 0, hello))
    return ws


@pytest.mark.parametrize("subprotocol", ["v5.channel.k8s.io", "v4.channel.k8s.io"])
def test_the_agent_channel_runs_a_command_over_the_bridge(subprotocol: str) -> None:
    opened: list[tuple[list[str], StubWebSocket, ExecBridge]] = []

    def open_stream(argv: list[str], user: str, until: float) -> ExecBridge:
        ws = _agent_stub(subprotocol)
        bridge = ExecBridge(ws)
        opened.append((argv, ws, bridge))
        return bridge

    transport = AgentTransport(open_stream, launch=LAUNCH)
    command = PreparedCommand(argv=("echo", "hi"), env={}, user="1000:1000", workdir="/workspace", stdin=None,
                              marker="m")  # fmt: skip
    capture = OutputCapture(1024)
    outcome = transport.run(command, capture, deadline=time.monotonic() + 10, cancel=None)
    assert outcome.exit_code == 7
    assert capture.finish()["stdout"].text == "echo hi in /workspace"
    argv, ws, bridge = opened[0]
    assert argv == LAUNCH.argv
    transport.close()
    bridge.join(5)
    assert ws.closed
    assert (ws.sent[-1] == b"\xff\x00") is (subprotocol == "v5.channel.k8s.io")
