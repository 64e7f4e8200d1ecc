"""Credentials that never enter the sandbox: TLS terminated on the host for hosts with injected headers.

:class:`Interceptor` serves a CONNECT tunnel the relay hands it (one request per connection, headers
injected) with leaf certificates of a per-session :class:`SessionCA`; :func:`sandbox_trust` gives the
bundle and environment (:data:`TRUST_ENV_NAMES`) that make the sandbox trust it.
See docs/network.md, section "Header injection".
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import secrets
import shutil
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from adk_sandbox.executor.network.http_head import (
    HOP_BY_HOP,
    MAX_LINE,
    HeadError,
    _check_framing,
    _headers,
    _lines,
    head_end,
    response,
)
from adk_sandbox.executor.network.policy import NetworkPolicy
from adk_sandbox.executor.network.relay import ByteStream

__all__ = [
    "CA_VALIDITY",
    "LEAF_VALIDITY",
    "SANDBOX_CA_PATH",
    "SYSTEM_BUNDLE_PATHS",
    "TRUST_ENV_NAMES",
    "InterceptResult",
    "Interceptor",
    "SandboxTrust",
    "SessionCA",
    "TlsStream",
    "sandbox_trust",
    "upstream_context",
]

CA_VALIDITY = datetime.timedelta(days=7)
"""How long a session's CA certificate is valid (a session older than this fails TLS to header hosts)."""
LEAF_VALIDITY = datetime.timedelta(hours=24)
"""How long a leaf certificate is valid; one is re-made when less than an hour of it is left."""
_LEAF_RENEW = datetime.timedelta(hours=1)
_BACKDATE = datetime.timedelta(minutes=5)  # a sandbox clock slightly behind the host's still accepts it
SANDBOX_CA_PATH = "/tmp/adk-sandbox-ca.pem"
"""Where the session writes the trust bundle inside the sandbox."""
SYSTEM_BUNDLE_PATHS = (
    "/etc/ssl/certs/ca-certificates.crt",  # Debian, Ubuntu, Alpine
    "/etc/pki/tls/certs/ca-bundle.crt",  # Fedora, RHEL
    "/etc/ssl/cert.pem",  # Alpine (LibreSSL), macOS
)
"""The image's system bundle, first found first: it goes in front of the session CA in the bundle."""
TRUST_ENV_NAMES = (
    "SSL_CERT_FILE",  # OpenSSL (Python's ssl, curl built with OpenSSL, Ruby, ...)
    "REQUESTS_CA_BUNDLE",  # requests (it ignores SSL_CERT_FILE)
    "CURL_CA_BUNDLE",  # curl and requests
    "NODE_EXTRA_CA_CERTS",  # Node.js (added to its own roots)
    "PIP_CERT",  # pip (its vendored certifi otherwise)
    "GIT_SSL_CAINFO",  # git over HTTPS
)
"""The variables commands get, each naming the bundle."""

_CHUNK = 64 * 1024
_UNSAFE_METHODS = frozenset({"TRACE", "TRACK"})
_ORIGIN_TARGET = re.compile(r"/[\x21-\x7e]*")
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")


# -- the per-session CA ------------------------------------------------------------------------------
def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _load_chain(context: ssl.SSLContext, chain_pem: bytes) -> None:
    """Load a certificate and its key (both in ``chain_pem``) into ``context`` without a file on disk."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("adk-sandbox-leaf", os.MFD_CLOEXEC)
        try:
            os.write(fd, chain_pem)
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return
    directory = tempfile.mkdtemp(prefix="adk-sandbox-leaf-")  # 0700: only this user
    try:
        path = os.path.join(directory, "leaf.pem")
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as out:
            out.write(chain_pem)
        context.load_cert_chain(path)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


class SessionCA:
    """A session's own CA: its key lives in this object only; leaf certificates per host, cached.

    ``hosts`` (the names with headers) become the CA's name constraints: clients refuse any certificate it
    signs for another name, so even this CA's trust cannot be turned against other hosts.
    """

    def __init__(
        self,
        hosts: Iterable[str] = (),
        *,
        validity: datetime.timedelta = CA_VALIDITY,
        leaf_validity: datetime.timedelta = LEAF_VALIDITY,
    ) -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._leaf_validity = leaf_validity
        now = _now()
        self.not_after = now + validity
        self._name = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "adk-sandbox"),
                x509.NameAttribute(NameOID.COMMON_NAME, f"adk-sandbox session CA {secrets.token_hex(4)}"),
            ]
        )
        public = self._key.public_key()
        builder = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(self.not_after)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        )
        names = sorted(set(hosts))
        if names:
            builder = builder.add_extension(
                x509.NameConstraints(
                    permitted_subtrees=[x509.DNSName(n) for n in names], excluded_subtrees=None
                ),
                critical=True,
            )
        self.certificate = builder.sign(self._key, hashes.SHA256())
        self._ski = x509.SubjectKeyIdentifier.from_public_key(public)
        self._lock = threading.Lock()
        self._leaves: dict[str, tuple[ssl.SSLContext, datetime.datetime]] = {}

    @property
    def certificate_pem(self) -> bytes:
        """The CA certificate in PEM: the public part, what the sandbox trusts."""
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def __repr__(self) -> str:
        return f"SessionCA({self.certificate.subject.rfc4514_string()!r})"  # never the key

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("a session CA is never pickled: its key stays in the process that made it")

    def leaf(self, host: str) -> x509.Certificate:
        """A fresh leaf certificate for ``host`` (mostly for tests; :meth:`server_context` caches)."""
        return self._make_leaf(host)[0]

    def _make_leaf(self, host: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        public = key.public_key()
        certificate = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(self._name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(min(now + self._leaf_validity, self.not_after))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(self._ski), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        return certificate, key

    def server_context(self, host: str) -> ssl.SSLContext:
        """The TLS server context presenting ``host``'s leaf certificate (made once, re-made near expiry)."""
        with self._lock:
            cached = self._leaves.get(host)
            if cached is not None and cached[1] - _now() > _LEAF_RENEW:
                return cached[0]
            certificate, key = self._make_leaf(host)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.set_alpn_protocols(["http/1.1"])
            key_pem = key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
            _load_chain(context, certificate.public_bytes(serialization.Encoding.PEM) + key_pem)
            self._leaves[host] = (context, certificate.not_valid_after_utc)
            return context


def upstream_context(extra_ca: Iterable[str] = ()) -> ssl.SSLContext:
    """The client context for real servers: the system trust store plus ``extra_ca`` (PEM), name checked."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    for pem in extra_ca:
        context.load_verify_locations(cadata=pem)
    context.set_alpn_protocols(["http/1.1"])
    return context


# -- the trust inside the sandbox ----------------------------------------------------------------------
@dataclass(frozen=True)
class SandboxTrust:
    """What a session puts in the sandbox so its clients trust the session CA."""

    path: str
    """Where the bundle goes inside the sandbox."""
    pem: bytes
    """The bundle: the image's system certificates (if any), then the session CA's certificate."""
    env: Mapping[str, str] = field(default_factory=dict)
    """The variables commands get: each of :data:`TRUST_ENV_NAMES` names :attr:`path`."""


def sandbox_trust(
    ca_pem: bytes, system_bundle: bytes | None = None, *, path: str = SANDBOX_CA_PATH
) -> SandboxTrust:
    """The bundle to write at ``path`` inside the sandbox and the environment naming it.

    ``system_bundle`` is the image's own bundle (one of :data:`SYSTEM_BUNDLE_PATHS`, read from inside),
    kept first so that hosts without headers, whose certificates the sandbox verifies itself, still do.
    Refuses anything holding a private key: only certificates ever go into the sandbox.
    """
    for part in (ca_pem, system_bundle or b""):
        if b"PRIVATE KEY" in part:
            raise ValueError("a trust bundle holds certificates only, never a private key")
    bundle = system_bundle or b""
    if bundle and not bundle.endswith(b"\n"):
        bundle += b"\n"
    bundle += b"# adk-sandbox session CA (header injection)\n" + ca_pem
    return SandboxTrust(path=path, pem=bundle, env=dict.fromkeys(TRUST_ENV_NAMES, path))


# -- TLS over any byte stream ----------------------------------------------------------------------------
class TlsStream:
    """TLS over a duplex byte stream (a ``ByteStream``: the sandbox's connection, or a socket).

    Uses memory BIOs, so the stream need not be a socket. One thread may receive while another sends: the
    TLS object is used under a lock that is never held while waiting on the stream, and what TLS writes
    goes out in order under a second lock.
    """

    def __init__(
        self,
        raw: ByteStream,
        context: ssl.SSLContext,
        *,
        server_side: bool,
        server_hostname: str | None = None,
        early: bytes = b"",
    ) -> None:
        self.raw = raw
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        if early:
            self._in.write(early)
        self._tls = context.wrap_bio(
            self._in, self._out, server_side=server_side, server_hostname=server_hostname
        )
        self._tls_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()

    def _flush(self) -> None:
        with self._send_lock:
            with self._tls_lock:
                data = self._out.read()
            if data:
                self.raw.sendall(data)

    def _fill(self) -> None:
        data = self.raw.recv(_CHUNK)
        with self._tls_lock:
            if data:
                self._in.write(data)
            else:
                self._in.write_eof()

    def handshake(self) -> None:
        """Complete the handshake (``ssl.SSLError`` when it fails, ``TimeoutError`` past the stream's)."""
        with self._recv_lock:
            while True:
                with self._tls_lock:
                    try:
                        self._tls.do_handshake()
                        done = True
                    except ssl.SSLWantReadError:
                        done = False
                self._flush()
                if done:
                    return
                self._fill()

    @property
    def alpn(self) -> str | None:
        """The protocol ALPN chose (``http/1.1``), if any."""
        return self._tls.selected_alpn_protocol()

    def recv(self, size: int, /) -> bytes:
        """Up to ``size`` decrypted bytes; ``b""`` once the peer closed (cleanly or not)."""
        with self._recv_lock:
            while True:
                data: bytes | None
                with self._tls_lock:
                    try:
                        data = self._tls.read(size)
                    except ssl.SSLWantReadError:
                        data = None
                    except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                        data = b""
                self._flush()  # a TLS 1.3 key update or ticket answer
                if data is not None:
                    return data
                self._fill()

    def sendall(self, data: bytes, /) -> None:
        """Encrypt and send every byte of ``data``."""
        view = memoryview(data)
        while view:
            with self._tls_lock:
                written = self._tls.write(view[:_CHUNK])
            view = view[written:]
            self._flush()

    def close_notify(self) -> None:
        """Send a TLS close_notify (best effort; the stream itself stays open)."""
        with contextlib.suppress(ssl.SSLError, OSError, ValueError):
            with self._tls_lock, contextlib.suppress(ssl.SSLWantReadError):
                self._tls.unwrap()
            self._flush()


# -- one intercepted request ----------------------------------------------------------------------------
class _Refusal(Exception):
    def __init__(self, rule: str, detail: str, answer: bytes = b"") -> None:
        super().__init__(detail)
        self.rule = rule
        self.detail = detail
        self.answer = answer


@dataclass
class InterceptResult:
    """How one intercepted connection went, for the session's log (never a header's value)."""

    rule: str | None = None
    """None when the request went through; what refused it otherwise (``upstream certificate``, ...)."""
    detail: str = ""
    up: int = 0
    """Decrypted bytes delivered to the server (the rewritten head and the body)."""
    down: int = 0
    """Decrypted bytes delivered to the sandbox."""


class _Reader:
    """Buffered reading of a :class:`TlsStream`, bounded per call."""

    def __init__(self, stream: TlsStream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    def fill(self) -> None:
        data = self.stream.recv(_CHUNK)
        if not data:
            raise EOFError("the sandbox closed mid-request")
        self.buffer += data

    def take(self, size: int) -> bytes:
        if not self.buffer:
            self.fill()
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    def line(self) -> bytes:
        while (end := self.buffer.find(b"\n")) == -1:
            if len(self.buffer) > MAX_LINE:
                raise HeadError(f"a line of the chunked body is longer than {MAX_LINE} bytes")
            self.fill()
        data = bytes(self.buffer[: end + 1])
        del self.buffer[: end + 1]
        if not data.endswith(b"\r\n"):
            raise HeadError("a line of the chunked body does not end with CRLF")
        return data


def _forward_head(head: bytes, host: str, port: int, headers: Mapping[str, str]) -> tuple[bytes, str, str]:
    """The rewritten head, the method and how the body is framed (``length:N``, ``chunked`` or ``none``)."""
    lines = _lines(head)
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
        raise HeadError(f"malformed request line {lines[0][:80]!r}: expected 'METHOD /path HTTP/1.1'")
    method, target, version = parts
    if method == "CONNECT":
        raise HeadError("CONNECT inside a tunnel is not served")
    if method in _UNSAFE_METHODS:
        raise _Refusal("method", f"{method} is refused here", response(405, "Method Not Allowed", (
            f"the sandbox's network proxy does not forward {method} to {host}: the server would echo "
            "the credentials it adds"
        )))  # fmt: skip
    if not (_ORIGIN_TARGET.fullmatch(target) or (method == "OPTIONS" and target == "*")):
        raise HeadError(f"the request target {target[:80]!r} is not a path (origin form: /path?query)")
    fields = _headers(lines[1:])
    _check_framing(fields)
    shown = host if port == 443 else f"{host}:{port}"
    hosts = [value for name, value in fields if name.lower() == "host"]
    if len(hosts) > 1:
        raise HeadError("several Host headers are not accepted")
    if hosts and hosts[0].lower().rstrip(".") not in {shown, f"{host}:{port}"}:
        raise HeadError(f"the Host header names {hosts[0][:80]!r} but the tunnel is to {shown}")
    named = {t.strip().lower() for n, v in fields if n.lower() == "connection" for t in v.split(",")}
    injected = {name.lower() for name in headers}
    drop = HOP_BY_HOP | named | injected | {"host"}
    out = [f"{method} {target} {version}", f"Host: {hosts[0] if hosts else shown}"]
    out += [f"{name}: {value}" for name, value in fields if name.lower() not in drop]
    out += [f"{name}: {value}" for name, value in headers.items()]
    out.append("Connection: close")
    lengths = [value for name, value in fields if name.lower() == "content-length"]
    codings = [value for name, value in fields if name.lower() == "transfer-encoding"]
    if codings:
        if codings[-1].split(",")[-1].strip().lower() != "chunked":
            raise HeadError("a request Transfer-Encoding must end with chunked")
        framing = "chunked"
    elif lengths:
        framing = f"length:{int(lengths[0])}"
    else:
        framing = "none"
    return ("\r\n".join(out) + "\r\n\r\n").encode("latin-1"), method, framing


def _copy_body(reader: _Reader, framing: str, upstream: TlsStream) -> int:
    """Send the request body, exactly as framed, to the server; the bytes sent."""
    sent = 0

    def send(data: bytes) -> None:
        nonlocal sent
        upstream.sendall(data)
        sent += len(data)

    if framing.startswith("length:"):
        left = int(framing.removeprefix("length:"))
        while left:
            data = reader.take(min(left, _CHUNK))
            left -= len(data)
            send(data)
        return sent
    if framing != "chunked":
        return sent
    while True:
        line = reader.line()
        size_text = line[:-2].split(b";", 1)[0].strip(b" \t")
        if not _CHUNK_SIZE.fullmatch(size_text):
            raise HeadError("a chunk size is not hexadecimal")
        size = int(size_text, 16)
        send(line)
        if size == 0:
            break
        while size:
            data = reader.take(min(size, _CHUNK))
            size -= len(data)
            send(data)
        if reader.line() != b"\r\n":
            raise HeadError("a chunk does not end with CRLF")
        send(b"\r\n")
    while (line := reader.line()) != b"\r\n":  # trailers, then the empty line
        send(line)
    send(b"\r\n")
    return sent


def _wake(stream: object) -> None:
    shutdown = getattr(stream, "shutdown", None)
    if shutdown is not None:
        with contextlib.suppress(OSError):
            shutdown(socket.SHUT_RDWR)


class Interceptor:
    """One session's TLS termination: its CA, the upstream trust, and :meth:`serve` per connection."""

    def __init__(self, policy: NetworkPolicy, *, ca: SessionCA | None = None) -> None:
        self.ca = ca or SessionCA(policy.headers)
        self._upstream = upstream_context(policy.upstream_ca)

    def sandbox_trust(
        self, system_bundle: bytes | None = None, *, path: str = SANDBOX_CA_PATH
    ) -> SandboxTrust:
        """The bundle and environment for the sandbox (see :func:`sandbox_trust`)."""
        return sandbox_trust(self.ca.certificate_pem, system_bundle, path=path)

    def serve(
        self,
        stream: ByteStream,
        upstream: socket.socket,
        *,
        host: str,
        port: int,
        hello: bytes,
        headers: Mapping[str, str],
        timeout: float,
    ) -> InterceptResult:
        """Serve one CONNECT tunnel to ``host`` whose ClientHello (``hello``) was checked; see the module.

        ``upstream`` is the connected (checked-address) socket to the server. Returns when the exchange
        is over; the caller closes both ends.
        """
        result = InterceptResult()
        sandbox: TlsStream | None = None
        try:
            stream.settimeout(timeout)
            sandbox = TlsStream(stream, self.ca.server_context(host), server_side=True, early=hello)
            try:
                sandbox.handshake()
            except (ssl.SSLError, EOFError, TimeoutError, OSError) as error:
                raise _Refusal(
                    "tls intercept",
                    f"the sandbox's TLS handshake with the session CA's certificate failed ({error}); "
                    "does the client trust the session CA (SSL_CERT_FILE)?",
                ) from None
            upstream.settimeout(timeout)
            server = TlsStream(upstream, self._upstream, server_side=False, server_hostname=host)
            try:
                server.handshake()
            except ssl.SSLCertVerificationError as error:
                why = f"the certificate of {host} did not verify: {error.verify_message or error}"
                raise _Refusal("upstream certificate", why, _bad_gateway(why)) from None
            except (ssl.SSLError, OSError, EOFError) as error:
                why = f"the TLS handshake with {host} failed: {error}"
                raise _Refusal("upstream tls", why, _bad_gateway(why)) from None
            self._exchange(
                sandbox, server, host=host, port=port, headers=headers, timeout=timeout, result=result
            )
        except _Refusal as refusal:
            result.rule, result.detail = refusal.rule, refusal.detail
            if refusal.answer and sandbox is not None:
                with contextlib.suppress(ssl.SSLError, OSError):
                    sandbox.sendall(refusal.answer)
        except (ssl.SSLError, OSError, EOFError) as error:
            result.detail += f"; ended by {type(error).__name__}"
        finally:
            if sandbox is not None:
                sandbox.close_notify()
        result.detail = result.detail.removeprefix("; ")
        return result

    @staticmethod
    def _exchange(
        sandbox: TlsStream,
        server: TlsStream,
        *,
        host: str,
        port: int,
        headers: Mapping[str, str],
        timeout: float,
        result: InterceptResult,
    ) -> None:
        reader = _Reader(sandbox)
        deadline = time.monotonic() + timeout
        try:
            while (end := head_end(bytes(reader.buffer))) is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                # Each read gets what is left of the deadline, not all of it: the head's bound is ``timeout``
                # in all, however its bytes trickle in.
                sandbox.raw.settimeout(remaining)
                reader.fill()
            head = bytes(reader.buffer[:end])
            del reader.buffer[:end]
            forwarded, method, framing = _forward_head(head, host, port, headers)
        except HeadError as error:
            raise _Refusal("bad request", str(error), _bad_request(str(error))) from None
        except (TimeoutError, EOFError):
            raise _Refusal("head timeout", "no complete request head inside the tunnel") from None
        sandbox.raw.settimeout(None)
        server.raw.settimeout(None)
        server.sendall(forwarded)
        result.up = len(forwarded)
        result.detail = f"headers injected ({', '.join(headers)}) into {method}"
        body_done = threading.Event()

        def body() -> None:
            try:
                result.up += _copy_body(reader, framing, server)
            except (HeadError, EOFError, ssl.SSLError, OSError) as error:
                result.detail += f"; request body cut short ({error})"
                _wake(server.raw)  # the server would wait for the rest: end the exchange
            finally:
                body_done.set()

        sender = threading.Thread(target=body, name="network-intercept-body", daemon=True)
        sender.start()
        try:
            while data := server.recv(_CHUNK):
                sandbox.sendall(data)
                result.down += len(data)
        finally:
            if not body_done.is_set():
                _wake(sandbox.raw)  # the response is over: nothing more of the request is wanted
            sender.join(timeout=5)


def _bad_gateway(why: str) -> bytes:
    return response(502, "Bad Gateway", f"the sandbox's network proxy could not reach the server: {why}")


def _bad_request(why: str) -> bytes:
    return response(400, "Bad Request", f"the sandbox's network proxy could not serve this request: {why}")
