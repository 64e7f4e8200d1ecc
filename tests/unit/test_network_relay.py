"""One proxied connection end to end, against loopback servers these tests start (reached through pins).

The sandbox's side is one end of a ``socket.socketpair``; the servers record every byte they receive, so
"nothing was delivered" is checked on the server, not assumed.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adk_sandbox.executor.network.http_head import MAX_HEAD
from adk_sandbox.executor.network.log import ConnectionEntry, ConnectionLog
from adk_sandbox.executor.network.policy import NetworkPolicy
from adk_sandbox.executor.network.relay import TLS_ACCESS_DENIED, relay
from tests.conftest import require
from tests.loopback_server import stop_serving

BODY = b"hello from upstream\n"


class Upstream:
    """A loopback server recording what each connection delivered; answers HTTP, optionally over TLS."""

    def __init__(self, tls: ssl.SSLContext | None = None, *, answer: bool = True) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.tls = tls
        self.answer = answer
        self.connections = 0
        self.received: list[bytes] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        got = b""
        try:
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            while b"\r\n\r\n" not in got:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                got += chunk
            if self.answer and b"\r\n\r\n" in got:
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(BODY) + BODY
                )
            else:
                while chunk := conn.recv(65536):
                    got += chunk
        except (OSError, ssl.SSLError):
            pass
        finally:
            with self.lock:
                self.received.append(got)
            conn.close()

    def close(self) -> None:
        stop_serving(self.listener, self.thread)


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    yield server
    server.close()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for allowed.test, made with the openssl command."""
    require(shutil.which("openssl") is not None, "the openssl command is needed to make a test certificate")
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=allowed.test",
         "-addext", "subjectAltName=DNS:allowed.test"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


class Session:
    """The relay serving one connection in a thread, and the sandbox's end of it."""

    def __init__(self, policy: NetworkPolicy, **options: Any) -> None:
        self.client, server_end = socket.socketpair()
        self.client.settimeout(10)
        self.log = ConnectionLog(max_entries=10)
        self.entry: ConnectionEntry | None = None
        self.thread = threading.Thread(target=self._run, args=(server_end, policy, options), daemon=True)
        self.thread.start()

    def _run(self, stream: socket.socket, policy: NetworkPolicy, options: dict[str, Any]) -> None:
        self.entry = relay(stream, policy, self.log, **options)

    def read_all(self) -> bytes:
        data = b""
        with contextlib.suppress(OSError):
            while chunk := self.client.recv(65536):
                data += chunk
        return data

    def read_head(self) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.client.recv(1)
            assert chunk, data
            data += chunk
        return data

    def finish(self) -> ConnectionEntry:
        self.thread.join(timeout=15)
        assert not self.thread.is_alive()
        self.client.close()
        assert self.entry is not None
        assert self.log.entries() == (self.entry,)
        return self.entry


def policy_for(upstream: Upstream, **extra: Any) -> NetworkPolicy:
    return NetworkPolicy(
        allow=[f"allowed.test:{upstream.port}"], hosts={"allowed.test": ["127.0.0.1"]}, **extra
    )


def wait_for(predicate: Any, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def client_hello(name: str | None) -> bytes:
    context = ssl.create_default_context()
    if name is None:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    outgoing = ssl.MemoryBIO()
    tls = context.wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname=name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


# -- allowed -------------------------------------------------------------------------------------------
def test_an_allowed_plain_http_request_is_forwarded_in_origin_form(upstream: Upstream) -> None:
    session = Session(policy_for(upstream))
    session.client.sendall(
        f"GET http://allowed.test:{upstream.port}/simple/ HTTP/1.1\r\nHost: allowed.test:{upstream.port}\r\n"
        "Proxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n".encode()
    )
    answer = session.read_all()
    entry = session.finish()
    assert answer.startswith(b"HTTP/1.1 200 OK")
    assert answer.endswith(BODY)
    wait_for(lambda: upstream.received)
    expected = (
        f"GET /simple/ HTTP/1.1\r\nHost: allowed.test:{upstream.port}\r\n"
        "Accept: */*\r\nConnection: close\r\n\r\n"
    )
    assert upstream.received == [expected.encode()]
    assert (entry.decision, entry.rule, entry.host, entry.port) == (
        "allowed",
        f"allow allowed.test:{upstream.port}",
        "allowed.test",
        upstream.port,
    )
    assert entry.detail == "connected to 127.0.0.1"
    assert entry.bytes_up == len(upstream.received[0])
    assert entry.bytes_down == len(answer)


def test_plain_http_to_a_host_with_headers_is_refused(upstream: Upstream) -> None:
    """Credentials travel only over HTTPS; plain HTTP to their host is refused, never sent without them."""
    policy = policy_for(upstream, headers={"allowed.test": {"Authorization": "Bearer s3cr3t"}})
    session = Session(policy)
    session.client.sendall(f"GET http://allowed.test:{upstream.port}/ HTTP/1.1\r\n\r\n".encode())
    answer = session.read_all()
    assert answer.startswith(b"HTTP/1.1 403 ") and b"only over HTTPS" in answer
    session.finish()
    assert upstream.received == []


def test_an_allowed_connect_carries_real_tls_end_to_end(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    server = Upstream(tls=server_context)
    try:
        session = Session(policy_for(server))
        session.client.sendall(
            f"CONNECT allowed.test:{server.port} HTTP/1.1\r\nHost: allowed.test\r\n\r\n".encode()
        )
        assert session.read_head() == b"HTTP/1.1 200 Connection established\r\n\r\n"
        client_context = ssl.create_default_context(cafile=str(cert))
        with client_context.wrap_socket(session.client, server_hostname="allowed.test") as tls:
            tls.sendall(b"GET /secret HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
            answer = b""
            with contextlib.suppress(ssl.SSLError, OSError):
                while chunk := tls.recv(65536):
                    answer += chunk
        entry = session.finish()
        assert answer.endswith(BODY)
        wait_for(lambda: server.received)
        assert server.received == [b"GET /secret HTTP/1.1\r\nHost: allowed.test\r\n\r\n"]
        assert entry.decision == "allowed"
        assert entry.bytes_up > 0
        assert entry.bytes_down > len(BODY)
    finally:
        server.close()


# -- refused, nothing delivered ------------------------------------------------------------------------
def test_a_denied_name_gets_a_403_naming_the_rule_and_the_server_sees_nothing(upstream: Upstream) -> None:
    policy = NetworkPolicy(
        allow=[f"*.test:{upstream.port}"],
        deny=["evil.test"],
        hosts={"evil.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]},
    )
    for host, rule in (("evil.test", "deny evil.test"), ("nope.example", "no rule allows it")):
        session = Session(policy)
        session.client.sendall(f"CONNECT {host}:{upstream.port} HTTP/1.1\r\n\r\n".encode())
        answer = session.read_all()
        entry = session.finish()
        assert answer.startswith(b"HTTP/1.1 403 Forbidden\r\n")
        assert f"rule: {rule}".encode() in answer
        assert f"{host}:{upstream.port}".encode() in answer
        assert (entry.decision, entry.rule, entry.bytes_up, entry.bytes_down) == ("refused", rule, 0, 0)
    assert upstream.connections == 0


@pytest.mark.parametrize("target", ["127.0.0.1", "2130706433", "0x7f.1", "[::ffff:127.0.0.1]"])
def test_connect_to_an_ip_literal_is_refused(upstream: Upstream, target: str) -> None:
    session = Session(NetworkPolicy(allow=["*", f"*:{upstream.port}"]))
    session.client.sendall(f"CONNECT {target}:{upstream.port} HTTP/1.1\r\n\r\n".encode())
    answer = session.read_all()
    entry = session.finish()
    assert answer.startswith(b"HTTP/1.1 403 Forbidden")
    assert b"rule: not a host name" in answer
    assert entry.decision == "refused"
    assert upstream.connections == 0


def test_a_name_resolving_to_a_private_address_is_refused_with_a_403(upstream: Upstream) -> None:
    def rebinding(host: str, port: int, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    session = Session(NetworkPolicy(allow=[f"rebind.test:{upstream.port}"]), getaddrinfo=rebinding)
    session.client.sendall(f"CONNECT rebind.test:{upstream.port} HTTP/1.1\r\n\r\n".encode())
    answer = session.read_all()
    entry = session.finish()
    assert answer.startswith(b"HTTP/1.1 403 Forbidden")
    assert b"127.0.0.1 is loopback" in answer
    assert b"rule: address" in answer
    assert entry.rule == "address"
    assert upstream.connections == 0


@pytest.mark.parametrize(
    ("hello", "rule"),
    [
        (lambda: client_hello("evil.test"), "sni mismatch"),
        (lambda: client_hello(None), "sni missing"),
        (lambda: b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n", "not tls"),
    ],
)
def test_a_tunnel_whose_hello_is_not_for_the_connect_host_delivers_nothing(
    upstream: Upstream, hello: Any, rule: str
) -> None:
    session = Session(policy_for(upstream))
    session.client.sendall(f"CONNECT allowed.test:{upstream.port} HTTP/1.1\r\n\r\n".encode())
    assert session.read_head() == b"HTTP/1.1 200 Connection established\r\n\r\n"
    session.client.sendall(hello())
    answer = session.read_all()
    entry = session.finish()
    assert answer == TLS_ACCESS_DENIED
    assert (entry.decision, entry.rule, entry.bytes_up, entry.bytes_down) == ("refused", rule, 0, 0)
    wait_for(lambda: upstream.received)
    assert upstream.received == [b""]  # connected to, then closed: not one byte delivered


def test_a_hello_sent_with_the_connect_head_is_checked_too(upstream: Upstream) -> None:
    session = Session(policy_for(upstream))
    session.client.sendall(
        f"CONNECT allowed.test:{upstream.port} HTTP/1.1\r\n\r\n".encode() + client_hello("evil.test")
    )
    answer = session.read_all()
    assert answer == b"HTTP/1.1 200 Connection established\r\n\r\n" + TLS_ACCESS_DENIED
    assert session.finish().rule == "sni mismatch"


def test_a_host_header_differing_from_the_uri_is_a_400_and_delivers_nothing(upstream: Upstream) -> None:
    session = Session(policy_for(upstream))
    session.client.sendall(
        f"GET http://allowed.test:{upstream.port}/ HTTP/1.1\r\nHost: evil.test\r\n\r\n".encode()
    )
    answer = session.read_all()
    entry = session.finish()
    assert answer.startswith(b"HTTP/1.1 400 Bad Request")
    assert b"they must agree" in answer
    assert entry.rule == "bad request"
    assert upstream.connections == 0


@pytest.mark.parametrize(
    "data",
    [
        b"CONNECT " + b"a" * 20000,
        b"\x16\x03\x01\x02\x00" + bytes(600) + b"\r\n\r\n",
        b"CONNECT allowed.test:99999 HTTP/1.1\r\n\r\n",
        b"CONNECT allowed.test:443 HTTP/1.1\r\n" + b"X-Pad: aaaaaaaaaa\r\n" * (MAX_HEAD // 18) + b"\r\n",
    ],
)
def test_garbage_and_oversized_heads_are_400s(upstream: Upstream, data: bytes) -> None:
    session = Session(policy_for(upstream))
    with contextlib.suppress(OSError):
        session.client.sendall(data)
    answer = session.read_all()
    entry = session.finish()
    assert answer.startswith(b"HTTP/1.1 400 Bad Request")
    assert entry.rule == "bad request"
    assert upstream.connections == 0


def test_a_slow_loris_head_is_cut_at_the_deadline(upstream: Upstream) -> None:
    session = Session(policy_for(upstream), head_timeout=0.5)
    started = time.monotonic()
    for byte in b"CONNECT allowed.test:":
        session.client.sendall(bytes([byte]))
        time.sleep(0.05)
        if not session.thread.is_alive():
            break
    answer = session.read_all()
    entry = session.finish()
    assert time.monotonic() - started < 5
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout")
    assert entry.rule == "head timeout"
    assert upstream.connections == 0


def test_a_slow_hello_is_cut_at_the_deadline(upstream: Upstream) -> None:
    partial = client_hello("allowed.test")[:20]
    session = Session(policy_for(upstream), head_timeout=1.0)
    session.client.sendall(f"CONNECT allowed.test:{upstream.port} HTTP/1.1\r\n\r\n".encode() + partial)
    answer = session.read_all()
    entry = session.finish()
    assert answer == b"HTTP/1.1 200 Connection established\r\n\r\n"
    assert entry.rule == "hello timeout"
    wait_for(lambda: upstream.received)
    assert upstream.received == [b""]


def test_a_server_that_refuses_the_connection_is_a_502() -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    session = Session(NetworkPolicy(allow=[f"allowed.test:{port}"], hosts={"allowed.test": ["127.0.0.1"]}))
    session.client.sendall(f"CONNECT allowed.test:{port} HTTP/1.1\r\n\r\n".encode())
    answer = session.read_all()
    assert answer.startswith(b"HTTP/1.1 502 Bad Gateway")
    assert b"127.0.0.1" in answer
    assert session.finish().rule == "connect failed"


def test_an_unresolvable_name_is_a_502() -> None:
    def nothing(*args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    session = Session(NetworkPolicy(allow=["nowhere.test"]), getaddrinfo=nothing)
    session.client.sendall(b"CONNECT nowhere.test:443 HTTP/1.1\r\n\r\n")
    answer = session.read_all()
    assert answer.startswith(b"HTTP/1.1 502 Bad Gateway")
    assert b"could not be resolved" in answer
    assert session.finish().rule == "resolve failed"


def test_a_sandbox_closing_before_a_head_is_logged(upstream: Upstream) -> None:
    session = Session(policy_for(upstream))
    session.client.shutdown(socket.SHUT_WR)
    assert session.read_all() == b""
    assert session.finish().rule == "closed"
