"""``session.pause(keep_memory=True)`` / ``resume()`` on Docker, runc and gVisor (issue 36's first step).

A background program holds a random token in its memory only (made inside, never written anywhere) and
answers it on a Unix socket; beside it a counter ticks every 50 ms. The checks, from the host:

* while paused nothing runs: the counter moves by less than a tenth of what it would have in that time
  (a pause that only marked the session, a naive design, fails it), and the engine says the container
  is paused;
* after resume the same program answers the same token (its memory and its place kept), and the
  counter runs again;
* any call on the paused session (a command, a file operation) resumes it first;
* a command that runs when ``pause`` is asked is waited for, or the pause is refused with nothing paused;
* ``pause()`` without ``keep_memory`` (a checkpoint to disk, not built yet) is refused, nothing paused.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import docker
import pytest

from adk_sandbox.executor import ExecRequest, InvalidRequestError, IsolationClass, PolicyNotEnforceableError
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from adk_sandbox.executor.backends.docker._reaper import reap_leaked
from tests.conftest import require

pytestmark = pytest.mark.docker

#: A program that holds a random token in its memory only and answers it on a Unix socket.
QUIET_KEEPER = r"""
import os, socket
token = os.urandom(16).hex()
server = socket.socket(socket.AF_UNIX)
server.bind("/tmp/keeper.sock")
server.listen(4)
while True:
    conn, _ = server.accept()
    conn.sendall(token.encode())
    conn.close()
"""
#: The same, with a counter beside it that ticks every 50 ms into /tmp/ticks (renamed into place: a reader
#: never sees it empty).
KEEPER = QUIET_KEEPER.replace(
    "server = socket",
    "import threading, time\n"
    "def tick():\n"
    "    n = 0\n"
    "    while True:\n"
    "        n += 1\n"
    "        with open('/tmp/ticks.new', 'w') as f:\n"
    "            f.write(str(n))\n"
    "        os.replace('/tmp/ticks.new', '/tmp/ticks')\n"
    "        time.sleep(0.05)\n"
    "threading.Thread(target=tick, daemon=True).start()\n"
    "server = socket",
    1,
)
ASK = (
    "import socket; s = socket.socket(socket.AF_UNIX); s.connect('/tmp/keeper.sock'); "
    "print(s.recv(64).decode())"
)


def out(session: DockerSession, script: str) -> str:
    result = session.execute(ExecRequest(argv=("sh", "-c", script), timeout=60))
    assert result.exit_code == 0, result.stderr
    return result.stdout.strip()


def token(session: DockerSession) -> str:
    result = session.execute(ExecRequest(argv=("python3", "-c", ASK), timeout=60))
    assert result.exit_code == 0, result.stderr
    return result.stdout.strip()


@pytest.fixture(scope="module", params=["runc", "runsc"])
def session(request: pytest.FixtureRequest) -> Iterator[DockerSession]:
    runtime = None if request.param == "runc" else request.param
    if runtime is not None:
        client = docker.from_env()
        try:
            require(
                runtime in (client.info().get("Runtimes") or {}),
                f"{runtime} is not registered (scripts/setup)",
            )
        finally:
            client.close()
    with DockerBackend(runtime=runtime) as backend, backend.session() as made:
        start_keeper(made)
        yield made


def start_keeper(session: DockerSession, program: str = KEEPER) -> None:
    """Start ``program`` (the keeper of a token) in the background and wait until it listens."""
    started = session.execute(
        ExecRequest(
            argv=("sh", "-c", 'python3 -c "$KEEPER" >/dev/null 2>&1 &'),
            env={"KEEPER": program},
            timeout=60,
            background=True,
        )
    )
    assert started.exit_code == 0, started
    deadline = time.monotonic() + 30
    while out(session, "test -S /tmp/keeper.sock && echo up || true") != "up":
        assert time.monotonic() < deadline, "the keeper never listened"
        time.sleep(0.1)


def _paused_says_the_engine(session: DockerSession) -> bool:
    client = docker.from_env()
    try:
        return bool(client.api.inspect_container(session.container_id)["State"]["Paused"])
    finally:
        client.close()


def test_a_program_keeps_its_memory_and_stops_while_paused(session: DockerSession) -> None:
    kept = token(session)
    assert len(kept) == 32
    before = int(out(session, "cat /tmp/ticks"))
    session.pause(keep_memory=True)
    assert session.paused
    assert _paused_says_the_engine(session)
    time.sleep(2.0)  # 40 ticks if it ran
    session.resume()
    assert not session.paused
    assert not _paused_says_the_engine(session)
    during = int(out(session, "cat /tmp/ticks")) - before
    assert during < 8, f"the counter moved {during} ticks while the session was paused"
    assert token(session) == kept  # the same program, its memory kept
    time.sleep(0.5)
    assert int(out(session, "cat /tmp/ticks")) > before + during  # and it runs again


def test_any_call_resumes_a_paused_session(session: DockerSession) -> None:
    session.pause(keep_memory=True)
    session.pause(keep_memory=True)  # idempotent
    assert out(session, "echo ran") == "ran"
    assert not session.paused
    session.pause(keep_memory=True)
    assert session.files.stat("/tmp/ticks") is not None
    assert not session.paused and not _paused_says_the_engine(session)


def test_a_running_command_is_waited_for_or_the_pause_refused(session: DockerSession) -> None:
    results = []
    runner = threading.Thread(
        target=lambda: results.append(out(session, "sleep 1.5; echo finished")), daemon=True
    )
    runner.start()
    time.sleep(0.5)
    with pytest.raises(InvalidRequestError, match="still ran after"):
        session.pause(keep_memory=True, wait_seconds=0.2)
    assert not session.paused and not _paused_says_the_engine(session)
    session.pause(keep_memory=True, wait_seconds=30)  # waits for it, then pauses
    assert session.paused
    runner.join(30)
    assert results == ["finished"]
    session.resume()


def test_a_checkpoint_to_disk_is_refused_not_weakened(session: DockerSession) -> None:
    with pytest.raises(PolicyNotEnforceableError, match="keep_memory=True"):
        session.pause()
    assert not session.paused and not _paused_says_the_engine(session)
    assert out(session, "echo still-running") == "still-running"


LEAK = """
import os, signal, sys
from adk_sandbox.executor import ExecRequest
from adk_sandbox.executor.backends.docker import DockerBackend
session = DockerBackend(runtime=sys.argv[1] or None).session()
session.execute(ExecRequest(argv=("true",), timeout=30))
session.pause(keep_memory=True)
print(session.container_id, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_paused_session_whose_owner_died_is_reaped(session: DockerSession) -> None:
    """The owner is SIGKILLed while its session is paused: the next backend's reaper still removes it.

    A frozen gVisor container refuses to be killed ("PID ... is zombie and can not be killed"): the
    reaper unpauses it first. Without that, the reaper's error stopped the next DockerBackend from being
    made at all (checked on the code before it).
    """
    runtime = "runsc" if session.isolation() is IsolationClass.GVISOR else ""
    done = subprocess.run(
        [sys.executable, "-c", LEAK, runtime], capture_output=True, text=True, timeout=120, check=False
    )
    container = done.stdout.strip().splitlines()[-1]
    client = docker.from_env()
    try:
        assert client.api.inspect_container(container)["State"]["Paused"]
        reaped = reap_leaked(client)
        assert container in [leaked.id for leaked in reaped]
        with pytest.raises(docker.errors.NotFound):
            client.api.inspect_container(container)
    finally:
        client.close()
