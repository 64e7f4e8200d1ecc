"""Header injection: the relay terminating TLS for a host with headers, against a loopback TLS server.

The sandbox's side is one end of a ``socket.socketpair`` speaking TLS through the relay's CONNECT, trusting
the session CA only. The server's certificate is signed by a test CA made here, which the host side trusts
through the policy's ``upstream_ca``. The server records every request it received (head and body).
"""

from __future__ import annotations

import contextlib
import datetime
import pickle
import socket
import ssl
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from adk_sandbox.executor.network.intercept import (
    SANDBOX_CA_PATH,
    TRUST_ENV_NAMES,
    Interceptor,
    SessionCA,
    TlsStream,
    sandbox_trust,
)
from adk_sandbox.executor.network.log import ConnectionEntry, ConnectionLog
from adk_sandbox.executor.network.policy import NetworkPolicy
from adk_sandbox.executor.network.relay import relay
from tests.loopback_server import LoopbackServer

SECRET = "Bearer s3cr3t-never-in-the-sandbox"  # noqa: S105 - a test credential
BODY = b"hello from the api\n"


# -- a test CA and a server certificate signed by it ------------------------------------------------------
def make_test_pki(host: str) -> tuple[str, bytes, bytes]:
    """(CA certificate PEM, server certificate PEM, server key PEM) for ``host``: what a private CA issues."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test upstream CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    pem = serialization.Encoding.PEM
    return ca.public_bytes(pem).decode(), leaf.public_bytes(pem), key_pem


def server_context(certificate: bytes, key: bytes, tmp: Any) -> ssl.SSLContext:
    path = tmp / "server.pem"
    path.write_bytes(certificate + key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(path))
    return context


class TlsServer(LoopbackServer):
    """A loopback TLS server recording each request (head and body) and answering ``BODY``."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.context = context
        self.received: list[bytes] = []
        super().__init__()

    def _handle(self, raw: socket.socket) -> None:
        raw.settimeout(10)
        got = b""
        try:
            conn = self.context.wrap_socket(raw, server_side=True)
            while b"\r\n\r\n" not in got and (chunk := conn.recv(65536)):
                got += chunk
            head, _, rest = got.partition(b"\r\n\r\n")
            lower = head.lower()
            if b"content-length:" in lower:
                size = int(lower.split(b"content-length:")[1].split(b"\r\n")[0])
                while len(rest) < size and (chunk := conn.recv(65536)):
                    rest += chunk
            elif b"transfer-encoding: chunked" in lower:
                while not (b"\r\n0\r\n" in rest and rest.endswith(b"\r\n\r\n")) and (
                    chunk := conn.recv(65536)
                ):
                    rest += chunk
            got = head + b"\r\n\r\n" + rest
            self.received.append(got)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(BODY) + BODY
            )
            conn.close()
        except (OSError, ssl.SSLError):
            self.received.append(got)
        finally:
            raw.close()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture(scope="module")
def pki() -> tuple[str, bytes, bytes]:
    return make_test_pki("api.test")


@pytest.fixture
def server(pki: tuple[str, bytes, bytes], tmp_path: Any) -> Iterator[TlsServer]:
    running = TlsServer(server_context(pki[1], pki[2], tmp_path))
    yield running
    running.close()


def policy_for(server: TlsServer, ca: str | None, *, headers: bool = True) -> NetworkPolicy:
    return NetworkPolicy(
        allow=[f"api.test:{server.port}"],
        hosts={"api.test": ["127.0.0.1"]},
        headers={"api.test": {"Authorization": SECRET, "X-Api-Key": "k-123"}} if headers else {},
        upstream_ca=(ca,) if ca else (),
    )


class Sandbox:
    """The relay serving one connection in a thread, and the sandbox's end of it: CONNECT, then TLS."""

    def __init__(self, policy: NetworkPolicy, intercept: Interceptor | None) -> None:
        self.client, server_end = socket.socketpair()
        self.client.settimeout(10)
        self.log = ConnectionLog(max_entries=10)
        self.entry: ConnectionEntry | None = None
        self.thread = threading.Thread(target=self._run, args=(server_end, policy, intercept), daemon=True)
        self.thread.start()

    def _run(self, stream: socket.socket, policy: NetworkPolicy, intercept: Interceptor | None) -> None:
        self.entry = relay(stream, policy, self.log, intercept=intercept, head_timeout=5)

    def connect(self, port: int, trust: str, *, alpn: list[str] | None = None) -> ssl.SSLSocket:
        self.client.sendall(f"CONNECT api.test:{port} HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.client.recv(1)
        assert head.startswith(b"HTTP/1.1 200"), head
        context = ssl.create_default_context(cadata=trust)
        if alpn:
            context.set_alpn_protocols(alpn)
        return context.wrap_socket(self.client, server_hostname="api.test")

    def finish(self) -> ConnectionEntry:
        self.thread.join(timeout=15)
        assert not self.thread.is_alive()
        self.client.close()
        assert self.entry is not None
        return self.entry


def read_all(tls: ssl.SSLSocket) -> bytes:
    data = b""
    with contextlib.suppress(OSError):
        while chunk := tls.recv(65536):
            data += chunk
    return data


def exchange(server: TlsServer, ca: str, request: bytes, **options: Any) -> tuple[bytes, ConnectionEntry]:
    policy = policy_for(server, ca)
    interceptor = Interceptor(policy)
    sandbox = Sandbox(policy, interceptor)
    tls = sandbox.connect(server.port, interceptor.ca.certificate_pem.decode(), **options)
    tls.sendall(request)
    answer = read_all(tls)
    return answer, sandbox.finish()


# -- injection -------------------------------------------------------------------------------------------
def test_headers_are_injected_and_a_client_sent_copy_is_replaced(
    server: TlsServer, pki: tuple[str, bytes, bytes]
) -> None:
    request = (
        f"GET /v1/models?q=1 HTTP/1.1\r\nHost: api.test:{server.port}\r\nauthorization: Bearer mine\r\n"
        "X-API-KEY: forged\r\nAccept: */*\r\nConnection: keep-alive\r\n\r\n"
    ).encode()
    answer, entry = exchange(server, pki[0], request, alpn=["h2", "http/1.1"])
    assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(BODY)
    assert SECRET.encode() not in answer
    (got,) = server.received
    assert got.startswith(b"GET /v1/models?q=1 HTTP/1.1\r\n")
    lines = got.split(b"\r\n")
    assert f"Authorization: {SECRET}".encode() in lines and b"X-Api-Key: k-123" in lines
    assert b"Bearer mine" not in got and b"forged" not in got
    assert [line for line in lines if line.lower().startswith(b"authorization:")] == [
        f"Authorization: {SECRET}".encode()
    ]
    assert b"Connection: close" in lines and b"keep-alive" not in got.lower()
    assert f"Host: api.test:{server.port}".encode() in lines and b"Accept: */*" in lines
    assert entry.decision == "allowed" and entry.rule == f"allow api.test:{server.port}"
    assert "headers injected (Authorization, X-Api-Key) into GET" in entry.detail
    assert SECRET not in repr(entry) and entry.bytes_up == len(got) and entry.bytes_down == len(answer)


def test_only_http_1_1_is_offered_by_alpn(server: TlsServer, pki: tuple[str, bytes, bytes]) -> None:
    policy = policy_for(server, pki[0])
    interceptor = Interceptor(policy)
    sandbox = Sandbox(policy, interceptor)
    tls = sandbox.connect(server.port, interceptor.ca.certificate_pem.decode(), alpn=["h2", "http/1.1"])
    assert tls.selected_alpn_protocol() == "http/1.1"
    # The leaf the sandbox sees is the session CA's, for the name it asked for.
    leaf = x509.load_der_x509_certificate(tls.getpeercert(binary_form=True) or b"")
    assert leaf.issuer == interceptor.ca.certificate.subject
    assert leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    ) == ["api.test"]
    tls.sendall(f"GET / HTTP/1.1\r\nHost: api.test:{server.port}\r\n\r\n".encode())
    assert read_all(tls).endswith(BODY)
    sandbox.finish()


def test_a_body_is_forwarded_exactly_as_framed(server: TlsServer, pki: tuple[str, bytes, bytes]) -> None:
    data = b"x" * 200_000
    request = (
        f"POST /upload HTTP/1.1\r\nHost: api.test:{server.port}\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode() + data
    answer, entry = exchange(server, pki[0], request)
    assert answer.endswith(BODY)
    (got,) = server.received
    assert got.endswith(b"\r\n\r\n" + data)
    assert entry.bytes_up == len(got)


def test_a_chunked_body_is_forwarded_and_nothing_after_it(
    server: TlsServer, pki: tuple[str, bytes, bytes]
) -> None:
    request = (
        f"POST /c HTTP/1.1\r\nHost: api.test:{server.port}\r\nTransfer-Encoding: chunked\r\n\r\n"
        "5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"
        # A pipelined second request with its own credential: never forwarded.
        f"GET /second HTTP/1.1\r\nHost: api.test:{server.port}\r\nAuthorization: Bearer mine\r\n\r\n"
    ).encode()
    answer, _ = exchange(server, pki[0], request)
    assert answer.endswith(BODY)
    (got,) = server.received
    assert got.endswith(b"\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n")
    assert b"/second" not in got and b"Bearer mine" not in got


def test_one_request_per_connection(server: TlsServer, pki: tuple[str, bytes, bytes]) -> None:
    one = f"GET /a HTTP/1.1\r\nHost: api.test:{server.port}\r\n\r\n".encode()
    two = f"GET /b HTTP/1.1\r\nHost: api.test:{server.port}\r\n\r\n".encode()
    answer, _ = exchange(server, pki[0], one + two)
    assert answer.count(b"HTTP/1.1 200") == 1
    assert len(server.received) == 1 and server.received[0].startswith(b"GET /a ")


# -- refusals ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["TRACE", "TRACK"])
def test_trace_is_refused_since_it_would_echo_the_credentials(
    server: TlsServer, pki: tuple[str, bytes, bytes], method: str
) -> None:
    answer, entry = exchange(server, pki[0], f"{method} / HTTP/1.1\r\nHost: api.test\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 405 ")
    assert (entry.decision, entry.rule) == ("refused", "method")
    assert all(b"HTTP/1.1" not in got for got in server.received)


@pytest.mark.parametrize(
    "request_head",
    [
        "GET / HTTP/1.1\r\nHost: other.test\r\n\r\n",
        "GET http://api.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: api.test\r\nHost: api.test\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: api.test\r\n Authorization: folded\r\n\r\n",
        "CONNECT api.test:443 HTTP/1.1\r\nHost: api.test\r\n\r\n",
        "GET / HTTP/2.0\r\nHost: api.test\r\n\r\n",
    ],
)
def test_a_bad_head_inside_the_tunnel_is_a_400_and_reaches_nothing(
    server: TlsServer, pki: tuple[str, bytes, bytes], request_head: str
) -> None:
    answer, entry = exchange(server, pki[0], request_head.encode())
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    assert (entry.decision, entry.rule) == ("refused", "bad request")
    assert all(b"HTTP/1.1" not in got for got in server.received)


def test_an_upstream_that_does_not_verify_is_a_502_and_gets_no_request(server: TlsServer) -> None:
    answer, entry = exchange(server, "", f"GET / HTTP/1.1\r\nHost: api.test:{server.port}\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 502 ") and b"did not verify" in answer
    assert (entry.decision, entry.rule) == ("refused", "upstream certificate")
    assert all(b"HTTP/1.1" not in got for got in server.received)


def test_a_client_that_does_not_trust_the_session_ca_fails_and_nothing_is_sent(
    server: TlsServer, pki: tuple[str, bytes, bytes]
) -> None:
    policy = policy_for(server, pki[0])
    sandbox = Sandbox(policy, Interceptor(policy))
    with pytest.raises(ssl.SSLCertVerificationError):
        sandbox.connect(server.port, pki[0])  # trusts the real server's CA, not the session's
    entry = sandbox.finish()
    assert (entry.decision, entry.rule) == ("refused", "tls intercept")
    assert server.accepted == 0 or server.received in ([], [b""])


# -- passthrough -------------------------------------------------------------------------------------------
def test_a_host_without_headers_passes_through_untouched(
    server: TlsServer, pki: tuple[str, bytes, bytes]
) -> None:
    policy = policy_for(server, pki[0], headers=False)
    interceptor = Interceptor(
        policy_for(server, pki[0])
    )  # a session CA exists, but not for this policy's host
    sandbox = Sandbox(policy, interceptor)
    tls = sandbox.connect(server.port, pki[0])  # verified against the real server's own certificate
    leaf = x509.load_der_x509_certificate(tls.getpeercert(binary_form=True) or b"")
    assert leaf.public_bytes(serialization.Encoding.PEM) == pki[1]
    tls.sendall(
        f"GET / HTTP/1.1\r\nHost: api.test:{server.port}\r\nAuthorization: Bearer mine\r\n\r\n".encode()
    )
    assert read_all(tls).endswith(BODY)
    entry = sandbox.finish()
    (got,) = server.received
    assert b"Authorization: Bearer mine\r\n" in got and SECRET.encode() not in got
    assert "injected" not in entry.detail


def test_without_an_interceptor_a_host_with_headers_is_refused(
    server: TlsServer, pki: tuple[str, bytes, bytes]
) -> None:
    """Headers that cannot be injected are refused before connecting: never sent without them, unnoticed."""
    sandbox = Sandbox(policy_for(server, pki[0]), None)
    sandbox.client.sendall(
        f"CONNECT api.test:{server.port} HTTP/1.1\r\nHost: api.test:{server.port}\r\n\r\n".encode()
    )
    answer = b""
    with contextlib.suppress(OSError):
        while chunk := sandbox.client.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 403 ") and b"cannot inject" in answer
    entry = sandbox.finish()
    assert (entry.decision, entry.rule) == ("refused", "headers")
    assert server.received == []


# -- the session CA and the sandbox's trust ----------------------------------------------------------------
def test_the_session_ca_is_a_name_constrained_ca_and_its_key_stays_in_memory() -> None:
    ca = SessionCA(["api.test"])
    pem = ca.certificate_pem
    assert pem.startswith(b"-----BEGIN CERTIFICATE-----") and b"PRIVATE KEY" not in pem
    cert = ca.certificate
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    constraints = cert.extensions.get_extension_for_class(x509.NameConstraints)
    assert constraints.critical and constraints.value.permitted_subtrees == [x509.DNSName("api.test")]
    assert cert.not_valid_after_utc - cert.not_valid_before_utc <= datetime.timedelta(days=8)
    leaf = ca.leaf("api.test")
    assert leaf.not_valid_after_utc - leaf.not_valid_before_utc <= datetime.timedelta(hours=25)
    assert ca.server_context("api.test") is ca.server_context("api.test")  # cached
    assert "PRIVATE" not in repr(ca)
    with pytest.raises(TypeError):
        pickle.dumps(ca)


def test_a_client_refuses_a_session_ca_certificate_for_a_name_outside_its_constraints() -> None:
    ca = SessionCA(["api.test"])
    client = ssl.create_default_context(cadata=ca.certificate_pem.decode())
    for host, works in (("api.test", True), ("other.test", False)):
        left, right = socket.socketpair()
        left.settimeout(5)
        right.settimeout(5)
        served = TlsStream(right, ca.server_context(host), server_side=True)
        thread = threading.Thread(target=_try, args=(served,))
        thread.start()
        try:
            if works:
                client.wrap_socket(left, server_hostname=host).close()
            else:
                with pytest.raises(ssl.SSLCertVerificationError):
                    client.wrap_socket(left, server_hostname=host)
        finally:
            left.close()
            thread.join(5)
            right.close()


def _try(stream: TlsStream) -> None:
    with contextlib.suppress(ssl.SSLError, OSError):
        stream.handshake()


def test_sandbox_trust_keeps_the_system_bundle_and_names_it_in_every_variable() -> None:
    ca = SessionCA(["api.test"])
    system = b"-----BEGIN CERTIFICATE-----\nsystem\n-----END CERTIFICATE-----"
    trust = sandbox_trust(ca.certificate_pem, system)
    assert trust.path == SANDBOX_CA_PATH
    assert trust.pem.startswith(system + b"\n") and trust.pem.endswith(ca.certificate_pem)
    assert dict(trust.env) == dict.fromkeys(TRUST_ENV_NAMES, SANDBOX_CA_PATH)
    assert {
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "PIP_CERT",
        "GIT_SSL_CAINFO",
    } <= set(trust.env)
    assert sandbox_trust(ca.certificate_pem).pem.endswith(ca.certificate_pem)
    with pytest.raises(ValueError, match="private key"):
        sandbox_trust(b"-----BEGIN PRIVATE KEY-----\n")


def test_upstream_ca_takes_certificates_only(pki: tuple[str, bytes, bytes]) -> None:
    assert NetworkPolicy(upstream_ca=(pki[0],)).upstream_ca == (pki[0],)
    with pytest.raises(ValueError, match="never a private key"):
        NetworkPolicy(upstream_ca=(pki[0] + pki[2].decode(),))
    with pytest.raises(ValueError, match="not a PEM certificate"):
        NetworkPolicy(upstream_ca=("garbage",))
