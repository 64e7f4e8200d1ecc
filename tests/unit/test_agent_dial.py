"""Dialing into a sandbox (DIAL) and listening on other loopback addresses: a real agent.

The agents run as in :mod:`tests.unit.test_agent_connections` (namespaces of their own, the host's network
namespace), so a DIAL reaches servers these tests start on ``127.0.0.1`` and a listener on ``127.0.0.2`` is
reachable from here.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from adk_sandbox.executor.channel.connections import Connections
from adk_sandbox.executor.channel.frames import (
    DIAL_BASE,
    HOST_TO_AGENT,
    MAX_CONNECTIONS,
    WINDOW,
    Frame,
    FrameDecoder,
    FrameType,
    ProtocolError,
    encode,
)
from adk_sandbox.executor.errors import InvalidRequestError, PolicyNotEnforceableError
from tests.conftest import require
from tests.loopback_server import LoopbackServer
from tests.unit.test_agent_connections import (
    USER,
    Agent,
    _namespaces_work,
    agent,
    connect,
    older_agent,
    read_all,
    wait_for,
)

__all__ = ["agent"]  # the fixture, shared with the proxy endpoint's tests


class Server(LoopbackServer):
    """A loopback server on the host (what a service is inside its sandbox): echoes, then closes."""

    def __init__(self, address: str = "127.0.0.1") -> None:
        self.held: list[socket.socket] = []
        self.release = threading.Event()
        super().__init__(address, backlog=512)

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(30)
            with contextlib.suppress(OSError):
                while data := conn.recv(1 << 20):
                    conn.sendall(data)
                conn.sendall(b"<eof>")
                conn.shutdown(socket.SHUT_WR)


@pytest.fixture
def server() -> Iterator[Server]:
    running = Server()
    yield running
    running.close()


def test_hello_offers_dialing_and_a_dial_reaches_the_server(agent: Agent, server: Server) -> None:
    hello = agent.transport._agent_for(USER, time.monotonic() + 30).hello or {}
    assert hello.get("dial") == 1 and hello.get("agent") == "static"
    stream = agent.transport.dial(USER, server.port, timeout=10)
    try:
        assert stream.channel >= DIAL_BASE
        stream.settimeout(10)
        stream.sendall(b"ping")
        assert stream.recv(4) == b"ping"
        stream.shutdown(socket.SHUT_WR)  # a half-close: the server still answers after it
        got = b""
        while data := stream.recv(100):
            got += data
        assert got == b"<eof>"
    finally:
        stream.close()
    assert server.accepted == 1


def test_a_dial_to_a_port_nobody_listens_on_is_refused(agent: Agent) -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]  # free once closed
    with pytest.raises(ConnectionRefusedError, match="refused") as caught:
        agent.transport.dial(USER, port, timeout=10)
    assert caught.value.errno == errno.ECONNREFUSED
    assert agent.transport.ping(USER, 5)  # the agent goes on
    with pytest.raises(InvalidRequestError):
        agent.transport.dial(USER, 0)


def test_big_transfers_both_ways_through_the_windows(agent: Agent, server: Server) -> None:
    size = 16 * WINDOW + 4321
    payload = os.urandom(size)
    stream = agent.transport.dial(USER, server.port, timeout=10)
    stream.settimeout(20)

    def send() -> None:
        stream.sendall(payload)
        stream.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=send)
    sender.start()
    got = bytearray()
    while data := stream.recv(1 << 20):
        got += data
        assert len(stream._buffer) <= WINDOW
    sender.join(20)
    stream.close()
    assert hashlib.sha256(bytes(got)).digest() == hashlib.sha256(payload + b"<eof>").digest()


def test_dialed_and_accepted_connections_share_the_cap(agent: Agent, server: Server) -> None:
    hold = threading.Event()
    accepted = threading.Semaphore(0)

    def handler(stream: object) -> None:
        accepted.release()
        hold.wait(60)

    port = agent.serve(handler)
    client = connect(port)  # one accepted connection
    assert accepted.acquire(timeout=10)
    streams = []
    try:
        for _ in range(MAX_CONNECTIONS - 1):
            streams.append(agent.transport.dial(USER, server.port, timeout=20))
        with pytest.raises(ConnectionRefusedError, match="too many connections"):
            agent.transport.dial(USER, server.port, timeout=10)
        with connect(port) as extra:
            assert read_all(extra) == b""  # accepted and closed at once: the cap holds for both kinds
    finally:
        hold.set()
        client.close()
        for stream in streams:
            stream.close()
    wait_for(lambda: agent.transport._agents[USER].connections.open_connections == 0)
    agent.transport.dial(USER, server.port, timeout=10).close()


def test_listening_on_another_loopback_address(agent: Agent) -> None:
    def handler(stream: object) -> None:
        stream.sendall(b"from 127.0.0.2")  # type: ignore[attr-defined]

    port = agent.transport.serve_connections(USER, handler, address="127.0.0.2")
    with socket.create_connection(("127.0.0.2", port), timeout=10) as client:
        assert read_all(client) == b"from 127.0.0.2"
    with pytest.raises(ConnectionRefusedError):  # not on 127.0.0.1
        socket.create_connection(("127.0.0.1", port), timeout=10).close()
    with pytest.raises(OSError) as caught:  # the same address and port again: in use
        agent.transport.serve_connections(USER, handler, port=port, address="127.0.0.2")
    assert caught.value.errno == errno.EADDRINUSE


@pytest.mark.parametrize(
    "address",
    [
        "0.0.0.0",  # noqa: S104 - refused, never bound
        "10.0.0.1",
        "128.0.0.1",
        "::1",
        "127.1",
        "127.0.0.01",
        "",
    ],
)
def test_a_listen_address_outside_loopback_is_refused_by_host_and_agent(agent: Agent, address: str) -> None:
    with pytest.raises(InvalidRequestError, match=r"127\.0\.0\.0/8"):
        agent.transport.serve_connections(USER, lambda stream: None, address=address)
    # The agent refuses it on its own too (a host that did not check).
    running = agent.transport._agent_for(USER, time.monotonic() + 30)
    number, channel = running.open_channel()
    try:
        running.send(encode(FrameType.LISTEN, number, {"port": 0, "address": address}), time.monotonic() + 5)
        kind, body = channel.events.get(timeout=10)
    finally:
        running.close_channel(number)
    assert kind == "result" and body["error"]["name"] == "EINVAL", body
    assert "127.0.0.0/8" in body["error"]["message"]


def test_an_agent_without_dialing_is_refused() -> None:
    require(_namespaces_work(), "unshare with user and PID namespaces is needed to run an agent here")
    old = Agent(older_agent("dial"))
    try:
        with pytest.raises(PolicyNotEnforceableError, match="dialing"):
            old.transport.dial(USER, 80)
        with pytest.raises(PolicyNotEnforceableError, match="dialing"):
            old.transport.serve_connections(USER, lambda stream: None, address="127.0.0.2")
    finally:
        old.close()


# -- the frames and the host side's checks ---------------------------------------------------------------
def test_dial_frames_are_checked() -> None:
    host_side = FrameDecoder(HOST_TO_AGENT)
    assert host_side.feed(encode(FrameType.DIAL, DIAL_BASE, {"port": 80}))[0].body == {"port": 80}
    for channel, body in (
        (DIAL_BASE - 1, {"port": 80}),
        (DIAL_BASE, {"port": 0}),
        (DIAL_BASE, {"port": "80"}),
    ):
        with pytest.raises(ProtocolError):
            FrameDecoder(HOST_TO_AGENT).feed(encode(FrameType.DIAL, channel, body))
    with pytest.raises(ProtocolError, match="address"):
        FrameDecoder(HOST_TO_AGENT).feed(encode(FrameType.LISTEN, 1, {"port": 0, "address": "10.0.0.1"}))


def test_answers_to_a_dial_are_checked() -> None:
    sent: list[bytes] = []
    connections = Connections(lambda data, until: sent.append(data))
    with pytest.raises(ProtocolError, match="never opened"):
        connections.deliver(Frame(FrameType.OPEN, DIAL_BASE, body={"port": 80}))
    done: list[object] = []
    thread = threading.Thread(target=lambda: done.append(connections.dial(80, time.monotonic() + 10)))
    thread.start()
    wait_for(lambda: bool(sent))
    assert sent[0][0] == FrameType.DIAL
    with pytest.raises(ProtocolError, match="before its OPEN"):
        connections.deliver(Frame(FrameType.DATA, DIAL_BASE, data=b"early"))
    connections.deliver(Frame(FrameType.OPEN, DIAL_BASE, body={"port": 80}))
    thread.join(10)
    assert done and done[0].channel == DIAL_BASE  # type: ignore[attr-defined]
    with pytest.raises(ProtocolError, match="second OPEN"):
        connections.deliver(Frame(FrameType.OPEN, DIAL_BASE, body={"port": 80}))


def test_a_dial_not_answered_in_time_is_abandoned() -> None:
    sent: list[bytes] = []
    connections = Connections(lambda data, until: sent.append(data))
    with pytest.raises(TimeoutError):
        connections.dial(80, time.monotonic() + 0.2)
    assert [frame[0] for frame in sent] == [FrameType.DIAL, FrameType.CLOSE]
    connections.deliver(Frame(FrameType.OPEN, DIAL_BASE, body={"port": 80}))  # late: dropped
    assert connections.open_connections == 0
