"""The engine or the agent dies mid-command (issue 11, "Must show"): a clear error, the next command works.

Real engines. The engine that is restarted or killed is a private ``dockerd`` started for this module
(:mod:`tests.integration.private_engine`; the shared one is never touched), reached through
``DOCKER_HOST``. Every command of a test sleeps for a duration nobody else uses, so its processes are
found in the host's /proc whatever engine ran them. Bounds are generous "does not hang" limits.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from adk_sandbox.executor import ExecRequest, ExecResult, ExecutorError, Language, SandboxFailedError
from adk_sandbox.executor.backends.docker import BASE_IMAGE, DockerBackend, DockerSession, _daemon
from adk_sandbox.executor.channel.agent_transport import AgentTransport
from tests.conftest import live_processes_with_args, require, unique_sleep_seconds, wait_until_gone
from tests.integration.private_engine import DOCKERD, PrivateEngine, PrivateEngineError

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]

#: Generous "does not hang" bound: from the engine's stop (or the agent's death) to the caller's error.
QUICK = 30.0
PRIVATE_IMAGE = "adk-sandbox-private/minimal:test"


@pytest.fixture(scope="module")
def engine(docker_backend: DockerBackend) -> Iterator[PrivateEngine]:
    """A private dockerd with a minimal image of the base image, for this module; removed at the end."""
    require(os.geteuid() == 0 and os.access(DOCKERD, os.X_OK), f"a private dockerd needs root and {DOCKERD}")
    private = PrivateEngine()
    try:
        private.start()
        private.import_minimal_image(BASE_IMAGE, PRIVATE_IMAGE)
    except PrivateEngineError as exc:
        private.destroy()
        require(False, f"the private Docker engine could not start: {exc}")
    try:
        yield private
    finally:
        private.destroy()
        assert private.leftover_processes() == []
        assert not private.root.exists()


@pytest.fixture
def on_engine(engine: PrivateEngine, monkeypatch: pytest.MonkeyPatch) -> PrivateEngine:
    """The private engine, running, and the one every backend made in the test talks to."""
    if not engine.answers():
        engine.start()
    monkeypatch.setenv("DOCKER_HOST", engine.host)
    # Idempotent calls to an unreachable engine (a close) are retried for this long (10 s by default,
    # for a service manager's restart); shortened to keep the module quick, the bound is what is tested.
    monkeypatch.setattr(_daemon, "RETRY_BUDGET_SECONDS", 2.0)
    return engine


def owned(factory: pytest.TempPathFactory, owner: int) -> Path:
    """A workspace owned by ``owner`` (commands run as its owner: uid 1000, or root without capabilities)."""
    root = factory.mktemp(f"ws-{owner}")
    os.chown(root, owner, owner)
    return root


@pytest.fixture(params=[1000, 0], ids=["uid1000", "root"])
def workspace(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return owned(tmp_path_factory, request.param)


def run(session: DockerSession, code: str, timeout: float = 20) -> ExecResult:
    return session.execute(ExecRequest(language=Language.COMMAND, code=code, timeout=timeout))


class Background:
    """A call in a thread: its result or exception, and when it came back."""

    def __init__(self, call: Callable[[], object]) -> None:
        self.outcome: object = None
        self.ended: float | None = None

        def target() -> None:
            try:
                self.outcome = call()
            except BaseException as exc:  # handed to the test thread
                self.outcome = exc
            self.ended = time.monotonic()
            self.done.set()

        self.done = threading.Event()
        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def wait(self, timeout: float) -> object:
        """The outcome; fails the test when the call is still blocked ``timeout`` seconds from now."""
        assert self.done.wait(timeout), f"the call still blocks {timeout:g} s later"
        return self.outcome


def wait_for_processes(*args: str, timeout: float = QUICK) -> list[int]:
    """Wait (bounded) until a process with ``args`` runs; its pids."""
    deadline = time.monotonic() + timeout
    while not (found := live_processes_with_args(*args)):
        assert time.monotonic() < deadline, f"{args} never started"
        time.sleep(0.05)
    return found


def agent_pid(session: DockerSession) -> int:
    transport = session._transport
    assert isinstance(transport, AgentTransport)
    pid = transport.agent_pid
    assert pid is not None
    return pid


# -- the engine restarted mid-command ---------------------------------------------------------------------
@pytest.mark.parametrize("owner", [1000, 0])
def test_an_engine_restarted_mid_command_fails_it_clearly_and_the_session_goes_on(
    on_engine: PrivateEngine, tmp_path_factory: pytest.TempPathFactory, owner: int
) -> None:
    workspace = owned(tmp_path_factory, owner)
    backend = DockerBackend(image=PRIVATE_IMAGE)
    session = backend.session(workspace=workspace)
    mark = unique_sleep_seconds()
    try:
        assert run(session, "echo before").stdout == "before\n"
        first = session.container_id
        running = Background(lambda: run(session, f"echo started; sleep {mark}", timeout=120))
        wait_for_processes("sleep", mark)
        stopping = time.monotonic()
        on_engine.restart()  # no live-restore: the container dies with the engine
        error = running.wait(QUICK)
        assert isinstance(error, SandboxFailedError), error
        assert "not re-run" in str(error)
        assert running.ended is not None and running.ended - stopping < QUICK
        assert wait_until_gone("sleep", mark) == []
        # The next command runs in a fresh container (logged, counted), the old one is gone.
        assert run(session, "echo again").stdout == "again\n"
        assert session.restarts == 1
        second = session.container_id
        assert second != first
        assert first not in on_engine.containers()
    finally:
        session.close()
        backend.close()
    assert second not in on_engine.containers()
    assert live_processes_with_args("sleep", mark) == []


# -- the engine killed mid-command ------------------------------------------------------------------------
def test_an_engine_killed_mid_command_fails_it_clearly_and_close_does_not_hang(
    on_engine: PrivateEngine, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Two sessions, each of its own backend, both running a command when the engine is SIGKILLed.
    backends = [DockerBackend(image=PRIVATE_IMAGE) for _ in range(2)]
    sessions = [backend.session(workspace=owned(tmp_path_factory, 1000)) for backend in backends]
    marks = [unique_sleep_seconds() for _ in sessions]
    for session in sessions:
        assert run(session, "echo before").stdout == "before\n"
    containers = [session.container_id for session in sessions]
    running = [
        Background(functools.partial(run, session, f"sleep {mark}", 120))
        for session, mark in zip(sessions, marks, strict=True)
    ]
    for mark in marks:
        wait_for_processes("sleep", mark)
    on_engine.kill()
    killed = time.monotonic()
    for background in running:
        error = background.wait(QUICK)
        assert isinstance(error, SandboxFailedError), error
        assert background.ended is not None and background.ended - killed < QUICK
    # The containers outlive their killed engine: closing cannot remove them, but must not hang.
    closing = [Background(session.close) for session in sessions]
    for background in closing:
        outcome = background.wait(QUICK)
        assert outcome is None or isinstance(outcome, ExecutorError), outcome  # at most a clear error
    for backend in backends:
        Background(backend.close).wait(QUICK)
    # Once the engine is back, nothing of the sessions is left: without live-restore the engine kills at
    # its start what it ran before, and auto-remove removes the containers.
    on_engine.start()
    # The engine removes them at its start, but not before it answers: wait (bounded) for that.
    deadline = time.monotonic() + 60
    while set(containers) & set(on_engine.containers()) and time.monotonic() < deadline:
        time.sleep(0.2)
    for container_id in containers:
        assert container_id not in on_engine.containers()
    for mark in marks:
        assert wait_until_gone("sleep", mark) == []


def test_a_container_its_session_could_not_remove_is_reaped_by_the_next_backend(
    on_engine: PrivateEngine, tmp_path_factory: pytest.TempPathFactory
) -> None:
    backend = DockerBackend(image=PRIVATE_IMAGE)
    session = backend.session(workspace=owned(tmp_path_factory, 1000))
    assert run(session, "echo before").stdout == "before\n"
    container_id = session.container_id
    # The engine runs on but cannot be reached (its socket is elsewhere) while the session closes.
    away = on_engine.socket + ".away"
    os.rename(on_engine.socket, away)
    try:
        outcome = Background(session.close).wait(QUICK)
        assert isinstance(outcome, ExecutorError), outcome
        assert "not reachable" in str(outcome) and "left behind" in str(outcome)
    finally:
        os.rename(away, on_engine.socket)
    backend.close()
    assert container_id in on_engine.containers()  # the owner (this process) is alive: labels keep it
    reaper = DockerBackend(image=PRIVATE_IMAGE)
    reaper.close()
    assert container_id in {leaked.id for leaked in reaper.reaped}
    assert container_id not in on_engine.containers()


# -- the agent killed from inside mid-command, with a neighbour running -----------------------------------
def test_killing_the_agent_fails_both_running_commands_reruns_neither_and_the_session_goes_on(
    on_engine: PrivateEngine, workspace: Path
) -> None:
    backend = DockerBackend(image=PRIVATE_IMAGE)
    session = backend.session(workspace=workspace)
    counter = workspace / "runs"
    marks = [unique_sleep_seconds() for _ in range(3)]
    try:
        assert run(session, "true").exit_code == 0
        pid = agent_pid(session)
        # Each command counts its starts in the workspace: a re-run would show as a second line.
        neighbour = Background(
            lambda: run(session, f"echo neighbour >> {counter}; sleep {marks[0]}", timeout=120)
        )
        wait_for_processes("sleep", marks[0])
        started = time.monotonic()
        killer = Background(
            lambda: run(
                session,
                f"echo killer >> {counter}; setsid sleep {marks[1]} & sleep {marks[2]} & "
                f"sleep 0.5; kill -9 {pid}; wait",
                timeout=120,
            )
        )
        for background in (killer, neighbour):
            error = background.wait(QUICK)
            assert isinstance(error, SandboxFailedError), error
            assert "agent" in str(error) and "not re-run" in str(error)
        assert time.monotonic() - started < QUICK
        # The next command gets a new agent, which first kills everything the old one left (both
        # commands' trees, the setsid one included); nothing ran twice.
        assert run(session, "echo again").stdout == "again\n"
        assert session.restarts == 1
        assert agent_pid(session) != pid
        for mark in marks:
            assert wait_until_gone("sleep", mark) == []
        assert sorted(counter.read_text().splitlines()) == ["killer", "neighbour"]
    finally:
        session.close()
        backend.close()
    assert on_engine.containers() == []
