"""The relay's close handle (``on_connected``): a live connection ended from another thread, logged why.

The sandbox's side is one end of a ``socket.socketpair``; the server is a loopback server streaming slowly.
"""

from __future__ import annotations

import socket
import threading
import time

from adk_sandbox.executor.network.log import ConnectionEntry, ConnectionLog
from adk_sandbox.executor.network.policy import NetworkPolicy
from adk_sandbox.executor.network.relay import CloseHandle, relay


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
