"""``adk-sandbox attach``'s server (executor/attach.py), attacked from this host: who may connect, and what.

The server gives a terminal in a sandbox to whoever connects, so only this user's own processes may:
the socket's directory must be this user's alone (one open to others is refused, not used), and a peer of
another uid is dropped even when it reaches the socket (the test opens the directory and the socket to
everyone to get that far: a naive design that trusts the file's mode alone gives that peer a shell).
A client that sends garbage or leaves mid-way costs nothing: its terminal and program are gone, the
session serves on.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from adk_sandbox.executor import ExecRequest
from adk_sandbox.executor.attach import AttachServer, RemoteTerminal, socket_directory
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from adk_sandbox.executor.errors import PolicyNotEnforceableError
from tests.integration.test_terminals import count_inside

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]


@pytest.fixture
def runtime_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A runtime directory another uid can pass through (pytest's own tmp_path is closed to others)."""
    made = Path(tempfile.mkdtemp(prefix="adk-attach-"))
    os.chmod(made, 0o711)  # noqa: S103 - passable by others, on purpose
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(made))
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.fixture(scope="module")
def backend() -> Iterator[DockerBackend]:
    with DockerBackend() as made:
        yield made


@pytest.fixture
def served(backend: DockerBackend, runtime_dir: Path) -> Iterator[tuple[DockerSession, AttachServer]]:
    with backend.session() as session:
        server = AttachServer(session)
        try:
            yield session, server
        finally:
            server.close()


def test_a_directory_others_could_enter_is_refused(runtime_dir: Path) -> None:
    (runtime_dir / "adk-sandbox").mkdir(mode=0o700)
    os.chmod(runtime_dir / "adk-sandbox", 0o777)  # noqa: S103 - the attack
    with pytest.raises(PolicyNotEnforceableError, match="not a directory of this user's alone"):
        socket_directory()


def test_the_socket_is_this_users_alone(served: tuple[DockerSession, AttachServer]) -> None:
    _, server = served
    assert stat.S_IMODE(server.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(server.path.parent.stat().st_mode) == 0o700


def test_a_peer_of_another_uid_gets_nothing(served: tuple[DockerSession, AttachServer]) -> None:
    """Directory and socket opened to all by hand: a peer of uid 65534 still gets no HELLO, no terminal."""
    if os.getuid() != 0:
        pytest.skip("needs root to connect as another uid")
    session, server = served
    os.chmod(server.path.parent, 0o755)  # noqa: S103 - the attack: opened to all
    os.chmod(server.path, 0o666)  # noqa: S103 - the attack
    probe = (
        "import os, socket, sys\nos.setgid(65534); os.setuid(65534)\n"
        "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.settimeout(10)\n"
        "try:\n    s.sendall(bytes.fromhex(sys.argv[2])); print(len(s.recv(4096)))\n"
        # Closed at once: the peer's send may find the connection reset or already shut (EPIPE).
        "except (ConnectionResetError, BrokenPipeError):\n    print(0)\n"
    )
    from adk_sandbox.executor.channel.frames import FrameType, encode  # noqa: PLC0415

    run = encode(FrameType.RUN, 1, {"argv": ["sleep", "971"], "env": {}, "pty": True, "rows": 5, "cols": 5})
    done = subprocess.run([sys.executable, "-c", probe, str(server.path), run.hex()],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.stdout.strip() == "0", done  # closed at once: not even the HELLO
    time.sleep(0.5)
    assert count_inside(session, "sleep 971") == 0


def test_garbage_and_a_client_that_leaves_cost_nothing(served: tuple[DockerSession, AttachServer]) -> None:
    session, server = served
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(str(server.path))
        client.sendall(b"\xff" * 64 + b"GET / HTTP/1.1\r\n\r\n")
        client.settimeout(10)
        data = b""
        while chunk := client.recv(4096):
            data += chunk
        assert data.startswith(b"\x01")  # the HELLO, then closed
    remote = RemoteTerminal(session.session_id, ["sleep", "972"])
    deadline = time.monotonic() + 30
    while count_inside(session, "sleep 972") != 1:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    remote._sock.close()  # leaves without a word
    deadline = time.monotonic() + 30
    while count_inside(session, "sleep 972") != 0:
        assert time.monotonic() < deadline, "the program outlived its client"
        time.sleep(0.2)
    assert session.execute(ExecRequest(argv=("echo", "serving"), timeout=30)).stdout == "serving\n"
    with RemoteTerminal(session.session_id, ["sh", "-c", "echo through-attach"]) as again:
        seen = b""
        while piece := again.read(timeout=30):
            seen += piece
        assert b"through-attach" in seen and again.exit_code == 0


def test_closing_the_server_removes_the_socket(served: tuple[DockerSession, AttachServer]) -> None:
    _, server = served
    server.close()
    assert not server.path.exists()
    with pytest.raises(Exception, match="no session"):
        RemoteTerminal(served[0].session_id)
