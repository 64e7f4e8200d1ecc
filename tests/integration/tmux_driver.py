"""A private tmux server driven as a person would: keys in (``send-keys``), the screen out.

Shared by the tests of ``adk-sandbox shell`` and ``attach`` (tests/integration/test_shell_tmux.py,
test_host_terminals.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class Tmux:
    """A private tmux server with one window running ``command``; keys in, the screen out."""

    def __init__(self, command: list[str], width: int = 100, height: int = 30) -> None:
        self.socket = f"adk-test-{uuid.uuid4().hex[:8]}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}
        self.env = {**env, "PYTHONPATH": str(ROOT / "src")}
        self.tmux("-f", "/dev/null", "new-session", "-d", "-x", str(width), "-y", str(height), "-s", "t")
        self.tmux("set-option", "-g", "remain-on-exit", "on")
        self.tmux("set-option", "-g", "set-clipboard", "on")  # an application's OSC 52 sets a buffer
        self.tmux("set-option", "-g", "allow-rename", "on")
        self.tmux("set-option", "-g", "history-limit", "5000")
        # The command's exit status goes to a file: tmux marks a pane dead when its terminal closes and
        # does not always have the status by then.
        self.status_file = Path(tempfile.mkdtemp(prefix="adk-tmux-")) / "status"
        shell_line = " ".join(_quote(part) for part in command)
        self.tmux("respawn-pane", "-k", "-t", "t", f"{shell_line}; echo $? > {_quote(str(self.status_file))}")

    def tmux(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-L", self.socket, *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, f"tmux {args}: {done.stderr}"
        return done.stdout

    def keys(self, *keys: str, literal: bool = False) -> None:
        self.tmux("send-keys", "-t", "t", *(["-l"] if literal else []), *keys)

    def type(self, text: str) -> None:
        """Type ``text`` and press Enter."""
        self.keys(text, literal=True)
        self.keys("Enter")

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-N", "-t", "t", "-S", "-200")

    def wait_for(self, text: str, seconds: float = 60) -> str:
        deadline = time.monotonic() + seconds
        while True:
            shown = self.screen()
            if text in shown:
                return shown
            assert time.monotonic() < deadline, f"{text!r} never showed; the screen:\n{shown}"
            time.sleep(0.1)

    def exit_status(self, seconds: float = 60) -> str:
        """The exit status of the pane's command, once it ended (128 + N if signal N killed it)."""
        deadline = time.monotonic() + seconds
        while not self.status_file.exists() or not self.status_file.read_text().strip():
            assert time.monotonic() < deadline, self.screen()
            time.sleep(0.1)
        return self.status_file.read_text().strip()

    def value(self, fmt: str) -> str:
        return self.tmux("display-message", "-p", "-t", "t", fmt).strip()

    def close(self) -> None:
        subprocess.run(
            ["tmux", "-L", self.socket, "kill-server"],
            capture_output=True,
            env=self.env,
            timeout=30,
            check=False,
        )
        shutil.rmtree(self.status_file.parent, ignore_errors=True)


def _quote(part: str) -> str:
    return "'" + part.replace("'", "'\\''") + "'"
