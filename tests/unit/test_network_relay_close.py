"""The relay's close handle (``on_connected``): a live connection ended from another thread, logged why.

The sandbox's side is one end of a ``socket.socketpair``; the server is a loopback server streaming slowly.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from adk_sandbox.executor.network.log import ConnectionEntry, ConnectionLog
from adk_sandbox.executor.network.passed_socket import PassedSocket
from adk_sandbox.executor.network.policy import NetworkPolicy
from adk_sandbox.executor.network.relay import CloseHandle, relay
from tests.loopback_server import LoopbackServer


def _slow_server() -> tuple[socket.socket, threading.Event]:
    listener = socket.create_server(("127.0.0.1", 0))
    cut = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            while b"\r\n\r\n" not in conn.recv(65536):
                pass
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n")
                for _ in range(3000):
                    conn.sendall(b"x" * 1024)
                    time.sleep(0.01)
            except OSError:
                cut.set()

    threading.Thread(target=serve, daemon=True).start()
    return listener, cut


def test_the_close_handle_ends_a_live_connection_and_says_why() -> None:
    listener, cut = _slow_server()
    port = listener.getsockname()[1]
    policy = NetworkPolicy(allow=[f"slow.test:{port}"], hosts={"slow.test": ["127.0.0.1"]})
    sandbox, host_end = socket.socketpair()
    handles: list[tuple[str, int, CloseHandle]] = []
    entries: list[ConnectionEntry] = []
    log = ConnectionLog()

    def serve() -> None:
        entries.append(relay(host_end, policy, log, on_connected=lambda h, p, c: handles.append((h, p, c))))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        sandbox.sendall(f"GET http://slow.test:{port}/ HTTP/1.1\r\nHost: slow.test:{port}\r\n\r\n".encode())
        sandbox.settimeout(10)
        assert sandbox.recv(65536).startswith(b"HTTP/1.1 200 OK")
        assert [(h, p) for h, p, _ in handles] == [("slow.test", port)]
        handles[0][2]("the test cut it")
        thread.join(timeout=10)
        assert not thread.is_alive()
        while sandbox.recv(65536):  # the sandbox's side sees the end
            pass
        assert cut.wait(10)  # and so does the server
        (entry,) = entries
        assert entry.decision == "allowed" and "closed: the test cut it" in entry.detail
        assert entry.bytes_down < 100_000_000
    finally:
        sandbox.close()
        listener.close()


def test_a_close_before_any_byte_delivers_nothing() -> None:
    received: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def accept() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(5)
            try:
                received.append(conn.recv(65536))
            except OSError:
                received.append(b"")

    threading.Thread(target=accept, daemon=True).start()
    policy = NetworkPolicy(allow=[f"any.test:{port}"], hosts={"any.test": ["127.0.0.1"]})
    sandbox, host_end = socket.socketpair()
    try:
        sandbox.sendall(f"GET http://any.test:{port}/ HTTP/1.1\r\nHost: any.test:{port}\r\n\r\n".encode())
        entry = relay(host_end, policy, ConnectionLog(), on_connected=lambda h, p, close: close("changed"))
        assert entry.decision == "refused" and "closed: changed" in entry.detail
        deadline = time.monotonic() + 5
        while not received and time.monotonic() < deadline:
            time.sleep(0.02)
        assert received == [b""]  # the server got nothing
    finally:
        sandbox.close()
        listener.close()


class _Answering(LoopbackServer):
    """Reads a head, keeps what follows it in ``seen``, answers ``answer`` and closes at once."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.seen: list[bytes] = []
        super().__init__(backlog=64)

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            data = b""
            with contextlib.suppress(OSError):
                while b"\r\n\r\n" not in data and (chunk := conn.recv(65536)):
                    data += chunk
                conn.sendall(self.answer)
                conn.setblocking(False)
                with contextlib.suppress(OSError):
                    data += conn.recv(1 << 20)  # whatever came with or right after the head
            self.seen.append(data.partition(b"\r\n\r\n")[2])


QUIET_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nquiet"


def test_a_connection_ending_while_its_sandbox_still_sends_never_feeds_another() -> None:
    """One side of a connection ends while the other still splices: nothing it holds reaches a new one.

    The relay used to close both sockets as soon as the server's direction ended, while the sandbox's
    direction was still in a ``splice`` holding their descriptor numbers; the next connection got those
    numbers (the lowest free ones), and the stale splice moved one connection's bytes into another's. Here
    each "flooding" connection's server answers and closes at once while its sandbox keeps sending ``P``,
    beside "quiet" connections whose server and sandbox must see only their own bytes.
    """
    flood = _Answering(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    quiet = _Answering(QUIET_ANSWER)
    ports = flood.port, quiet.port
    policy = NetworkPolicy(
        allow=[f"flood.test:{ports[0]}", f"quiet.test:{ports[1]}"],
        hosts={"flood.test": ["127.0.0.1"], "quiet.test": ["127.0.0.1"]},
    )
    log = ConnectionLog()
    answers: list[bytes] = []

    def connection(name: str, port: int, keep_sending: bool) -> None:
        # As on the direct paths: the client's TCP socket, passed to the host non-blocking (the sandbox's
        # copy decides the flags), so the relay's splice waits in poll on EAGAIN.
        with socket.create_server(("127.0.0.1", 0)) as endpoint:
            sandbox = socket.create_connection(endpoint.getsockname())
            host_end = endpoint.accept()[0]
        host_end.setblocking(False)
        relaying = threading.Thread(target=relay, args=(PassedSocket(host_end), policy, log), daemon=True)
        relaying.start()
        with sandbox:
            sandbox.settimeout(5)
            sandbox.sendall(f"GET http://{name}:{port}/ HTTP/1.1\r\nHost: {name}:{port}\r\n\r\n".encode())
            received = b""
            with contextlib.suppress(OSError):
                if keep_sending:  # a pause (the relay's up direction waits in poll), then a flood
                    time.sleep(0.02)
                    sandbox.setblocking(False)
                    end = time.monotonic() + 0.05
                    while time.monotonic() < end:
                        with contextlib.suppress(BlockingIOError):
                            sandbox.send(b"P" * 65536)
                    sandbox.settimeout(5)
                while chunk := sandbox.recv(65536):
                    received += chunk
            if not keep_sending:
                answers.append(received)
        relaying.join(timeout=10)

    try:
        for _ in range(40):
            threads = [
                threading.Thread(target=connection, args=("flood.test", ports[0], True)),
                *(threading.Thread(target=connection, args=("quiet.test", ports[1], False)) for _ in "abc"),
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=20)
        assert len(answers) == 120 and len(quiet.seen) == 120
        # Exactly the quiet server's answer: not one of the flood's bytes, nothing cut.
        assert [answer[-80:] for answer in answers if answer != QUIET_ANSWER] == []
        assert [seen for seen in quiet.seen if seen] == []  # a quiet server got nothing but its head
    finally:
        flood.close()
        quiet.close()
