"""The network at run time: ``session.set_network`` cutting a live download, and the warm pool's policy.

The servers are loopback servers these tests start on the host, reached only through ``hosts`` pins (as in
``test_docker_egress.py``). The slow server streams a large body a little at a time, so a download is still
running when the test changes the sandbox's network.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from adk_sandbox.executor import ExecRequest, ExecResult, Language
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from adk_sandbox.executor.backends.docker.pool import PoolConfig
from adk_sandbox.executor.errors import PolicyNotEnforceableError
from adk_sandbox.executor.network.policy import NetworkPolicy
from tests.integration.test_docker_egress import FETCH, Upstream, runtime
from tests.loopback_server import LoopbackServer

__all__ = ["runtime"]  # the fixture: runc, and gVisor when the engine has it

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]

BODY_SIZE = 64 * 1024 * 1024


class SlowServer(LoopbackServer):
    """A loopback HTTP server whose answer to ``/slow`` streams 1 KiB every 20 ms for up to 60 s."""

    def __init__(self) -> None:
        self.sent = 0
        self.cut = threading.Event()  # the client's side went away mid-body
        super().__init__()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            got = b""
            while b"\r\n\r\n" not in got and (chunk := conn.recv(65536)):
                got += chunk
            if not got.startswith(b"GET /slow "):
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n")
                return
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % BODY_SIZE)
            until = time.monotonic() + 60
            try:
                while time.monotonic() < until:
                    conn.sendall(b"x" * 1024)
                    self.sent += 1024
                    time.sleep(0.02)
            except OSError:
                self.cut.set()


DOWNLOAD = """
import urllib.request
got = 0
try:
    with urllib.request.urlopen(URL, timeout=30) as answer:
        size = int(answer.headers['Content-Length'])
        while chunk := answer.read(1024):  # b"" at the connection's end, complete or not
            got += len(chunk)
    print('COMPLETE' if got == size else 'DROPPED', got)
except Exception as error:
    print('DROPPED', got, type(error).__name__)
"""


@pytest.fixture
def slow() -> Iterator[SlowServer]:
    server = SlowServer()
    yield server
    server.close()


def allowing(*servers: SlowServer | Upstream) -> NetworkPolicy:
    return NetworkPolicy(
        allow=[f"allowed.test:{server.port}" for server in servers], hosts={"allowed.test": ["127.0.0.1"]}
    )


def python(session: DockerSession, code: str) -> ExecResult:
    return session.execute(ExecRequest(language=Language.PYTHON, code=code, timeout=60))


def wait_for(condition: object, timeout: float = 20.0) -> None:
    assert callable(condition)
    until = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < until, "timed out waiting"
        time.sleep(0.05)


def start_download(session: DockerSession, server: SlowServer) -> tuple[threading.Thread, list[ExecResult]]:
    results: list[ExecResult] = []
    code = f"URL = 'http://allowed.test:{server.port}/slow'\n{DOWNLOAD}"
    thread = threading.Thread(target=lambda: results.append(python(session, code)), daemon=True)
    thread.start()
    wait_for(lambda: server.sent > 8 * 1024 and session.open_connections())
    return thread, results


def test_set_network_cuts_a_live_download_and_switches_back(slow: SlowServer, runtime: str | None) -> None:
    other = Upstream()
    policy = allowing(slow)
    backend = DockerBackend(network=policy, runtime=runtime)
    try:
        with backend.session() as session:
            thread, results = start_download(session, slow)
            assert session.open_connections() == [("allowed.test", slow.port)]

            # A new policy that still allows the download keeps it open...
            wider = NetworkPolicy(allow=[*policy.allow, f"allowed.test:{other.port}"], hosts=policy.hosts)
            session.set_network(wider)
            time.sleep(0.3)
            assert thread.is_alive() and session.open_connections()
            assert session.capabilities().network_policy == wider

            # ...one that does not allow it any more closes it, and so does turning the network off.
            started = time.monotonic()
            session.set_network(False)
            thread.join(timeout=15)
            assert not thread.is_alive() and time.monotonic() - started < 10
            assert results[0].stdout.startswith("DROPPED "), results[0]
            assert int(results[0].stdout.split()[1]) < BODY_SIZE
            wait_for(slow.cut.is_set)  # the server saw it go too
            assert session.open_connections() == []
            assert session.network is False and session.capabilities().network_policy is None

            # Off: a new request gets a 403 that says why, and nothing reaches the server.
            served = len(other.received)
            refused = python(session, f"URL = 'http://allowed.test:{other.port}/'\n{FETCH}")
            assert refused.stdout.startswith("403 ") and "network off" in refused.stdout, refused
            assert len(other.received) == served

            # Back on, with a policy that allows it again.
            session.set_network(wider)
            again = python(session, f"URL = 'http://allowed.test:{other.port}/again'\n{FETCH}")
            assert again.stdout.startswith("200 "), again
            log = session.network_log()
            rules = [entry.rule for entry in log.entries]
            assert "network off" in rules
            cut = [entry for entry in log.entries if entry.port == slow.port]
            assert len(cut) == 1 and "closed: the sandbox's network was turned off" in cut[0].detail
    finally:
        backend.close()
        other.close()


def test_a_new_policy_closes_what_it_no_longer_allows(slow: SlowServer) -> None:
    upstream = Upstream()
    backend = DockerBackend(network=False)
    try:
        with backend.session() as session:
            assert session.network is not True and session.capabilities().network_policy is None
            # None to a policy at run time: the agent starts serving the proxy.
            session.set_network(allowing(slow))
            thread, results = start_download(session, slow)
            session.set_network(allowing(upstream))
            thread.join(timeout=15)
            assert results and results[0].stdout.startswith("DROPPED "), results
            fetched = python(session, f"URL = 'http://allowed.test:{upstream.port}/'\n{FETCH}")
            assert fetched.stdout.startswith("200 "), fetched
            # The bridge cannot be given to a container started with network none.
            with pytest.raises(PolicyNotEnforceableError, match="network none"):
                session.set_network(True)
            assert session.network == allowing(upstream)
    finally:
        backend.close()
        upstream.close()


def test_the_warm_pool_serves_sessions_under_the_policy() -> None:
    upstream = Upstream()
    policy = allowing(upstream)
    backend = DockerBackend(network=policy, pool=PoolConfig(size=1))
    try:
        assert backend.pool is not None and backend.pool.key.egress == policy
        assert backend.pool.wait_ready(60)
        with backend.session() as session:
            assert backend.pool.stats().served == 1  # it came from the pool
            fetched = python(session, f"URL = 'http://allowed.test:{upstream.port}/pooled'\n{FETCH}")
            assert fetched.stdout.startswith("200 "), fetched
            assert upstream.received[0].startswith(b"GET /pooled ")
            assert session.capabilities().network_policy == policy
            session.set_network(False)
            off = python(session, f"URL = 'http://allowed.test:{upstream.port}/'\n{FETCH}")
            assert off.stdout.startswith("403 "), off
    finally:
        backend.close()
        upstream.close()
