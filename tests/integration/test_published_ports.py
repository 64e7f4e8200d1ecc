"""Published ports on a Docker session, attacked: what the host address can reach, floods, the bounds, close.

``session.publish(port)`` listens on the host's loopback and carries each connection over the agent channel
to ``127.0.0.1:port`` inside (executor/channel/ports.py). The servers here answer each connection with a
token naming who they are, so "reached the wrong place" is read on the client side and checked against
the servers that could have answered: one on this host's loopback and one in a neighbour sandbox, both on
the same port number. A naive design that forwards to ``127.0.0.1:port`` on the host (as a ``socat``
or an SSH ``-L`` on the host would), or to the engine's address of the container, fails the first test.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from adk_sandbox.executor import ExecRequest, Language
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from adk_sandbox.executor.channel.ports import MAX_CONNECTIONS, MAX_PUBLISHED
from adk_sandbox.executor.errors import InvalidRequestError, SandboxFailedError

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]

# Answers every connection with its token and keeps it open (so a flood holds connections), for ever.
SERVER = """
import socket, sys, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(1024)
held = []
while True:
    c, _ = s.accept()
    c.sendall(sys.argv[2].encode())
    held.append(c)
"""


def serve_inside(session: DockerSession, port: int, token: str) -> None:
    """Start SERVER in the sandbox (kept running after the command: background)."""
    started = session.execute(
        ExecRequest(
            language=Language.COMMAND,
            code='python3 -c "$SERVER" "$PORT" "$TOKEN" >/dev/null 2>&1 &',
            env={"SERVER": SERVER, "PORT": str(port), "TOKEN": token},
            background=True,
            timeout=30,
        )
    )
    assert started.exit_code == 0, started.stderr


def first_answer(address: str, seconds: float = 20) -> bytes:
    """What the first connection through ``address`` that gets any answer receives (b"": none did)."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), timeout=5) as client:
            client.settimeout(5)
            data = client.recv(100)
            if data:
                return data
        time.sleep(0.1)
    return b""


@pytest.fixture(scope="module")
def backend() -> Iterator[DockerBackend]:
    with DockerBackend() as made:
        yield made


@pytest.fixture
def session(backend: DockerBackend) -> Iterator[DockerSession]:
    with backend.session() as opened:
        yield opened


@pytest.fixture
def port() -> int:
    return random.randint(20000, 29999)


def test_a_published_port_reaches_only_the_sandboxs_own_loopback(
    backend: DockerBackend, session: DockerSession, port: int
) -> None:
    host_server = socket.create_server(("127.0.0.1", port))  # this host's service on the same number
    answered: list[bytes] = []

    def host_answers() -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = host_server.accept()
                answered.append(b"host")
                client.sendall(b"HOST")
                client.close()

    threading.Thread(target=host_answers, daemon=True).start()
    try:
        with backend.session() as neighbour:
            serve_inside(neighbour, port, "NEIGHBOUR")
            address = session.publish(port)
            # Nothing listens inside this sandbox yet: no connection may land anywhere else.
            assert first_answer(address, seconds=3) == b""
            serve_inside(session, port, "OWN")
            assert first_answer(address) == b"OWN"
            assert answered == []  # the host's server was never connected to
    finally:
        host_server.close()


def test_a_flood_of_connections_is_bounded_and_the_session_goes_on(
    backend: DockerBackend, session: DockerSession, port: int
) -> None:
    serve_inside(session, port, "x")
    address = session.publish(port)
    assert first_answer(address) == b"x"
    host, _, number = address.rpartition(":")
    fds_before = len(os.listdir("/proc/self/fd"))
    clients = []
    for _ in range(1000):
        with contextlib.suppress(OSError):
            clients.append(socket.create_connection((host, int(number)), timeout=5))
    carried = 0
    for client in clients:
        client.settimeout(5)
        with contextlib.suppress(OSError):
            carried += client.recv(1) == b"x"  # a connection past the bound is closed: b""
    assert 1 <= carried <= MAX_CONNECTIONS, carried
    for client in clients:
        client.close()
    # The session, its neighbours and the address itself are unaffected once the flood is gone.
    with backend.session() as neighbour:
        assert (
            neighbour.execute(ExecRequest(language=Language.COMMAND, code="echo ok", timeout=30)).stdout
            == "ok\n"
        )
    assert (
        session.execute(ExecRequest(language=Language.COMMAND, code="echo ok", timeout=30)).stdout == "ok\n"
    )
    assert first_answer(address) == b"x"
    time.sleep(1)  # the carried connections' threads close their ends
    assert len(os.listdir("/proc/self/fd")) < fds_before + 2 * MAX_CONNECTIONS


def test_ports_are_bounded_checked_and_gone_at_close(backend: DockerBackend, port: int) -> None:
    session = backend.session()
    session.start()
    addresses = [session.publish(20000 + n) for n in range(MAX_PUBLISHED)]
    assert session.publish(20000) == addresses[0]  # publishing again: the same address
    with pytest.raises(InvalidRequestError, match=f"already publishes {MAX_PUBLISHED} ports"):
        session.publish(port)
    assert len(session.published()) == MAX_PUBLISHED and port not in session.published()
    for bad in (0, 65536, -1, True):
        with pytest.raises(InvalidRequestError, match="port must be an integer"):
            session.publish(bad)
    session.unpublish(20000)
    session.unpublish(20000)  # not published: no error
    session.close()
    for address in addresses:
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", int(address.rpartition(":")[2])), timeout=2).close()
    with pytest.raises(SandboxFailedError):
        session.publish(port)


def test_adk_sandbox_run_publish(port: int) -> None:
    host_port = port + 10000
    command = [str(Path(sys.executable).parent / "adk-sandbox"), "run", "--publish", f"{host_port}:{port}"]
    server = (
        "import http.server as h, sys\n"
        "h.HTTPServer(('127.0.0.1', int(sys.argv[1])), h.SimpleHTTPRequestHandler).serve_forever()"
    )
    with subprocess.Popen(
        [*command, "--", "python3", "-c", server, str(port)], stderr=subprocess.PIPE, text=True
    ) as run:
        try:
            assert run.stderr is not None
            line = run.stderr.readline()
            assert line == f"adk-sandbox: port {port} of the sandbox is at http://127.0.0.1:{host_port}\n"
            assert b"HTTP/1.0 200" in _http_get(host_port)
        finally:
            run.terminate()
            run.wait(60)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", host_port), timeout=2).close()


def _http_get(host_port: int) -> bytes:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", host_port), timeout=5) as client,
        ):
            client.sendall(b"GET / HTTP/1.0\r\n\r\n")
            client.settimeout(5)
            reply = client.recv(100)
            if reply:
                return reply
        time.sleep(0.2)
    return b""
