"""``terminal``: interactive programs for a model, one tool call at a time (served by ``adk-sandbox mcp``).

:class:`TerminalTool` takes an ``action`` (``open``, ``send``, ``read``, ``close``; :class:`TerminalArgs`)
and answers with what was printed once the program is quiet for :data:`QUIET_SECS`, as text
(:func:`screen_text`, at most :data:`MAX_OUTPUT_CHARS`).
See docs/terminals.md, section "For models: the terminal tool".
"""

from __future__ import annotations

import re
import threading
import time
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from adk_sandbox.executor.channel.terminal import Terminal
from adk_sandbox.executor.errors import InvalidRequestError
from adk_sandbox.executor.tool_protocol import text_rules
from adk_sandbox.executor.tools import _BlockingTool

__all__ = ["MAX_OUTPUT_CHARS", "MAX_TERMINALS", "QUIET_SECS", "TerminalArgs", "TerminalTool", "screen_text"]

#: Terminals one tool holds open at once.
MAX_TERMINALS = 4
#: An answer comes once the program printed nothing for this long (or ``wait_secs`` passed).
QUIET_SECS = 0.3
#: The most characters of output one answer carries (the latest ones).
MAX_OUTPUT_CHARS = 16_000
_ROWS, _COLS = 40, 120

# CSI (with its parameters), OSC / DCS / APC / PM / SOS strings (to BEL or ST), and two-byte ESC sequences.
_ESCAPES = re.compile(
    rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[\]P_^X][^\x07\x1b]*(?:\x07|\x1b\\)?"
    rb"|\x1b[()][0-9A-Za-z]|\x1b[ -~]|\x9b[0-?]*[ -/]*[@-~]"
)
_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def screen_text(data: bytes) -> str:
    """Terminal output as text for a model: escape sequences and control bytes removed, CRLF as LF."""
    text = _ESCAPES.sub(b"", data).decode("utf-8", errors="replace").replace("\r\n", "\n")
    return _CONTROLS.sub("", text.replace("\r", "\n"))


class TerminalArgs(BaseModel):
    """Arguments of ``terminal``."""

    model_config = ConfigDict(extra="forbid")

    action: Literal["open", "send", "read", "close"] = Field(
        description="open a terminal, send keys to it, read what it printed, or close it."
    )
    terminal: int | None = Field(
        default=None, description="The id `open` returned (for send, read and close).", ge=1
    )
    keys: Annotated[StrictStr, text_rules()] | None = Field(
        default=None,
        description="For send: the keys to type. A newline is Enter; \\u0003 is Ctrl-C, \\u0004 Ctrl-D.",
        max_length=65536,
    )
    command: Annotated[StrictStr, text_rules(nul="a command handed to a shell")] | None = Field(
        default=None, description="For open: a `sh -c` command to run instead of an interactive shell."
    )
    wait_secs: float = Field(
        default=2.0, ge=0, le=30, description="How long to wait for output at most (0..30 s, default 2)."
    )


class TerminalTool(_BlockingTool[TerminalArgs]):
    """``terminal``: terminals in one session, driven by keys (docs/terminals.md, "For models")."""

    name = "terminal"
    description = (
        "Interactive terminals in the sandbox, for programs that need one (a REPL, a pager, a TUI, a "
        "prompt). action=open starts a shell (or `command`) and returns its id and first output; "
        "action=send types `keys` (\\n is Enter, \\u0003 is Ctrl-C) and returns what it printed since; "
        "action=read returns new output without typing; action=close ends it. Output is plain text, "
        f"its last {MAX_OUTPUT_CHARS} characters; at most {MAX_TERMINALS} terminals at once."
    )
    args_model: type[BaseModel] = TerminalArgs

    def __init__(self, session: Any) -> None:
        """Open terminals in ``session`` (anything with ``open_pty``: a session on the agent channel)."""
        if getattr(session, "open_pty", None) is None:
            raise InvalidRequestError(f"a {getattr(session, 'name', 'this')} session opens no terminals")
        self._session = session
        self._terminals: dict[int, Terminal] = {}
        self._next = 1
        self._lock = threading.Lock()

    def close(self) -> None:
        """End every terminal the tool opened; idempotent."""
        with self._lock:
            terminals, self._terminals = list(self._terminals.values()), {}
        for terminal in terminals:
            terminal.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, arguments: TerminalArgs, cancel: threading.Event | None) -> dict[str, Any]:
        if arguments.action == "open":
            return self._open(arguments, cancel)
        if arguments.terminal is None:
            return {
                "status": "error",
                "message": f"{arguments.action} needs `terminal`: the id open returned",
            }
        with self._lock:
            terminal = self._terminals.get(arguments.terminal)
        if terminal is None:
            known = ", ".join(map(str, sorted(self._terminals))) or "none"
            return {"status": "error", "message": f"no terminal {arguments.terminal} is open (open: {known})"}
        if arguments.action == "close":
            with self._lock:
                self._terminals.pop(arguments.terminal, None)
            terminal.close()
            return self._answer(arguments.terminal, terminal, b"")
        if arguments.action == "send":
            if not arguments.keys:
                return {"status": "error", "message": "send needs `keys`: the text to type"}
            if terminal.running:
                terminal.write(arguments.keys.encode())
        return self._answer(arguments.terminal, terminal, self._output(terminal, arguments.wait_secs, cancel))

    def _open(self, arguments: TerminalArgs, cancel: threading.Event | None) -> dict[str, Any]:
        with self._lock:
            if len(self._terminals) >= MAX_TERMINALS:
                return {"status": "error", "message": f"{MAX_TERMINALS} terminals are open; close one first"}
            number, self._next = self._next, self._next + 1
        argv = None if arguments.command is None else ["/bin/sh", "-c", arguments.command]
        terminal = self._session.open_pty(argv, rows=_ROWS, cols=_COLS)
        with self._lock:
            self._terminals[number] = terminal
        return self._answer(number, terminal, self._output(terminal, arguments.wait_secs, cancel))

    @staticmethod
    def _output(terminal: Terminal, wait_secs: float, cancel: threading.Event | None) -> bytes:
        """What the terminal prints until it is quiet for :data:`QUIET_SECS`, or ``wait_secs`` passed."""
        data = bytearray()
        until = time.monotonic() + wait_secs
        while terminal.running and not (cancel is not None and cancel.is_set()):
            left = until - time.monotonic()
            if left <= 0:
                break
            try:
                piece = terminal.read(timeout=min(left, QUIET_SECS))
            except TimeoutError:
                if data:
                    break  # quiet after output: the answer is complete
                continue
            data += piece
            if len(data) > 4 * MAX_OUTPUT_CHARS:
                del data[: len(data) - 4 * MAX_OUTPUT_CHARS]
        return bytes(data)

    @staticmethod
    def _answer(number: int, terminal: Terminal, data: bytes) -> dict[str, Any]:
        text = screen_text(data)
        truncated = len(text) > MAX_OUTPUT_CHARS
        return {
            "status": "success",
            "terminal": number,
            "output": text[-MAX_OUTPUT_CHARS:],
            "output_truncated": truncated,
            "running": terminal.running,
            "exit_code": terminal.exit_code,
        }
