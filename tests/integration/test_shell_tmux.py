"""``adk-sandbox shell`` and ``attach`` driven as a person would, in tmux: keys in, the screen read back.

A private tmux server (its own socket, no config) runs the command in a pane of a known size; the test
types with ``send-keys`` and reads the pane with ``capture-pane``, so everything goes through a real
terminal emulator: raw mode, the line discipline in the sandbox, the escape sequences of full-screen
programs, a resize of the window. The sandbox image adds ``vim`` (vim-tiny) to the base image.

The attack: a program in the sandbox prints what would make the person's terminal act — set its
clipboard (OSC 52), its title (OSC 2), or answer a cursor-position query (CSI 6 n, whose answer would
arrive as typed input) — and the host checks tmux's own state: its paste buffers, the pane's title, and
that no answer was typed into the shell. The same run with ``--raw`` (no filter: the naive design) shows
each of them getting through, so the check has teeth.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import docker
import pytest

from tests.conftest import require
from tests.integration.egress_servers import ensure_image
from tests.integration.tmux_driver import Tmux

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]

IMAGE = "adk-sandbox-test/terminal:latest"
DOCKERFILE = b"""FROM adk-sandbox/base:latest
USER root
RUN apt-get update && apt-get install -y --no-install-recommends vim-tiny && rm -rf /var/lib/apt/lists/*
"""


def shell_command(*extra: str) -> list[str]:
    return [sys.executable, "-m", "adk_sandbox", "shell", "--image", IMAGE, *extra]


@pytest.fixture(scope="module")
def image() -> str:
    require(shutil.which("tmux") is not None, "tmux is not installed (scripts/setup installs it)")
    return ensure_image(docker.from_env(), IMAGE, DOCKERFILE)


@pytest.fixture
def tmux(image: str) -> Iterator[Tmux]:
    made = Tmux(shell_command())
    try:
        made.wait_for("@sandbox:")
        yield made
    finally:
        made.close()


def test_python_vim_top_resize_and_ctrl_c(tmux: Tmux) -> None:
    """A person's session: python3 -i, vim, top, a resize, Ctrl-C to a child; the shell lives through it."""
    tmux.type("python3 -i")
    tmux.wait_for(">>> ")
    tmux.type("6 * 7")
    tmux.wait_for("42")
    tmux.keys("C-c")
    tmux.wait_for("KeyboardInterrupt")
    tmux.type("exit()")
    tmux.type("echo back-in-the-shell")
    tmux.wait_for("back-in-the-shell\n")

    tmux.type("vi /tmp/note.txt")
    tmux.wait_for("~")  # vim's empty lines
    tmux.keys("i")
    tmux.keys("written in vim", literal=True)
    tmux.keys("Escape")
    tmux.type(":wq")
    tmux.type("clear; cat /tmp/note.txt")
    tmux.wait_for("written in vim\n")

    tmux.type("top -d 0.5")
    tmux.wait_for("PID")
    tmux.tmux("resize-window", "-t", "t", "-x", "132", "-y", "40")
    time.sleep(1.0)
    tmux.keys("q")
    tmux.type("clear; stty size")
    tmux.wait_for("40 132")

    tmux.type("sleep 300")
    time.sleep(1.0)
    tmux.keys("C-c")
    tmux.type("echo status=$?")
    tmux.wait_for("status=130")
    tmux.type("exit 5")
    assert tmux.exit_status() == "5"


HOSTILE = (
    "printf '\\033]52;c;%s\\007' $(printf stolen-clipboard | base64); "
    "printf '\\033]2;%s\\007' PWNED-TITLE; "
    "printf '\\033[6n'; sleep 1; echo; echo hostile-done"
)


def _attack(tmux: Tmux) -> dict[str, bool]:
    """What got through to tmux: its clipboard buffer, the pane's title, an answer typed into the shell."""
    tmux.type(HOSTILE)
    tmux.wait_for("hostile-done\n")
    tmux.type("read -t 1 -r typed; echo typed=[$typed]")
    shown = tmux.wait_for("typed=[")
    buffers = subprocess.run(
        ["tmux", "-L", tmux.socket, "list-buffers", "-F", "#{buffer_sample}"],
        capture_output=True, text=True, env=tmux.env, timeout=30, check=False,
    ).stdout  # fmt: skip
    return {
        "clipboard": "stolen-clipboard" in buffers,
        "title": tmux.value("#{pane_title}") == "PWNED-TITLE",
        "answer": "R" in shown.split("typed=[")[-1].split("]")[0] or "\x1b[" in shown,
    }


def test_the_sandbox_cannot_work_the_persons_terminal(tmux: Tmux) -> None:
    """Clipboard, title and a cursor-position answer: none reaches tmux through the filter."""
    got_through = _attack(tmux)
    assert got_through == {"clipboard": False, "title": False, "answer": False}


def test_without_the_filter_the_same_attack_gets_through(image: str) -> None:
    """``--raw`` (the naive design: every byte passed) lets the same program do it: the check has teeth."""
    tmux = Tmux(shell_command("--raw"))
    try:
        tmux.wait_for("@sandbox:")
        got_through = _attack(tmux)
    finally:
        tmux.close()
    assert got_through["title"] and got_through["clipboard"], got_through


def test_attach_reaches_the_same_session(tmux: Tmux, image: str) -> None:
    """``adk-sandbox attach ID`` from a second terminal opens a shell in the session the first one runs."""
    tmux.type("echo shared > /tmp/from-first")
    first = tmux.wait_for("session ")  # the line the shell printed on stderr before the prompt
    session_id = first.split("adk-sandbox attach ")[1].split()[0]
    other = Tmux([sys.executable, "-m", "adk_sandbox", "attach", session_id])
    try:
        other.wait_for("@sandbox:")
        other.type("cat /tmp/from-first")
        other.wait_for("shared\n")
        other.type("exit 4")
        assert other.exit_status() == "4"
    finally:
        other.close()
    tmux.type("echo first-still-here")
    tmux.wait_for("first-still-here\n")
