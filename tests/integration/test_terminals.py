"""Live programs on a Docker session (``open_pty``, ``spawn``), attacked: floods, a reader that stops, bounds.

The conformance suite's ``pty`` check drives a shell as a person would (size, resize, Ctrl-C, exit
status) on every backend; this module tries what a hostile program on the terminal, or a careless caller,
could do to the session and its neighbours:

* a terminal whose output nobody reads (``yes``) must stop only itself: with an uncapped, unbounded output
  (a naive design that streams a terminal like a command's output, without flow control) the host's memory
  grows without end and the agent's one stream is full, so the session's next command waits behind it;
* a thousand terminals opened at once: at most ``MAX_PTYS`` open, every other refused with a clear error,
  the session and a neighbour session unaffected, and all of it gone after close;
* a terminal's whole tree dies at its close, and at the session's close;
* malformed frames (a RESIZE out of range) are a protocol error, never an ioctl with garbage.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from collections.abc import Iterator

import psutil
import pytest

from adk_sandbox.executor import ExecRequest
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from adk_sandbox.executor.channel.frames import MAX_PTYS, PTY_WINDOW, FrameType, encode
from adk_sandbox.executor.channel.terminal import Terminal
from adk_sandbox.executor.errors import InvalidRequestError, SandboxFailedError
from adk_sandbox.executor.types import MAX_BACKGROUND_GROUPS

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]


def read_until(terminal: Terminal, wanted: bytes, seconds: float = 30) -> bytes:
    """What the terminal showed until ``wanted`` came (fails with what it showed, if it never did)."""
    seen, deadline = b"", time.monotonic() + seconds
    while wanted not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {wanted!r} in {seen[-300:]!r}"
        try:
            piece = terminal.read(timeout=left)
        except TimeoutError:
            continue
        assert piece or terminal.running, f"the terminal ended before {wanted!r}: {seen[-300:]!r}"
        seen += piece
    return seen


def count_inside(session: DockerSession, pattern: str) -> int:
    """How many processes inside the session's container have a command line starting with ``pattern``."""
    found = session.execute(
        ExecRequest(argv=("sh", "-c", f"ps -eo args | grep -c '^{pattern}' || true"), timeout=30)
    )
    return int(found.stdout.strip() or 0)


@pytest.fixture(scope="module")
def backend() -> Iterator[DockerBackend]:
    with DockerBackend() as made:
        yield made


@pytest.fixture
def session(backend: DockerBackend) -> Iterator[DockerSession]:
    with backend.session() as made:
        yield made


def test_a_terminal_nobody_reads_stops_only_itself(session: DockerSession) -> None:
    """``yes`` on an unread terminal: the session's commands go on, the host holds about one window."""
    host = psutil.Process(os.getpid())
    terminal = session.open_pty(["yes", "a line of output that nobody reads"])
    rss_before = host.memory_info().rss
    time.sleep(3)  # at ~60 MB/s an unbounded design would hold ~180 MB by now
    started = time.monotonic()
    result = session.execute(ExecRequest(argv=("echo", "still here"), timeout=30))
    took = time.monotonic() - started
    assert result.stdout == "still here\n"
    assert took < 10, f"a command waited {took:.1f} s behind an unread terminal"
    grown = host.memory_info().rss - rss_before
    assert grown < 8 * PTY_WINDOW, f"the host grew by {grown >> 20} MiB for an unread terminal"
    # The reader picks up where it stopped, and the program is still running.
    assert b"a line of output" in terminal.read(timeout=10)
    assert terminal.running
    terminal.close()
    assert count_inside(session, "yes a line") == 0


def test_a_thousand_terminals_at_once_are_bounded(backend: DockerBackend, session: DockerSession) -> None:
    """1,000 opened from 32 threads: ``MAX_PTYS`` open, the rest refused; the session and a neighbour live."""
    with backend.session() as neighbour:
        neighbour.execute(ExecRequest(argv=("true",), timeout=30))

        def one(_: int) -> Terminal | InvalidRequestError:
            try:
                return session.open_pty(["sleep", "600"])
            except InvalidRequestError as exc:
                return exc

        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            outcomes = list(pool.map(one, range(1000)))
        opened = [o for o in outcomes if isinstance(o, Terminal)]
        refused = [o for o in outcomes if isinstance(o, InvalidRequestError)]
        assert len(opened) + len(refused) == 1000
        assert 1 <= len(opened) <= MAX_PTYS
        assert "close one first" in str(refused[0])
        assert count_inside(session, "sleep 600") == len(opened)
        assert neighbour.execute(ExecRequest(argv=("echo", "ok"), timeout=30)).stdout == "ok\n"
        assert session.execute(ExecRequest(argv=("echo", "ok"), timeout=30)).stdout == "ok\n"
        for terminal in opened:
            terminal.close()
        assert count_inside(session, "sleep 600") == 0
        # Room again once they are closed.
        with session.open_pty(["sh", "-c", "echo back"]) as again:
            assert b"back" in read_until(again, b"back")


def test_close_kills_the_terminals_tree(session: DockerSession) -> None:
    """What the terminal's program started, in the background too, dies at the terminal's close."""
    terminal = session.open_pty(["sh", "-c", "sleep 701 & sleep 702 & echo started; wait"])
    read_until(terminal, b"started")
    assert count_inside(session, "sleep 70") == 2
    terminal.close()
    assert count_inside(session, "sleep 70") == 0
    with pytest.raises(InvalidRequestError, match="closed"):
        terminal.write(b"x")


def test_exit_status_and_signals(session: DockerSession) -> None:
    """A program killed by a signal ends with 128 + N; ``signal`` reaches the foreground program."""
    with session.open_pty(["sh", "-c", "echo go; kill -TERM $$"]) as terminal:
        assert terminal.wait(30) == 128 + signal.SIGTERM
    with session.open_pty(
        ["sh", "-c", "trap 'echo got-usr1; exit 3' USR1; echo ready; while :; do sleep 1; done"]
    ) as t:
        read_until(t, b"ready")
        t.signal(signal.SIGUSR1)
        read_until(t, b"got-usr1")
        assert t.wait(30) == 3


def test_the_session_close_ends_its_terminals(backend: DockerBackend) -> None:
    """After the session's close a terminal says so; nothing is left to read from."""
    session = backend.session()
    terminal = session.open_pty(["sleep", "600"])
    session.close()
    assert not terminal.running
    with pytest.raises(InvalidRequestError):
        terminal.write(b"x")
    with pytest.raises((InvalidRequestError, SandboxFailedError)):
        session.open_pty()


def test_bad_arguments_open_nothing(session: DockerSession) -> None:
    """Sizes out of range and NUL bytes are refused before anything starts."""
    for rows, cols in ((0, 80), (24, 0), (10001, 80), (24, True)):
        with pytest.raises(InvalidRequestError, match="terminal's"):
            session.open_pty(rows=rows, cols=cols)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError):
        session.open_pty(["sh", "-c", "echo a\0b"])
    with session.open_pty(["sh", "-c", "echo fine"]) as terminal:
        read_until(terminal, b"fine")
        for bad in ((0, 5), (5, 20000)):
            with pytest.raises(InvalidRequestError):
                terminal.resize(*bad)
        with pytest.raises(InvalidRequestError):
            terminal.signal(0)
        with pytest.raises(InvalidRequestError):
            terminal.write("text")  # type: ignore[arg-type]


def test_a_malformed_resize_breaks_the_agent_not_the_host(session: DockerSession) -> None:
    """A RESIZE out of range on the wire is the agent's protocol error: it ends, and a new one serves.

    The host never sends one (``check_size``); this stands for a host-side bug or a forged frame. The
    agent must not pass garbage to ioctl: it ends (every command of it fails), and a new agent serves the
    session's next command.
    """
    terminal = session.open_pty(["sleep", "600"])
    transport, user = session.agent_channel()
    agent = transport._agent_for(user, time.monotonic() + 30)
    agent.send(encode(FrameType.RESIZE, terminal._number, {"rows": 0, "cols": 70000}), time.monotonic() + 10)
    with pytest.raises(SandboxFailedError):
        terminal.wait(30)
    assert session.execute(ExecRequest(argv=("echo", "new agent"), timeout=60)).stdout == "new agent\n"
    assert count_inside(session, "sleep 600") == 0


# -- spawned processes: the same channel without a terminal ------------------------------------------------


def test_a_spawned_process_is_talked_to_while_it_runs(session: DockerSession) -> None:
    """stdin written while it runs and closed; stdout and stderr apart, as they come; its exit status."""
    script = "while read line; do echo out:$line; echo err:$line >&2; done; exit 3"
    process = session.spawn(["sh", "-c", script])
    assert session.processes() == [process]
    process.write(b"one\n")
    out, err = b"", b""
    deadline = time.monotonic() + 30
    while b"out:one" not in out or b"err:one" not in err:
        assert time.monotonic() < deadline, (out, err)
        got = process.read(timeout=30)
        out, err = out + got.stdout, err + got.stderr
    assert process.running
    process.write(b"two\n")
    process.close_stdin()
    assert process.wait(30) == 3
    rest = process.read(timeout=5)
    assert b"out:two" in out + rest.stdout and b"err:two" in err + rest.stderr
    assert process.read(timeout=5) == (b"", b"") and not process.running
    process.close()
    assert session.processes() == []


def test_an_unread_spawned_process_stops_only_itself(session: DockerSession) -> None:
    """``yes`` spawned and never read: the session's commands go on, the host holds about one window."""
    host = psutil.Process(os.getpid())
    with session.spawn(["yes", "unread output"]) as process:
        rss_before = host.memory_info().rss
        time.sleep(3)
        result = session.execute(ExecRequest(argv=("echo", "still here"), timeout=30))
        assert result.stdout == "still here\n"
        assert host.memory_info().rss - rss_before < 8 * PTY_WINDOW
        assert b"unread output" in process.read(timeout=10).stdout
        process.kill()
    assert count_inside(session, "yes unread") == 0


def test_spawned_processes_are_bounded(session: DockerSession) -> None:
    """At most as many at once as background commands; one more is refused, and room comes back."""
    processes = [session.spawn(["sleep", "600"]) for _ in range(MAX_BACKGROUND_GROUPS)]
    with pytest.raises(InvalidRequestError, match="close one first"):
        session.spawn(["sleep", "600"])
    assert len(session.processes()) == MAX_BACKGROUND_GROUPS
    processes[0].kill()
    session.spawn(["true"]).close()
    for process in processes[1:]:
        process.kill()
    assert count_inside(session, "sleep 600") == 0
