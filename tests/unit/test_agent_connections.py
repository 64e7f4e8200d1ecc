"""The proxy endpoint over the agent channel: a real agent on the host, ending in handlers.

The agent runs in namespaces of its own (``unshare``: a user namespace and a PID namespace with its own
``/proc``, so it sees, and would kill, nothing of the host's), with the host's network namespace so the
test reaches its listener on ``127.0.0.1``. It speaks over pipes to an :class:`AgentTransport`, exactly as
over a Docker exec; the connections end in handlers the tests give, and in :func:`relay` against loopback
servers these tests start (reached through ``hosts`` pins).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from adk_sandbox.executor.channel.agent_transport import AgentTransport
from adk_sandbox.executor.channel.connections import Connections, ConnectionStream
from adk_sandbox.executor.channel.frames import (
    CONNECTION_BASE,
    MAX_CONNECTIONS,
    WINDOW,
    Frame,
    FrameType,
    ProtocolError,
    encode,
)
from adk_sandbox.executor.channel.static_agent import AgentLaunch
from adk_sandbox.executor.errors import PolicyNotEnforceableError
from adk_sandbox.executor.network.log import ConnectionLog
from adk_sandbox.executor.network.policy import NetworkPolicy
from adk_sandbox.executor.network.relay import relay
from adk_sandbox.executor.types import Stream
from tests.conftest import require
from tests.loopback_server import LoopbackServer

USER = "0:0"
#: Runs the agent as a child (never as the PID namespace's init, whose orphans it would take for its own).
_INIT = "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-Urpf", "--mount-proc", "true"], capture_output=True, check=False, timeout=30
    )
    return probe.returncode == 0


class ProcessStream:
    """An :class:`AgentStream` over a local process's pipes (what a Docker exec's stream is to the host)."""

    def __init__(self, argv: list[str]) -> None:
        self.process = subprocess.Popen(
            ["unshare", "-Urpf", "--kill-child", "--mount-proc", sys.executable, "-c", _INIT, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        assert self.process.stdin and self.process.stdout and self.process.stderr
        self.stdin, self.stdout = self.process.stdin.fileno(), self.process.stdout.fileno()
        self.stderr = bytearray()
        threading.Thread(target=self._drain, daemon=True).start()
        self._down = threading.Event()

    def _drain(self) -> None:
        assert self.process.stderr
        while chunk := os.read(self.process.stderr.fileno(), 4096):
            self.stderr += chunk[: max(0, 65536 - len(self.stderr))]

    def read(self) -> list[tuple[Stream, bytes]] | None:
        data = os.read(self.stdout, 1 << 20)
        return [("stdout", data)] if data else None

    def write(self, data: bytes, until: float) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.stdin, view) :]

    def shutdown(self) -> None:
        if not self._down.is_set():
            self._down.set()
            assert self.process.stdin
            with contextlib.suppress(OSError):
                self.process.stdin.close()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)

    def close(self) -> None:
        self.shutdown()
        self.process.wait(timeout=10)


class Agent:
    """A transport with one running agent (or a stand-in's ``launch``), and its processes to kill."""

    def __init__(self, launch: AgentLaunch | None = None) -> None:
        self.streams: list[ProcessStream] = []

        def open_stream(argv: list[str], user: str, until: float) -> ProcessStream:
            stream = ProcessStream(argv)
            self.streams.append(stream)
            return stream

        self.transport = AgentTransport(open_stream, launch=launch)

    def serve(self, handler: Callable[[ConnectionStream], object]) -> int:
        return self.transport.serve_connections(USER, handler)

    def close(self) -> None:
        self.transport.close()
        for stream in self.streams:
            stream.close()


def older_agent(without: str) -> AgentLaunch:
    """A stand-in for an agent of an older version: its HELLO offers no ``without`` (proxy, dial)."""
    hello = {"protocol": 1, "pid": 2, "subreaper": True, "setid": "refused", "agent": "older", "proxy": 1,
             "dial": 1}  # fmt: skip
    del hello[without]
    program = f"import os, sys; os.write(1, bytes.fromhex({encode(FrameType.HELLO, 0, hello).hex()!r})); "
    return AgentLaunch([sys.executable, "-c", program + "sys.stdin.buffer.read()"])


@pytest.fixture
def agent() -> Iterator[Agent]:
    require(_namespaces_work(), "unshare with user and PID namespaces is needed to run an agent here")
    require(shutil.which("gcc") is not None or shutil.which("cc") is not None, "no C compiler")
    running = Agent()
    yield running
    running.close()


def connect(port: int) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", port), timeout=10)
    client.settimeout(10)
    return client


def read_all(sock: socket.socket) -> bytes:
    data = bytearray()
    while chunk := sock.recv(65536):
        data += chunk
    return bytes(data)


def echo_upper(stream: ConnectionStream) -> None:
    """Echoes in upper case until the client's end of file, then says bye and closes."""
    while data := stream.recv(65536):
        stream.sendall(data.upper())
    stream.sendall(b"BYE")
    stream.shutdown(socket.SHUT_WR)


def wait_for(predicate: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


# -- the endpoint ----------------------------------------------------------------------------------------
def test_hello_offers_the_endpoint_and_a_connection_reaches_the_handler(agent: Agent) -> None:
    port = agent.serve(echo_upper)
    hello = agent.transport._agents[USER].hello or {}
    assert hello.get("proxy") == 1 and hello.get("agent") == "static"
    with connect(port) as client:
        client.sendall(b"hello")
        assert client.recv(5) == b"HELLO"
        client.sendall(b" world")
        assert client.recv(6) == b" WORLD"
        client.shutdown(socket.SHUT_WR)  # a half-close: the handler still answers after it
        assert read_all(client) == b"BYE"


def test_big_transfers_both_ways_arrive_intact_through_the_windows(agent: Agent) -> None:
    size = 24 * WINDOW + 12345
    payload = os.urandom(size)
    seen: dict[str, Any] = {}

    def handler(stream: ConnectionStream) -> None:
        digest, got = hashlib.sha256(), 0
        while got < size and (data := stream.recv(65536)):
            digest.update(data)
            got += len(data)
        seen["up"] = (got, digest.hexdigest())
        stream.sendall(payload)

    port = agent.serve(handler)
    with connect(port) as client:
        sender = threading.Thread(target=client.sendall, args=(payload,))
        sender.start()
        down = bytearray()
        while len(down) < size and (chunk := client.recv(1 << 20)):
            down += chunk
        sender.join()
        assert read_all(client) == b""
    assert seen["up"] == (size, hashlib.sha256(payload).hexdigest())
    assert bytes(down) == payload


def test_a_flooding_client_and_a_stalled_one_hold_up_only_themselves(agent: Agent) -> None:
    """One client floods a handler that never reads, another never reads what its handler sends: the
    host holds at most a window of each, and a third connection and the agent's PING still go through."""
    streams: dict[str, ConnectionStream] = {}
    release = threading.Event()

    def handler(stream: ConnectionStream) -> None:
        kind = stream.recv(5)
        streams[kind.decode()] = stream
        if kind == b"flood":
            release.wait(30)  # never reads while the client floods
        elif kind == b"stall":
            stream.settimeout(20)
            with contextlib.suppress(OSError):
                stream.sendall(b"x" * (64 * WINDOW))  # the client never reads: this waits for credit
            release.wait(30)
        else:
            stream.sendall(kind.upper())
            echo_upper(stream)

    port = agent.serve(handler)
    flood, stall = connect(port), connect(port)
    try:
        flood.sendall(b"flood")
        stall.sendall(b"stall")
        flood.setblocking(False)
        sent, deadline = 0, time.monotonic() + 3
        while time.monotonic() < deadline:
            with contextlib.suppress(BlockingIOError):
                sent += flood.send(b"f" * 65536)
        wait_for(lambda: "flood" in streams and "stall" in streams)
        assert sent > 2 * WINDOW  # the kernel's buffers took some, the window the rest: then it stopped
        assert len(streams["flood"]._buffer) <= WINDOW
        with connect(port) as other:
            other.sendall(b"quick")
            assert other.recv(5) == b"QUICK"
        assert agent.transport.ping(USER, 5)
    finally:
        release.set()
        flood.close()
        stall.close()


def test_at_most_max_connections_then_refused_and_the_endpoint_recovers(agent: Agent) -> None:
    opened = threading.Semaphore(0)
    release = threading.Event()

    def handler(stream: ConnectionStream) -> None:
        opened.release()
        release.wait(60)

    port = agent.serve(handler)
    clients = [connect(port) for _ in range(MAX_CONNECTIONS)]
    try:
        for _ in range(MAX_CONNECTIONS):
            assert opened.acquire(timeout=20)
        with connect(port) as extra:
            assert read_all(extra) == b""  # accepted and closed at once
        assert not opened.acquire(timeout=0.5)
        assert agent.transport.ping(USER, 5)
    finally:
        release.set()
        for client in clients:
            client.close()
    wait_for(lambda: agent.transport._agents[USER].connections.open_connections == 0)
    with connect(port):
        assert opened.acquire(timeout=10)


def test_the_agent_gone_ends_every_connection(agent: Agent) -> None:
    ended = threading.Event()
    result: list[bytes] = []

    def handler(stream: ConnectionStream) -> None:
        result.append(stream.recv(10))
        result.append(stream.recv(10))  # blocks until the agent is gone
        ended.set()

    port = agent.serve(handler)
    with connect(port) as client:
        client.sendall(b"one")
        wait_for(lambda: bool(result))
        agent.streams[0].shutdown()
        assert ended.wait(10)
    assert result == [b"one", b""]


def test_an_agent_without_the_endpoint_is_refused() -> None:
    require(_namespaces_work(), "unshare with user and PID namespaces is needed to run an agent here")
    old = Agent(older_agent("proxy"))
    try:
        with pytest.raises(PolicyNotEnforceableError, match="proxy endpoint"):
            old.serve(echo_upper)
    finally:
        old.close()


# -- the relay at the end --------------------------------------------------------------------------------
class Upstream(LoopbackServer):
    """A loopback HTTP server that records what it received."""

    def __init__(self) -> None:
        self.received: list[bytes] = []
        super().__init__()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            got = b""
            while b"\r\n\r\n" not in got and (chunk := conn.recv(65536)):
                got += chunk
            self.received.append(got)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n")


def test_connections_end_in_the_relay_which_decides(agent: Agent) -> None:
    upstream = Upstream()
    policy = NetworkPolicy(allow=[f"allowed.test:{upstream.port}"], hosts={"allowed.test": ["127.0.0.1"]})
    log = ConnectionLog(max_entries=10)
    port = agent.serve(lambda stream: relay(stream, policy, log))
    with connect(port) as client:
        target = f"allowed.test:{upstream.port}"
        client.sendall(f"GET http://{target}/x HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        answer = read_all(client)
    assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b"ok\n")
    assert upstream.received[0].startswith(b"GET /x HTTP/1.1\r\n")
    with connect(port) as client:
        client.sendall(b"GET http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\n\r\n")
        answer = read_all(client)
    assert answer.startswith(b"HTTP/1.1 403") and b"no rule allows it" in answer
    assert len(upstream.received) == 1
    wait_for(lambda: len(log.entries()) == 2)
    assert sorted(entry.decision for entry in log.entries()) == ["allowed", "refused"]


# -- the host side's checks, fed frames directly -----------------------------------------------------------
def _connections() -> tuple[Connections, list[bytes], list[ConnectionStream]]:
    sent: list[bytes] = []
    served: list[ConnectionStream] = []
    hold = threading.Event()

    def handler(stream: ConnectionStream) -> None:
        served.append(stream)
        hold.wait(20)  # kept open (a handler's return closes its stream)

    connections = Connections(lambda data, until: sent.append(data))
    connections.add_listener(1, handler)
    return connections, sent, served


def test_more_than_the_window_is_a_protocol_error() -> None:
    connections, _, served = _connections()
    channel = CONNECTION_BASE
    connections.deliver(Frame(FrameType.OPEN, channel, body={"listener": 1}))
    wait_for(lambda: bool(served))
    connections.deliver(Frame(FrameType.DATA, channel, data=b"x" * WINDOW))
    with pytest.raises(ProtocolError, match="window"):
        connections.deliver(Frame(FrameType.DATA, channel, data=b"x"))


def test_credit_returned_lets_the_agent_send_more() -> None:
    connections, sent, served = _connections()
    channel = CONNECTION_BASE
    connections.deliver(Frame(FrameType.OPEN, channel, body={"listener": 1}))
    wait_for(lambda: bool(served))
    connections.deliver(Frame(FrameType.DATA, channel, data=b"x" * WINDOW))
    assert len(served[0].recv(WINDOW)) == WINDOW
    assert sent and b'"bytes":%d' % WINDOW in sent[-1]
    connections.deliver(Frame(FrameType.DATA, channel, data=b"y" * WINDOW))  # within the new credit


def test_frames_for_unopened_or_reused_channels() -> None:
    connections, _, _ = _connections()
    with pytest.raises(ProtocolError, match="never opened"):
        connections.deliver(Frame(FrameType.DATA, CONNECTION_BASE + 3, data=b"x"))
    connections.deliver(Frame(FrameType.OPEN, CONNECTION_BASE + 4, body={"listener": 1}))
    connections.deliver(Frame(FrameType.CLOSE, CONNECTION_BASE + 4, body={}))
    connections.deliver(Frame(FrameType.DATA, CONNECTION_BASE + 4, data=b"late"))  # dropped
    with pytest.raises(ProtocolError, match="not a fresh channel"):
        connections.deliver(Frame(FrameType.OPEN, CONNECTION_BASE + 4, body={"listener": 1}))


def test_a_connection_for_no_listener_is_closed() -> None:
    connections, sent, served = _connections()
    connections.deliver(Frame(FrameType.OPEN, CONNECTION_BASE, body={"listener": 9}))
    wait_for(lambda: bool(sent))
    assert sent[0][0] == FrameType.CLOSE and not served


def test_sendall_waits_for_credit_and_close_wakes_it() -> None:
    connections, sent, served = _connections()
    connections.deliver(Frame(FrameType.OPEN, CONNECTION_BASE, body={"listener": 1}))
    wait_for(lambda: bool(served))
    stream = served[0]
    failed: list[BaseException] = []

    def send() -> None:
        try:
            stream.sendall(b"z" * (WINDOW + 10))
        except OSError as exc:
            failed.append(exc)

    thread = threading.Thread(target=send)
    thread.start()
    wait_for(lambda: sum(len(d) - 12 for d in sent) >= WINDOW)
    time.sleep(0.1)
    assert thread.is_alive()  # the window is used up: it waits for credit
    stream.close()
    thread.join(5)
    assert not thread.is_alive() and isinstance(failed[0], BrokenPipeError)
