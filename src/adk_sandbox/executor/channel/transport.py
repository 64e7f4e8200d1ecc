"""The seam between a session and the way it runs commands in its sandbox: :class:`CommandTransport`.

A session prepares a command (:class:`PreparedCommand`: the program, its environment, where and as whom it
runs) and hands it to its transport with a deadline; the transport feeds the output to the shared capture,
kills the command's whole tree when it must, and says how it ended (:class:`CommandOutcome`). The agent
channel (:class:`~adk_sandbox.executor.channel.agent_transport.AgentTransport`) is the transport, over any
engine's byte stream; a test may wrap it or stand in for it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import ClassVar, Protocol

from adk_sandbox.executor._output import OutputCapture
from adk_sandbox.executor.errors import SandboxFailedError

__all__ = [
    "CANCEL_POLL_SECONDS",
    "DEFAULT_PATH",
    "KILL_ON_ERROR_SECONDS",
    "MAX_COMMAND_INPUT",
    "CommandOutcome",
    "CommandTransport",
    "ContainerGoneError",
    "PreparedCommand",
]

#: How often a cancel event is polled while waiting for output.
CANCEL_POLL_SECONDS = 0.05
#: When an exception interrupts the caller, at most this long is spent killing the command.
KILL_ON_ERROR_SECONDS = 5.0
#: The PATH a command gets when the image says none.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: The most input one command may be given through the channel: the in-sandbox agent holds at most this
#: much of a command's input not yet read (``MAX_STDIN_PENDING`` in ``executor/channel/inside/agent.c``)
#: and ends the input there, so a larger ``stdin`` is refused before anything is sent, never cut short.
MAX_COMMAND_INPUT = 256 * 1024 * 1024


class ContainerGoneError(SandboxFailedError):
    """The container stopped or vanished before the command could start (nothing ran)."""


@dataclass(frozen=True)
class PreparedCommand:
    """A command ready for the container: the program, its environment and where and as whom it runs."""

    argv: tuple[str, ...]
    env: dict[str, str]
    user: str
    workdir: str
    stdin: bytes | None
    marker: str
    background: bool = False
    """Keep what the command leaves running after its normal exit (ExecRequest.background): agent only."""


@dataclass(frozen=True)
class CommandOutcome:
    """How a command ended (its output went to the capture)."""

    exit_code: int | None
    timed_out: bool = False
    cancelled: bool = False
    kill_failed: bool = False
    """The tree could not be killed from inside (e.g. a fork bomb left no room for the killer)."""
    oom_kills: int | None = None
    """Processes the OOM killer killed in the container while the command ran, as counted inside it (the
    agent's EXIT); None when the transport cannot tell (the host's own counter is then the fallback)."""


class CommandTransport(Protocol):
    """Runs commands in one container and kills their process trees."""

    #: The channel's name as reported to users (``"agent"``).
    channel: ClassVar[str]

    def close(self) -> None:
        """Release what the transport holds in the container (an agent); idempotent."""
        ...

    def run(
        self,
        command: PreparedCommand,
        capture: OutputCapture,
        *,
        deadline: float,
        cancel: threading.Event | None,
    ) -> CommandOutcome:
        """Run ``command`` until it ends or ``deadline`` (monotonic) passes or ``cancel`` is set.

        Whenever it returns or raises, the command's whole tree is dead or its kill is pending (done
        before the next command): on the deadline or cancellation the output produced so far stays in
        ``capture``; an exception raised while the output is read (by ``capture``'s callback, or a
        ``KeyboardInterrupt``) propagates after the kill. Other commands' processes are never touched.
        """
        ...
