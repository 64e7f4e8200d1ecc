"""Background processes of a call (``ExecRequest(background=True)``), and the commands' ``oom_score_adj``.

Real engine, runc unless said. Without the flag nothing outlives its
command (test_docker_tree_kill.py holds the whole attack matrix; one contrast case here). With it what the
command leaves survives its normal exit, is usable by the next command, and dies with the session; a
timed-out or cancelled background command dies with its tree; a neighbour's timeout leaves a kept group
alone; the number of kept groups is bounded. Survivors are ``sleep``s of a duration nobody else uses,
looked up in the container's process list by an exec as root outside the session.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import docker.errors
import pytest

from adk_sandbox.executor import MAX_BACKGROUND_GROUPS, ExecRequest, ExecResult, InvalidRequestError, Language
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from adk_sandbox.executor.channel.agent_transport import AgentTransport
from tests.conftest import require, unique_sleep_seconds

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]

#: Generous "does not hang" bound for a command that should come back at once.
QUICK = 30.0

#: A server on a unix socket in /tmp: answers each connection with "pong <what it read>".
SERVER = (
    "import os, socket\n"
    "s = socket.socket(socket.AF_UNIX)\n"
    "s.bind('/tmp/bg.sock')\n"
    "s.listen(4)\n"
    "while True:\n"
    "    c, _ = s.accept()\n"
    "    c.sendall(b'pong ' + c.recv(100))\n"
    "    c.close()\n"
)
CLIENT = (
    "import socket; s = socket.socket(socket.AF_UNIX); s.connect('/tmp/bg.sock'); s.sendall(b'hi'); "
    "print(s.recv(100).decode())"
)


def open_session(backend: DockerBackend, workspace: Path) -> DockerSession:
    session = backend.session(workspace=workspace)
    session.start()
    session.execute(ExecRequest(language=Language.COMMAND, code="true", timeout=20))
    transport = session._transport
    assert isinstance(transport, AgentTransport) and transport.agent_pid is not None
    return session


@pytest.fixture
def session(docker_backend: DockerBackend, owned_workspace: Path) -> Iterator[DockerSession]:
    with open_session(docker_backend, owned_workspace) as opened:
        yield opened


def run(session: DockerSession, code: str, timeout: float = 20, **fields: object) -> ExecResult:
    return session.execute(ExecRequest(language=Language.COMMAND, code=code, timeout=timeout, **fields))  # type: ignore[arg-type]


def container_processes(backend: DockerBackend, container_id: str) -> list[str]:
    """Every process's argv in the container, read by an exec as root outside the session."""
    made = backend._client.api.exec_create(container_id, ["ps", "-eo", "args="], user="0:0")
    return backend._client.api.exec_start(made["Id"]).decode().splitlines()


def alive(backend: DockerBackend, session: DockerSession, *needles: str) -> list[str]:
    return [
        line for line in container_processes(backend, session.container_id) if any(n in line for n in needles)
    ]


def agent_processes(backend: DockerBackend, session: DockerSession) -> int:
    """Processes running the agent's program: the agent, its live shims and the keepers of kept groups."""
    return len(alive(backend, session, "adk-sandbox-agent"))


def wait_until(check: object, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


# -- without the flag: nothing outlives its command (the contrast) ---------------------------------------
def test_without_background_what_a_command_leaves_dies_at_its_exit(
    docker_backend: DockerBackend, session: DockerSession
) -> None:
    first, second = unique_sleep_seconds(), unique_sleep_seconds()
    result = run(session, f"sleep {first} & setsid sleep {second} & echo started")
    assert result.stdout == "started\n"
    assert alive(docker_backend, session, f"sleep {first}", f"sleep {second}") == []


# -- with it: kept, usable, bounded, and dead at the session's end ---------------------------------------
def test_a_background_server_survives_its_command_and_serves_the_next(
    docker_backend: DockerBackend, session: DockerSession
) -> None:
    mark, holder = unique_sleep_seconds(), unique_sleep_seconds()
    session.files.write_bytes("/tmp/server.py", SERVER.encode())
    started = time.monotonic()
    # `sleep {holder} &` keeps the command's stdout open: the call must still return at the command's exit.
    result = run(
        session,
        f"setsid sleep {mark} & sleep {holder} & setsid python3 /tmp/server.py >/dev/null 2>&1 & "
        "while [ ! -S /tmp/bg.sock ]; do sleep 0.05; done; echo up",
        background=True,
    )
    assert time.monotonic() - started < 10
    assert (result.stdout, result.exit_code, result.timed_out) == ("up\n", 0, False)
    assert len(alive(docker_backend, session, f"sleep {mark}")) == 1
    assert len(alive(docker_backend, session, f"sleep {holder}")) == 1
    assert run(session, f'python3 -c "{CLIENT}"').stdout == "pong hi\n"
    # An ordinary command's exit (a sweep for strays) leaves the kept group alone.
    assert run(session, f'python3 -c "{CLIENT}"').stdout == "pong hi\n"
    assert len(alive(docker_backend, session, f"sleep {mark}")) == 1


def test_kept_groups_die_with_the_session(docker_backend: DockerBackend, owned_workspace: Path) -> None:
    mark = unique_sleep_seconds()
    session = open_session(docker_backend, owned_workspace)
    container = session.container_id
    try:
        assert run(session, f"setsid sleep {mark} & echo ok", background=True).stdout == "ok\n"
        assert len(alive(docker_backend, session, f"sleep {mark}")) == 1
    finally:
        session.close()
    with pytest.raises(docker.errors.NotFound):
        docker_backend._client.containers.get(container)


def test_a_killed_group_frees_its_place_and_leaves_nothing(
    docker_backend: DockerBackend, session: DockerSession
) -> None:
    marks = [unique_sleep_seconds() for _ in range(MAX_BACKGROUND_GROUPS)]
    assert agent_processes(docker_backend, session) == 1  # the agent alone between commands
    for mark in marks:
        assert run(session, f"setsid sleep {mark} & echo $!", background=True).exit_code == 0
    assert agent_processes(docker_backend, session) == 1 + MAX_BACKGROUND_GROUPS  # one keeper a group
    extra = unique_sleep_seconds()
    with pytest.raises(InvalidRequestError, match="at most 16 background"):
        run(session, f"setsid sleep {extra} &", background=True)
    assert alive(docker_backend, session, f"sleep {extra}") == []  # nothing of it ran
    # Without the flag a command still runs at the limit.
    assert run(session, "echo fine").stdout == "fine\n"
    # A command kills one group's processes: its keeper goes, and its place is free again.
    listing = run(session, f"pkill -xf 'sleep {marks[0]}'; sleep 0.5; ps -eo args=")
    assert f"sleep {marks[0]}" not in listing.stdout.splitlines()
    assert wait_until(lambda: agent_processes(docker_backend, session) == MAX_BACKGROUND_GROUPS)
    assert run(session, f"setsid sleep {extra} & echo again", background=True).stdout == "again\n"
    assert len(alive(docker_backend, session, f"sleep {extra}")) == 1


def test_a_timed_out_background_command_dies_with_its_tree(
    docker_backend: DockerBackend, session: DockerSession
) -> None:
    mark = unique_sleep_seconds()
    started = time.monotonic()
    result = run(session, f"setsid sleep {mark} & sleep 300", timeout=2, background=True)
    assert result.timed_out and result.exit_code is None
    assert time.monotonic() - started < 2 + QUICK
    assert alive(docker_backend, session, f"sleep {mark}") == []
    assert agent_processes(docker_backend, session) == 1  # no keeper left either


def test_a_cancelled_background_command_dies_with_its_tree(
    docker_backend: DockerBackend, session: DockerSession
) -> None:
    mark = unique_sleep_seconds()
    cancel = threading.Event()
    threading.Timer(1.0, cancel.set).start()
    result = session.execute(
        ExecRequest(
            language=Language.COMMAND, code=f"setsid sleep {mark} & sleep 300", timeout=60, background=True
        ),
        cancel=cancel,
    )
    assert result.cancelled
    assert alive(docker_backend, session, f"sleep {mark}") == []


def test_a_neighbours_timeout_leaves_a_kept_group_alone(
    docker_backend: DockerBackend, session: DockerSession
) -> None:
    kept, doomed = unique_sleep_seconds(), unique_sleep_seconds()
    assert run(session, f"setsid sleep {kept} & echo kept", background=True).stdout == "kept\n"
    result = run(session, f"setsid sleep {doomed} & sleep 300", timeout=2)
    assert result.timed_out
    assert alive(docker_backend, session, f"sleep {doomed}") == []
    assert len(alive(docker_backend, session, f"sleep {kept}")) == 1
    # Another background command timing out does not touch it either.
    assert run(session, f"setsid sleep {doomed} & sleep 300", timeout=2, background=True).timed_out
    assert len(alive(docker_backend, session, f"sleep {kept}")) == 1


def test_background_under_gvisor(owned_workspace: Path) -> None:
    backend = DockerBackend(runtime="runsc")
    require("runsc" in (backend._client.info().get("Runtimes") or {}), "gVisor's runsc is not registered")
    mark, doomed = unique_sleep_seconds(), unique_sleep_seconds()
    try:
        session = open_session(backend, owned_workspace)
        container = session.container_id
        try:
            assert run(session, f"setsid sleep {mark} & echo ok", background=True).stdout == "ok\n"
            run(session, "true")  # a command's end sweeps orphans (without subreapers): the kept group stays
            assert len(alive(backend, session, f"sleep {mark}")) == 1
            result = run(session, f"setsid sleep {doomed} & sleep 300", timeout=2, background=True)
            assert result.timed_out
            assert alive(backend, session, f"sleep {doomed}") == []
        finally:
            session.close()
        with pytest.raises(docker.errors.NotFound):
            backend._client.containers.get(container)
    finally:
        backend.close()


# -- oom_score_adj: commands before the agent, the agent and the shim still non-dumpable ----------------
def test_commands_get_oom_score_adj_500_and_shim_and_agent_stay_non_dumpable(
    docker_backend: DockerBackend, workspace_of_either_owner: Path
) -> None:
    with open_session(docker_backend, workspace_of_either_owner) as session:
        transport = session._transport
        assert isinstance(transport, AgentTransport)
        agent = transport._last.hello["pid"]  # type: ignore[union-attr]
        result = run(
            session,
            "cat /proc/self/oom_score_adj; sh -c 'cat /proc/self/oom_score_adj'; "
            f"cat /proc/{agent}/oom_score_adj; "
            # The shim ($PPID of sh) and the agent: their descriptors and environment stay out of reach.
            "readlink /proc/$PPID/fd/0 >/dev/null 2>&1 && echo shim-fd; "
            "cat /proc/$PPID/environ >/dev/null 2>&1 && echo shim-env; "
            f"readlink /proc/{agent}/fd/0 >/dev/null 2>&1 && echo agent-fd; "
            f"cat /proc/{agent}/environ >/dev/null 2>&1 && echo agent-env; echo done",
        )
        assert result.stdout == "500\n500\n0\ndone\n", result.stderr
