"""A Docker command's whole tree dies with it, and nothing else does (issue 10, items 1, 2, 4 and 5).

Attacks with the real engine, for a workspace owned by uid 1000 (commands as uid 1000) and one owned by
root (commands as uid 0 without capabilities). Each survivor is a ``sleep`` of a duration nobody else
uses, looked up in the container's process list through a separate exec as root, outside the session.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from adk_sandbox.executor import ExecRequest, ExecResult, Language, SandboxFailedError
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from tests.conftest import project_containers, unique_sleep_seconds

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]

#: Generous "does not hang" bound for a command that should come back at once.
QUICK = 30.0


@pytest.fixture(params=["uid1000", "root"])
def workspace(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace owned by uid 1000, or by root (then commands run as uid 0 without capabilities)."""
    root = tmp_path_factory.mktemp(f"ws-{request.param}")
    if request.param == "uid1000":
        os.chown(root, 1000, 1000)
    else:
        os.chown(root, 0, 0)
    return root


@pytest.fixture
def session(docker_backend: DockerBackend, workspace: Path) -> Iterator[DockerSession]:
    with docker_backend.session(workspace=workspace) as opened:
        yield opened


def run(session: DockerSession, code: str, timeout: float = 20, **kwargs: object) -> ExecResult:
    return session.execute(ExecRequest(language=Language.COMMAND, code=code, timeout=timeout), **kwargs)  # type: ignore[arg-type]


def container_processes(docker_backend: DockerBackend, session: DockerSession) -> list[str]:
    """Every process's argv in the session's container, read by an exec outside the session."""
    result = docker_backend._client.api.exec_create(session.container_id, ["ps", "-eo", "args="], user="0:0")
    return docker_backend._client.api.exec_start(result["Id"]).decode().splitlines()


def alive(docker_backend: DockerBackend, session: DockerSession, *needles: str) -> list[str]:
    return [line for line in container_processes(docker_backend, session) if any(n in line for n in needles)]


def survivors_script(marks: list[str], bomb_delay: int = 2) -> str:
    """Background processes that each hide from one way of finding a command's processes."""
    return (
        f"env -i /bin/sleep {marks[0]} & "  # cleared environment
        f"setsid env -i /bin/sleep {marks[1]} & "  # own session too
        # Non-dumpable: /proc/PID/environ is unreadable, so no marker variable can be seen; its child too.
        "python3 -c 'import ctypes, os, time; ctypes.CDLL(None).prctl(4, 0); os.fork(); "
        f"time.sleep({marks[2]})' & "
        # A time bomb: returns at once, acts later (after the command's end) if it survives.
        f"""env -i /bin/sh -c 'sleep {bomb_delay}; touch "$0/bomb"' "$PWD" & """
        "sleep 0.5; echo started"
    )


ENDINGS = ["exit", "timeout", "cancel"]


@pytest.mark.parametrize("ending", ENDINGS)
def test_no_descendant_survives_its_command(
    docker_backend: DockerBackend, session: DockerSession, workspace: Path, ending: str
) -> None:
    check_no_descendant_survives(
        docker_backend, session, ending, run, bomb_went_off=(workspace / "bomb").exists
    )


def check_no_descendant_survives(
    backend: DockerBackend,
    session: DockerSession,
    ending: str,
    run: Callable[..., ExecResult],
    *,
    bomb_went_off: Callable[[], bool],
) -> None:
    """The matrix case ``ending``: hiding descendants die when their command exits, times out or is
    cancelled; a neighbour command survives. ``run(session, code, timeout, cancel=...)`` runs a command
    in the directory where the time bomb would leave its file (shared with the remote-engine tests)."""
    marks = [unique_sleep_seconds() for _ in range(3)]
    code = survivors_script(marks, bomb_delay=2 if ending == "exit" else 4)
    cancel = threading.Event()
    neighbour: list[ExecResult] = []
    if ending != "exit":  # a command running alongside must not be touched by the kill
        threading.Thread(target=lambda: neighbour.append(run(session, "sleep 7; echo N"))).start()
        time.sleep(0.5)
    if ending == "exit":
        result = run(session, code)
        assert result.exit_code == 0
    elif ending == "timeout":
        result = run(session, code + "; sleep 60", timeout=3)
        assert result.timed_out
    else:
        timer = threading.Timer(2.0, cancel.set)
        timer.start()
        result = run(session, code + "; sleep 60", timeout=60, cancel=cancel)
        timer.join()
        assert result.cancelled
    assert result.stdout == "started\n"
    time.sleep(3)  # long enough for the time bomb to go off if it survived
    assert not bomb_went_off()
    assert alive(backend, session, *marks) == []
    if ending != "exit":
        deadline = time.monotonic() + QUICK
        while not neighbour and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (neighbour[0].exit_code, neighbour[0].stdout) == (0, "N\n")


def test_a_command_that_kills_its_parent_leaves_nothing(
    docker_backend: DockerBackend, session: DockerSession, workspace: Path
) -> None:
    mark = unique_sleep_seconds()
    started = time.monotonic()
    run(
        session,
        f"setsid env -i /bin/sleep {mark} & "
        """env -i /bin/sh -c 'sleep 3; touch "$0/bomb"' "$PWD" & """
        "kill -9 $PPID; sleep 60",
        timeout=20,
    )
    assert time.monotonic() - started < QUICK
    time.sleep(3.5)
    assert not (workspace / "bomb").exists()
    assert alive(docker_backend, session, mark, "sleep 60") == []
    assert run(session, "echo alive").stdout == "alive\n"


def test_a_timeout_does_not_kill_a_neighbour(docker_backend: DockerBackend, session: DockerSession) -> None:
    results: dict[str, ExecResult] = {}

    def command(name: str, code: str, timeout: float) -> None:
        results[name] = run(session, code, timeout=timeout)

    a = threading.Thread(target=command, args=("A", "sleep 100", 3))
    # B's orphan (its parent exits at once, it calls setsid) must survive A's kill and orphan sweep.
    b = threading.Thread(
        target=command,
        args=("B", "sh -c 'setsid sh -c \"sleep 4; echo orphan\" &'; sleep 5; echo B", 30),
    )
    a.start()
    time.sleep(1)
    b.start()
    a.join(QUICK)
    b.join(QUICK)
    assert results["A"].timed_out
    assert (results["B"].exit_code, results["B"].stdout) == (0, "orphan\nB\n")
    assert alive(docker_backend, session, "sleep 100") == []


def test_a_failing_output_callback_kills_the_command(
    docker_backend: DockerBackend, session: DockerSession
) -> None:
    marks = [unique_sleep_seconds() for _ in range(2)]

    def fail(stream: str, chunk: str) -> None:
        raise RuntimeError("the callback broke")

    started = time.monotonic()
    with pytest.raises(RuntimeError, match="the callback broke"):
        run(
            session, f"echo first; setsid env -i /bin/sleep {marks[0]} & sleep {marks[1]}", 60, on_output=fail
        )
    assert time.monotonic() - started < QUICK
    assert alive(docker_backend, session, *marks) == []
    assert run(session, "echo alive").stdout == "alive\n"


def test_an_interrupt_while_reading_output_kills_the_command(
    docker_backend: DockerBackend, session: DockerSession
) -> None:
    mark = unique_sleep_seconds()

    def interrupt(stream: str, chunk: str) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(session, f"echo first; sleep {mark}", 60, on_output=interrupt)
    assert alive(docker_backend, session, mark) == []


def test_a_session_closed_meanwhile_opens_no_container(
    docker_backend: DockerBackend, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = docker_backend.session(workspace=workspace)
    closed_container = session.container_id
    before = set(project_containers(docker_backend._client, os.getpid()))
    real_start = session.start

    def start_then_closed_by_another_thread() -> None:
        real_start()
        session.close()  # lands between the command's start() and its run

    monkeypatch.setattr(session, "start", start_then_closed_by_another_thread)
    with pytest.raises(SandboxFailedError, match="this Docker session is closed"):
        run(session, "echo never")
    assert set(project_containers(docker_backend._client, os.getpid())) <= before - {closed_container}
