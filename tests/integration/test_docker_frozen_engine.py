"""A Docker engine that stops answering cannot hold a command for minutes (issue 10, item 3).

The shared engine is never stopped: the backend under test talks to it through a small Unix-socket
proxy (``DOCKER_HOST=unix://.../proxy.sock``) that the test "freezes" — it stops relaying bytes in both
directions and keeps every connection open, as a SIGSTOPped daemon would.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from adk_sandbox.executor import ExecRequest, ExecResult, Language, SandboxFailedError
from adk_sandbox.executor.backends.docker import DockerBackend
from adk_sandbox.executor.backends.docker._daemon import DEFAULT_SOCKET
from tests.conftest import project_containers, unique_sleep_seconds

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]

#: The caller must get an answer within the command's timeout plus this (issue 10).
BOUND = 10.0


class FreezableProxy:
    """Relays a Unix socket to the Docker socket; :meth:`freeze` stops relaying without closing."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(64)
        self._listener.setblocking(False)
        self._relaying = threading.Event()
        self._relaying.set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def freeze(self) -> None:
        self._relaying.clear()

    def unfreeze(self) -> None:
        self._relaying.set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()

    def _serve(self) -> None:
        peers: dict[socket.socket, socket.socket] = {}
        ended: set[socket.socket] = set()
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            while not self._stop.is_set():
                if not self._relaying.is_set():
                    time.sleep(0.01)  # frozen: nothing is accepted, read or written
                    continue
                for key, _ in selector.select(0.05):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if sock is self._listener:
                        with contextlib.suppress(BlockingIOError):
                            client, _ = self._listener.accept()
                            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                            upstream.connect(DEFAULT_SOCKET)
                            peers[client], peers[upstream] = upstream, client
                            selector.register(client, selectors.EVENT_READ)
                            selector.register(upstream, selectors.EVENT_READ)
                        continue
                    other = peers.get(sock)
                    if other is None:
                        continue
                    try:
                        data = sock.recv(65536)
                    except OSError:
                        data = b""
                    if data:
                        with contextlib.suppress(OSError):
                            other.sendall(data)
                        continue
                    # One side closed: pass the half-close on (stdin's end), close when both are done.
                    selector.unregister(sock)
                    ended.add(sock)
                    with contextlib.suppress(OSError):
                        other.shutdown(socket.SHUT_WR)
                    if other in ended:
                        for done in (sock, other):
                            peers.pop(done, None)
                            ended.discard(done)
                            done.close()
            for sock in peers:
                with contextlib.suppress(OSError):
                    sock.close()


@pytest.fixture
def proxy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FreezableProxy]:
    path = str(tmp_path / "proxy.sock")
    relay = FreezableProxy(path)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
    try:
        yield relay
    finally:
        relay.unfreeze()
        relay.close()


def _execute_in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    outcome: list[object] = []

    def target() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize("owner", [1000, 0])
def test_an_engine_frozen_during_a_command_does_not_block_the_caller(
    proxy: FreezableProxy,
    docker_backend: DockerBackend,
    tmp_path_factory: pytest.TempPathFactory,
    owner: int,
) -> None:
    workspace = tmp_path_factory.mktemp("ws")
    os.chown(workspace, owner, owner)
    mark = unique_sleep_seconds()
    backend = DockerBackend()  # through the proxy
    session = backend.session(workspace=workspace)
    container_id = session.container_id
    request = ExecRequest(language=Language.COMMAND, code=f"echo start; sleep {mark}", timeout=5)
    freezer = threading.Timer(1.5, proxy.freeze)
    started = time.monotonic()
    freezer.start()
    thread, outcome = _execute_in_thread(lambda: session.execute(request))
    thread.join(request.timeout + BOUND)
    elapsed = time.monotonic() - started
    proxy.unfreeze()
    try:
        assert not thread.is_alive(), f"the command still blocks {elapsed:.0f} s in"
        result = outcome[0]
        if isinstance(result, ExecResult):
            assert result.timed_out
            assert result.stdout == "start\n"
        else:
            assert isinstance(result, SandboxFailedError), result
        # The container killed the command by itself, with no help from the frozen engine.
        time.sleep(2)
        listing = docker_backend._client.containers.get(container_id).exec_run(["ps", "-eo", "args="])
        assert mark not in listing.output.decode()
        # Once the engine answers again, the session carries on.
        after = session.execute(ExecRequest(language=Language.COMMAND, code="echo again", timeout=20))
        assert after.stdout == "again\n"
    finally:
        thread.join(60)
        session.close()
        backend.close()
    assert container_id not in project_containers(docker_backend._client)


def test_an_engine_frozen_before_a_command_starts_gives_a_clear_error(
    proxy: FreezableProxy, docker_backend: DockerBackend, owned_workspace: Path
) -> None:
    backend = DockerBackend()
    session = backend.session(workspace=owned_workspace)
    container_id = session.container_id
    session.execute(ExecRequest(language=Language.COMMAND, code="true", timeout=20))  # surveyed already
    request = ExecRequest(language=Language.COMMAND, code="echo never", timeout=3)
    proxy.freeze()
    thread, outcome = _execute_in_thread(lambda: session.execute(request))
    thread.join(request.timeout + BOUND)
    proxy.unfreeze()
    try:
        assert not thread.is_alive(), "the command still blocks on the frozen engine"
        assert isinstance(outcome[0], SandboxFailedError), outcome[0]
        assert "did not answer" in str(outcome[0])
    finally:
        thread.join(60)
        session.close()
        backend.close()
    assert container_id not in project_containers(docker_backend._client)
