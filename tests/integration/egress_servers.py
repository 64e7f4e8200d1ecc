"""Servers on the host for the egress tests: each records every byte it was sent, so "nothing was delivered"
is checked where it matters, on the receiving end.

:class:`Upstream` is an HTTP(S) server; :class:`DnsSink` takes DNS queries over UDP and TCP and never
answers; :func:`make_certificate` makes a self-signed certificate for ``allowed.test``. :func:`ensure_image`
builds the small images the egress suites run their clients in (:data:`TOOLS_IMAGE`: curl, dig, ping).
"""

from __future__ import annotations

import io
import shutil
import socket
import ssl
import subprocess
import threading
from pathlib import Path

import docker
import docker.errors

from tests.conftest import require
from tests.loopback_server import LoopbackServer, stop_serving

BODY = b"hello through the policy\n"

TOOLS_IMAGE = "adk-sandbox-test/egress-tools:latest"
TOOLS_DOCKERFILE = b"""FROM adk-sandbox/base:latest
USER root
RUN apt-get update && apt-get install -y --no-install-recommends curl bind9-dnsutils iputils-ping \\
 && rm -rf /var/lib/apt/lists/*
"""


def ensure_image(client: docker.DockerClient, tag: str, dockerfile: bytes) -> str:
    """``tag``, built from ``dockerfile`` unless the engine has it (``--network host``: apt needs it)."""
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        client.images.build(fileobj=io.BytesIO(dockerfile), tag=tag, network_mode="host", rm=True)
    return tag


class Upstream(LoopbackServer):
    """An HTTP(S) server on ``host`` that records every request head (``received``) and raw bytes (``raw``).

    ``raw`` holds, per connection, the bytes the server got before any TLS handshake (peeked, for TLS): a
    connection that sent nothing records ``b""``. ``body`` is what every request is answered with.
    """

    def __init__(
        self, tls: ssl.SSLContext | None = None, host: str = "127.0.0.1", body: bytes = BODY
    ) -> None:
        self.tls = tls
        self.body = body
        self.received: list[bytes] = []
        self.raw: list[bytes] = []
        super().__init__(host)

    @property
    def delivered(self) -> int:
        """Bytes received so far, over every connection."""
        return sum(len(chunk) for chunk in list(self.raw))

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        got = b""
        try:
            if self.tls is not None:
                first = conn.recv(65536, socket.MSG_PEEK)
                self.raw.append(first)
                if not first:
                    return
                conn = self.tls.wrap_socket(conn, server_side=True)
            while b"\r\n\r\n" not in got and (chunk := conn.recv(65536)):
                got += chunk
            if self.tls is None:
                self.raw.append(got)
            self.received.append(got)
            head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(self.body)
            conn.sendall(head + self.body)
        except (OSError, ssl.SSLError):
            if self.tls is None:
                self.raw.append(got)
            self.received.append(got)
        finally:
            conn.close()


class DnsSink:
    """A UDP and a TCP listener on ``host`` (one port) that record what they get and never answer."""

    def __init__(self, host: str) -> None:
        self.tcp = socket.create_server((host, 0))
        self.port = self.tcp.getsockname()[1]
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind((host, self.port))
        self.raw: list[bytes] = []
        self._stopping = False
        self._threads = (
            threading.Thread(target=self._datagrams, daemon=True),
            threading.Thread(target=self._streams, daemon=True),
        )
        for thread in self._threads:
            thread.start()

    @property
    def delivered(self) -> int:
        """Bytes received so far, datagrams and streams."""
        return sum(len(chunk) for chunk in list(self.raw))

    def _datagrams(self) -> None:
        while True:
            try:
                datagram = self.udp.recv(65536)
            except OSError:
                return
            if self._stopping:
                return
            self.raw.append(datagram)

    def _streams(self) -> None:
        while True:
            try:
                conn, _ = self.tcp.accept()
            except OSError:
                return
            conn.settimeout(5)
            try:
                self.raw.append(conn.recv(65536))
            except OSError:
                pass
            finally:
                conn.close()

    def close(self) -> None:
        # A shutdown does not wake a UDP socket's recv here: a datagram of its own does.
        self._stopping = True
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as waker:
            waker.sendto(b"", self.udp.getsockname())
        stop_serving(self.udp, self._threads[0])
        stop_serving(self.tcp, self._threads[1])


def make_certificate(where: Path) -> tuple[Path, Path]:
    """A self-signed certificate and key for ``allowed.test`` in ``where`` (needs the openssl command)."""
    require(shutil.which("openssl") is not None, "the openssl command is needed to make a test certificate")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=allowed.test",
         "-addext", "subjectAltName=DNS:allowed.test"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def server_context(certificate: tuple[Path, Path]) -> ssl.SSLContext:
    """A TLS server context with ``certificate`` (a pair from :func:`make_certificate`)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate)
    return context
