"""The agent channel (issue 11, step 1): one long-lived in-sandbox agent per session runs every command.

Real engine. Survivors are ``sleep`` processes of durations nobody else uses, looked up through a separate
exec as root, outside the session. Bounds are generous "does not hang" limits, not timings.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adk_sandbox.executor import ExecRequest, ExecResult, InvalidRequestError, Language, SandboxFailedError
from adk_sandbox.executor._output import OutputCapture
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from adk_sandbox.executor.backends.docker._daemon import daemon_socket_path
from adk_sandbox.executor.backends.docker._exec import DockerExecs
from adk_sandbox.executor.channel.agent_transport import AgentTransport
from adk_sandbox.executor.channel.files import SandboxFiles
from adk_sandbox.executor.channel.frames import FILE_OPS, FrameType, encode
from adk_sandbox.executor.channel.static_agent import AgentLaunch
from adk_sandbox.executor.channel.streams import AgentStreamOpener
from adk_sandbox.executor.channel.transport import PreparedCommand
from tests.conftest import project_containers, unique_sleep_seconds

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]

#: Generous "does not hang" bound.
QUICK = 30.0


@pytest.fixture
def workspace(workspace_of_either_owner: Path) -> Path:
    """Owned by uid 1000 or by root (tests/conftest.py): every test here runs both ways."""
    return workspace_of_either_owner


@pytest.fixture
def session(docker_backend: DockerBackend, workspace: Path) -> Iterator[DockerSession]:
    with docker_backend.session(workspace=workspace) as opened:
        yield opened


def run(session: DockerSession, code: str, timeout: float = 20, **kwargs: object) -> ExecResult:
    request = ExecRequest(language=Language.COMMAND, code=code, timeout=timeout, env=kwargs.pop("env", {}))  # type: ignore[arg-type]
    return session.execute(request, **kwargs)  # type: ignore[arg-type]


def alive(docker_backend: DockerBackend, session: DockerSession, *needles: str) -> list[str]:
    result = docker_backend._client.api.exec_create(session.container_id, ["ps", "-eo", "args="], user="0:0")
    lines = docker_backend._client.api.exec_start(result["Id"]).decode().splitlines()
    return [line for line in lines if any(n in line for n in needles)]


def agent_pid(session: DockerSession) -> int:
    transport = session._transport
    assert isinstance(transport, AgentTransport)
    pid = transport.agent_pid
    assert pid is not None
    return pid


def test_the_agent_is_the_channel(docker_backend: DockerBackend, owned_workspace: Path) -> None:
    with docker_backend.session(workspace=owned_workspace) as session:
        assert session.channel == "agent"
        assert run(session, "echo $A; cat", env={"A": "b"}, timeout=20).stdout == "b\n"
        assert isinstance(session._transport, AgentTransport)


def test_env_travels_in_the_frame_not_on_an_argv(
    docker_backend: DockerBackend, owned_workspace: Path
) -> None:
    secret = "s3cr3t-" + unique_sleep_seconds()
    with docker_backend.session(workspace=owned_workspace) as session:
        result = run(session, 'sleep 2 & ps -eo args=; echo "$TOKEN"', env={"TOKEN": secret})
        lines = result.stdout.splitlines()
        assert lines[-1] == secret
        assert not any(secret in line for line in lines[:-1])


def escapees_script(marks: list[str]) -> str:
    """The escapee matrix of issue 11: each background process hides from one way of finding it."""
    return (
        "bash -c '"
        f"sleep {marks[0]} & "  # cmd &
        f"setsid sleep {marks[1]} & "
        f"nohup sleep {marks[2]} >/dev/null 2>&1 & "
        f"( sleep {marks[3]} & ) & "
        f"sleep {marks[4]} & disown; "
        f"env -i sleep {marks[5]} & "
        f"setsid env -i sleep {marks[6]} & "
        'python3 -c "import ctypes, time; ctypes.CDLL(None).prctl(4, 0); '
        f'time.sleep({marks[7]})" & '
        "sleep 0.5; echo started'"
    )


@pytest.mark.parametrize("ending", ["exit", "timeout", "cancel"])
def test_the_escapee_matrix_dies_and_a_neighbour_finishes_intact(
    docker_backend: DockerBackend, session: DockerSession, ending: str
) -> None:
    marks = [unique_sleep_seconds() for _ in range(8)]
    neighbour: list[ExecResult] = []
    # The neighbour has an orphan of its own (setsid, parent gone) that must survive the other's kill.
    neighbour_code = "sh -c 'setsid sh -c \"sleep 4; echo orphan\" &'; sleep 6; echo N"
    thread = threading.Thread(target=lambda: neighbour.append(run(session, neighbour_code, timeout=60)))
    thread.start()
    time.sleep(0.5)
    cancel = threading.Event()
    code = escapees_script(marks)
    if ending == "exit":
        result = run(session, code)
        assert result.exit_code == 0
    elif ending == "timeout":
        result = run(session, code + "; sleep 60", timeout=2.5)
        assert result.timed_out
    else:
        timer = threading.Timer(2.0, cancel.set)
        timer.start()
        result = run(session, code + "; sleep 60", timeout=60, cancel=cancel)
        timer.join()
        assert result.cancelled
    assert result.stdout == "started\n"
    assert alive(docker_backend, session, *marks) == []
    thread.join(QUICK)
    assert (neighbour[0].exit_code, neighbour[0].stdout) == (0, "orphan\nN\n")
    assert alive(docker_backend, session, *marks) == []


def test_killing_the_agent_mid_command_is_a_clear_error_and_the_next_command_works(
    docker_backend: DockerBackend, session: DockerSession
) -> None:
    mark = unique_sleep_seconds()
    run(session, "true")
    pid = agent_pid(session)
    started = time.monotonic()
    with pytest.raises(SandboxFailedError, match="agent"):
        run(session, f"setsid sleep {mark} & echo go; kill -9 {pid}; sleep {mark}", timeout=60)
    assert time.monotonic() - started < QUICK
    assert run(session, "echo again").stdout == "again\n"
    assert session.restarts == 1
    assert agent_pid(session) != pid
    assert alive(docker_backend, session, mark) == []


def test_a_command_cannot_reach_the_agents_descriptors(
    docker_backend: DockerBackend, session: DockerSession
) -> None:
    run(session, "true")
    pid = agent_pid(session)
    started = time.monotonic()
    try:
        result = run(
            session,
            f"head -c 100000 /dev/urandom > /proc/{pid}/fd/1 && echo wrote; "
            f"cat /proc/{pid}/environ >/dev/null && echo read; echo done",
        )
    except SandboxFailedError:
        result = None  # reachable after all: the host must have given up cleanly
    assert time.monotonic() - started < QUICK
    assert result is not None, "a command could write into the agent's stream"
    assert result.stdout == "done\n"
    assert run(session, "echo still").stdout == "still\n"


def test_a_stopped_agent_cannot_hold_a_command(docker_backend: DockerBackend, session: DockerSession) -> None:
    mark = unique_sleep_seconds()
    run(session, "true")
    pid = agent_pid(session)
    started = time.monotonic()
    with pytest.raises(SandboxFailedError, match="did not answer"):
        run(session, f"kill -STOP {pid}; sleep {mark}", timeout=3)
    assert time.monotonic() - started < 3 + QUICK
    assert run(session, "echo again").stdout == "again\n"
    assert alive(docker_backend, session, mark) == []
    # The new agent killed the stopped one: one agent is left.
    assert len(alive(docker_backend, session, "adk-sandbox-agent")) == 1


# -- a lying agent: whatever the container sends, the host neither hangs nor crashes --------------------
LIAR = """import os, sys, time
os.write(1, bytes.fromhex(sys.argv[1]))
time.sleep(float(sys.argv[2]))
"""
# "setid": "refused", as a real agent started with the filter says: these liars test what follows HELLO.
HELLO = encode(FrameType.HELLO, 0, {"protocol": 1, "pid": 1, "subreaper": True, "setid": "refused"})


def _opener(session: DockerSession) -> AgentStreamOpener:
    """Opens agent streams into the session's container with Docker's exec, as the session does."""
    return DockerExecs(session._client, session.container_id, daemon_socket_path()).open_agent_stream


def liar_run(session: DockerSession, output: bytes, linger: float = 0.0) -> None:
    """Run one command through a transport whose 'agent' writes ``output`` and lingers."""
    source = LIAR.replace("sys.argv[1]", repr(output.hex())).replace("sys.argv[2]", repr(str(linger)))
    transport = AgentTransport(_opener(session), launch=AgentLaunch(["python3", "-I", "-S", "-c", source]))
    command = PreparedCommand(
        argv=("true",), env={}, user="1000:1000", workdir="/", stdin=None, marker="liar"
    )
    try:
        transport.run(command, OutputCapture(1024), deadline=time.monotonic() + 2, cancel=None)
    finally:
        transport.close()


@pytest.fixture
def plain_session(docker_backend: DockerBackend, owned_workspace: Path) -> Iterator[DockerSession]:
    with docker_backend.session(workspace=owned_workspace) as opened:
        yield opened


@pytest.mark.parametrize(
    "output",
    [
        b"garbage that is no frame at all",
        HELLO + b"\x04\x00\x00\x00\x00\x00\x00\x01\xff\xff\xff\xff",  # a 4 GiB STDOUT frame
        HELLO + encode(FrameType.EXIT, 99, {"exit_code": 0}),  # a channel never opened
        HELLO + encode(FrameType.PONG, 0, {}) + HELLO,  # a second HELLO
        HELLO,  # then silence: never answers the command
        b"",  # says nothing at all
    ],
)
def test_a_lying_agent_gives_a_clear_error(plain_session: DockerSession, output: bytes) -> None:
    started = time.monotonic()
    with pytest.raises(SandboxFailedError, match="agent"):
        liar_run(plain_session, output, linger=30)
    assert time.monotonic() - started < QUICK


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=200), st.booleans())
def test_fuzzed_frames_from_the_container_side(
    plain_session: DockerSession, garbage: bytes, hello_first: bool
) -> None:
    started = time.monotonic()
    with contextlib.suppress(SandboxFailedError):
        liar_run(plain_session, (HELLO if hello_first else b"") + garbage, linger=5)
    assert time.monotonic() - started < QUICK
    # The real session is untouched by what another transport's agent sent.
    assert plain_session.execute(
        ExecRequest(language=Language.COMMAND, code="echo ok", timeout=20)
    ).stdout == ("ok\n")


def test_closing_a_session_leaves_no_container(docker_backend: DockerBackend, owned_workspace: Path) -> None:
    session = docker_backend.session(workspace=owned_workspace)
    container_id = session.container_id
    run(session, "true")
    session.close()
    assert container_id not in project_containers(docker_backend._client)


# -- a lying agent answering file operations ---------------------------------------------------------
FILE_LIAR = """import os, sys, time
os.write(1, bytes.fromhex(HELLO_HEX))
got = b""
while len(got) < 12:
    got += os.read(0, 65536)
os.write(1, bytes.fromhex(OUTPUT_HEX))
time.sleep(30)
"""
HELLO_OPS = encode(
    FrameType.HELLO,
    0,
    {"protocol": 1, "pid": 1, "subreaper": True, "ops": list(FILE_OPS), "setid": "refused"},
)
BAD_ERROR = {"error": {"errno": "2", "name": "ENOENT", "message": "x"}}


def file_liar(
    session: DockerSession, workspace: Path, op: dict[str, object], output: bytes, hello: bytes
) -> None:
    """One file operation through a transport whose 'agent' reads the request, then writes ``output``."""
    source = FILE_LIAR.replace("HELLO_HEX", repr(hello.hex())).replace("OUTPUT_HEX", repr(output.hex()))
    transport = AgentTransport(_opener(session), launch=AgentLaunch(["python3", "-I", "-S", "-c", source]))
    request = {"path": str(workspace / "target"), **op}
    data = b"new" if op["op"] == "write" else None
    try:
        transport.file_op("1000:1000", request, data, deadline=time.monotonic() + 2, max_output=10)
    finally:
        transport.close()


READ = {"op": "read", "offset": 0, "limit": 10}
STAT = {"op": "stat", "follow": True}
WRITE = {"op": "write", "mode": 0o644, "exclusive": False, "append": False}


@pytest.mark.parametrize(
    ("op", "output", "message"),
    [
        (READ, encode(FrameType.RESULT, 1, BAD_ERROR), "protocol"),  # a malformed error
        (READ, encode(FrameType.RESULT, 1, {"size": "ten"}), "protocol"),  # does not fit the op
        (
            READ,
            encode(FrameType.STDOUT, 1, b"x" * 2048) + encode(FrameType.RESULT, 1, {"size": 2048}),
            "protocol",
        ),
        (READ, b"".join(encode(FrameType.STDOUT, 1, b"y" * 65536) for _ in range(64)), "protocol"),  # a flood
        (STAT, encode(FrameType.STDOUT, 1, b"z") + encode(FrameType.RESULT, 1, {}), "protocol"),
        (
            STAT,
            encode(
                FrameType.EXIT,
                1,
                {
                    "exit_code": 0,
                    "signal": None,
                    "timed_out": False,
                    "stdout_dropped": 0,
                    "stderr_dropped": 0,
                },
            ),
            "protocol",
        ),
        (WRITE, encode(FrameType.RESULT, 1, {"size": -3}), "protocol"),
        (WRITE, encode(FrameType.STDOUT, 7, b"?"), "never opened"),
        (WRITE, b"", "did not answer"),  # silence
        (READ, b"\xff" * 40, "protocol"),  # garbage, no frame at all
    ],
)
def test_a_lying_agent_fails_a_file_operation_within_the_bound(
    plain_session: DockerSession, owned_workspace: Path, op: dict[str, object], output: bytes, message: str
) -> None:
    (owned_workspace / "target").write_bytes(b"old")
    started = time.monotonic()
    with pytest.raises(SandboxFailedError, match=message):
        file_liar(plain_session, owned_workspace, op, output, HELLO_OPS)
    assert time.monotonic() - started < QUICK
    assert (owned_workspace / "target").read_bytes() == b"old"
    assert sorted(os.listdir(owned_workspace)) == [".git", "target"]
    # The real session's agent is untouched.
    assert plain_session.files.read_bytes(str(owned_workspace / "target")) == b"old"


def test_an_agent_without_file_operations_is_refused_clearly(
    plain_session: DockerSession, owned_workspace: Path
) -> None:
    with pytest.raises(InvalidRequestError, match="does not perform the file operation"):
        file_liar(plain_session, owned_workspace, READ, encode(FrameType.RESULT, 1, {"size": 0}), HELLO)


def test_a_stopped_agent_cannot_hold_a_file_operation(
    plain_session: DockerSession, owned_workspace: Path
) -> None:
    files = SandboxFiles(plain_session, timeout=2)
    files.write_bytes(str(owned_workspace / "target"), b"old")
    pid = agent_pid(plain_session)
    api = plain_session._client.api  # a separate exec as the agent's user: stopping it from outside
    stop = api.exec_create(plain_session.container_id, ["kill", "-STOP", str(pid)], user=plain_session._user)
    api.exec_start(stop["Id"])
    started = time.monotonic()
    with pytest.raises(SandboxFailedError, match="did not answer"):
        files.write_bytes(str(owned_workspace / "target"), b"new" * 100_000)
    assert time.monotonic() - started < 2 + QUICK
    assert (owned_workspace / "target").read_bytes() == b"old"
    assert plain_session.files.read_bytes(str(owned_workspace / "target")) == b"old"  # a new agent
    assert plain_session.restarts == 1
