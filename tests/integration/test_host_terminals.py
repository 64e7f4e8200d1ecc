"""Terminals of the host backend and of bubblewrap (``ProcessBackend.open_pty``): a host pseudo-terminal.

The conformance ``pty`` check drives a shell on both (size, resize, Ctrl-C, exit status). Here: what a
hostile program on such a terminal can reach and leave behind, the bounds, bad input, and
``adk-sandbox shell --backend bwrap`` driven in tmux as a person would.

Attacks, each checked from the host:

* a shell on a bubblewrap terminal reads and writes what the policy allows, nothing else (a host file
  beside the workspace stays unread and unchanged). A naive design that opened the terminal as a plain
  host process, without the enforcer, fails it.
* a shell's background jobs (each in a process group of its own) die when the terminal closes and when
  the shell exits. A naive design that kills only the program's process group fails it.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from adk_sandbox.executor import (
    InvalidRequestError,
    PolicyNotEnforceableError,
    ProcessBackend,
    SandboxPolicy,
)
from adk_sandbox.executor.backends.bwrap import BubblewrapEnforcer
from adk_sandbox.executor.backends.host_terminal import HostTerminal
from adk_sandbox.executor.channel.frames import MAX_PTYS
from tests.conftest import require
from tests.integration.tmux_driver import Tmux

pytestmark = pytest.mark.bwrap


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    made = tmp_path / "workspace"
    made.mkdir()
    return made


@pytest.fixture
def confined(bwrap_enforcer: BubblewrapEnforcer, workspace: Path) -> Iterator[ProcessBackend]:
    policy = SandboxPolicy.builder().allow_process_spawn().allow_read_write(workspace).build()
    with ProcessBackend.with_sandbox(bwrap_enforcer, policy, workdir=workspace) as backend:
        yield backend


@pytest.fixture
def host(workspace: Path) -> Iterator[ProcessBackend]:
    with ProcessBackend(workdir=workspace) as backend:
        yield backend


def _read_until(terminal: HostTerminal, marker: bytes, seconds: float = 30) -> bytes:
    seen = b""
    deadline = time.monotonic() + seconds
    while marker not in seen:
        assert time.monotonic() < deadline, f"{marker!r} never came: {seen[-400:]!r}"
        seen += terminal.read(timeout=max(deadline - time.monotonic(), 0.1))
    return seen


def _processes_with(word: str) -> list[str]:
    """Host processes whose command line holds ``word``."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                line = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if word in line:
                found.append(f"{name}: {line}")
    return found


def _gone(word: str, seconds: float = 10) -> list[str]:
    deadline = time.monotonic() + seconds
    while (left := _processes_with(word)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_a_bubblewrap_terminal_reaches_only_what_the_policy_allows(
    confined: ProcessBackend, workspace: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host-secret\n")
    with confined.open_pty(["/bin/sh", "-i"], env={"PS1": "$ "}) as terminal:
        _read_until(terminal, b"$ ")
        terminal.write(f"cat {secret}; echo > {secret}; echo over >> {secret}; echo tried''\n".encode())
        seen = _read_until(terminal, b"tried\r\n")
        terminal.write(b"echo kept > made-here.txt; echo wrote''\n")
        _read_until(terminal, b"wrote\r\n")
    assert b"host-secret" not in seen
    assert secret.read_text() == "host-secret\n"
    assert (workspace / "made-here.txt").read_text() == "kept\n"


@pytest.mark.parametrize("ending", ["close", "exit"])
@pytest.mark.parametrize("kind", ["host", "confined"])
def test_a_shells_jobs_die_with_its_terminal(kind: str, ending: str, request: pytest.FixtureRequest) -> None:
    backend: ProcessBackend = request.getfixturevalue(kind)
    word = f"{1000 + uuid.uuid4().int % 9000}.{uuid.uuid4().int % 1000}"  # a sleep no one else runs
    terminal = backend.open_pty(["/bin/sh", "-i"], env={"PS1": "$ "})
    try:
        _read_until(terminal, b"$ ")
        # Two jobs (an interactive shell gives each its own process group) and a nohup'd one.
        terminal.write(f"sleep {word} & nohup sleep {word} >/dev/null 2>&1 & echo st''arted\n".encode())
        _read_until(terminal, b"started\r\n")
        deadline = time.monotonic() + 10
        while len(_processes_with(f"sleep {word}")) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # the jobs are started, not yet exec'd
        assert len(_processes_with(f"sleep {word}")) == 2
        if ending == "exit":
            terminal.write(b"exit 3\n")
            assert terminal.wait(30) == 3
        else:
            terminal.close()
        assert _gone(f"sleep {word}") == []
    finally:
        terminal.close()


def test_a_terminal_ends_at_its_timeout(host: ProcessBackend) -> None:
    with host.open_pty(["/bin/sh", "-c", "sleep 60"], timeout=1) as terminal:
        assert terminal.wait(30) == 137
        assert terminal.timed_out
        assert terminal.read(timeout=5) == b""


def test_terminals_are_bounded_and_bad_input_starts_nothing(confined: ProcessBackend) -> None:
    opened = [confined.open_pty(["/bin/sleep", "300"]) for _ in range(MAX_PTYS)]
    try:
        with pytest.raises(InvalidRequestError, match="the most it may hold"):
            confined.open_pty(["/bin/sleep", "300"])
        opened.pop().close()
        opened.append(confined.open_pty(["/bin/sleep", "300"]))  # room again once one closed
    finally:
        for terminal in opened:
            terminal.close()
    before = _processes_with("bwrap")
    for bad, error in [
        ({"argv": ["/bin/sh", "-c", "echo a\0b"]}, InvalidRequestError),
        ({"argv": ["no-such-program-here"]}, InvalidRequestError),
        ({"rows": 0}, InvalidRequestError),
        ({"cols": 10_001}, InvalidRequestError),
        ({"cwd": "/no/such/dir"}, InvalidRequestError),
        ({"user": "0:0" if os.geteuid() else "65534:65534"}, PolicyNotEnforceableError),
    ]:
        with pytest.raises(error):
            confined.open_pty(**bad)  # type: ignore[arg-type]
    assert _processes_with("bwrap") == before
    with confined.open_pty(["/bin/sh", "-c", "exit 4"]) as terminal:
        assert terminal.wait() == 4  # no timeout: until it ends
        with pytest.raises(InvalidRequestError, match="exited"):
            terminal.write(b"late\n")


def test_shell_on_bubblewrap_in_tmux() -> None:
    """``adk-sandbox shell --backend bwrap`` as a person uses it: a prompt, the size, Ctrl-C, the exit."""
    require(shutil.which("tmux") is not None, "tmux is not installed (scripts/setup installs it)")
    shell = ["/bin/sh", "-c", "PS1='ready> ' exec /bin/sh -i"]
    tmux = Tmux([sys.executable, "-m", "adk_sandbox", "shell", "--backend", "bwrap", "--", *shell])
    try:
        tmux.wait_for("ready> ")
        tmux.type("stty size")
        tmux.wait_for("30 100")
        tmux.type("sleep 300")
        time.sleep(1.0)
        tmux.keys("C-c")
        tmux.type("echo status=$?")
        tmux.wait_for("status=130")
        tmux.type("exit 5")
        assert tmux.exit_status() == "5"
    finally:
        tmux.close()
