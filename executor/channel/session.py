"""One session shape for every engine whose commands travel over a :class:`CommandTransport`.

A Docker container and a Kubernetes Pod differ in how they are made, checked and removed; how a command
runs once the sandbox is up is the same: refuse what the sandbox cannot honour, sync the workspace in,
run the command through the transport into a capped capture, sync the workspace back, and assemble the
:class:`ExecResult`. :meth:`ChannelSession.execute` is that body, written once; an engine's session
subclasses it and supplies its parts:

* :meth:`~ChannelSession._refuse` -- the requests this sandbox refuses (a user it cannot switch to, a
  memory limit below its own); also makes sure the sandbox is started;
* :meth:`~ChannelSession._before_command` -- checks that need the sandbox (Docker: the cwd can be
  entered); default none;
* :meth:`~ChannelSession._run_command` -- run one prepared command, returning the transport's outcome and
  whether the kernel's OOM killer hit it (Docker also replaces a container that died);
* :meth:`~ChannelSession._explained` -- what a broken channel means for this engine (Kubernetes reads the
  Pod's status); default: the error as it is;
* :meth:`~ChannelSession._command_user` -- whom a command (and a file operation) runs as.

File operations (:attr:`ChannelSession.files`) come with the shape: every session on the agent channel
reads and writes files inside its sandbox the same way (:mod:`.files`).
"""

from __future__ import annotations

import threading
import time
from abc import abstractmethod
from typing import Any, ClassVar

from adk_sandbox.executor._languages import request_argv
from adk_sandbox.executor._output import OutputCapture
from adk_sandbox.executor.backend import OutputCallback, SandboxSession
from adk_sandbox.executor.channel.agent_transport import AgentTransport
from adk_sandbox.executor.channel.files import SandboxFiles
from adk_sandbox.executor.channel.transport import CommandOutcome, CommandTransport
from adk_sandbox.executor.errors import ExecutorError, InvalidRequestError, SandboxFailedError
from adk_sandbox.executor.types import ExecRequest, ExecResult
from adk_sandbox.executor.workspace.synced import SyncedWorkspace, refusal_note

__all__ = ["ChannelSession"]


class ChannelSession(SandboxSession):
    """A session whose commands run through a :class:`CommandTransport` in one sandbox (see the module).

    Subclasses set ``_transport`` (None until the sandbox is up, and after it is gone) and ``_workspace``
    (the synced host workspace, or None), and implement the engine's parts.
    """

    _transport: CommandTransport | None = None
    _workspace: SyncedWorkspace | None = None
    #: Said when a file operation finds the sandbox gone (an engine may say how to get a new one).
    _GONE: ClassVar[str] = "the session's sandbox is gone"
    #: Said when a file operation finds the session's commands on another transport than the agent channel.
    _NO_FILES: ClassVar[str] = "file operations need the agent channel; this session does not use it"

    # -- the engine's parts ---------------------------------------------------------------------------
    @abstractmethod
    def _refuse(self, request: ExecRequest) -> None:
        """Raise for a request this sandbox cannot honour (nothing ran); start the sandbox."""

    def _before_command(self, request: ExecRequest, started: float) -> None:
        """Checks that need the started sandbox, before the workspace syncs in (default: none)."""

    @abstractmethod
    def _run_command(
        self,
        request: ExecRequest,
        argv: tuple[str, ...],
        capture: OutputCapture,
        *,
        started: float,
        cancel: threading.Event | None,
    ) -> tuple[CommandOutcome, bool]:
        """Run ``argv`` for ``request`` through the transport: its outcome and whether it was OOM-killed."""

    def _explained(self, exc: SandboxFailedError) -> ExecutorError:
        """What a broken channel means here (default: the error as it is)."""
        return exc

    @abstractmethod
    def _command_user(self, requested: str | None) -> str:
        """The ``"uid:gid"`` a command (or file operation) runs as, given the request's ``user``."""

    # -- commands -------------------------------------------------------------------------------------
    def execute(
        self,
        request: ExecRequest,
        on_output: OutputCallback | None = None,
        *,
        cancel: threading.Event | None = None,
    ) -> ExecResult:
        """Run ``request`` in the session's sandbox (see the engine's class docstring)."""
        argv = request_argv(request, self.name)
        self._refuse(request)
        started = time.monotonic()
        self._before_command(request, started)
        capture = OutputCapture(request.output_cap, on_output, keep_tail=request.truncate == "head_tail")
        refused: list[str] = []
        try:
            workspace = self._workspace
            if workspace is not None:
                workspace.before_command()
            outcome, oom_killed = self._run_command(request, argv, capture, started=started, cancel=cancel)
            workspace = self._workspace
            if workspace is not None:
                refused = workspace.after_command()
        except SandboxFailedError as exc:
            explained = self._explained(exc)
            if explained is exc:
                raise
            raise explained from exc
        streams = capture.finish()
        killed = outcome.timed_out or outcome.cancelled or oom_killed
        return ExecResult(
            stdout=streams["stdout"].text,
            stderr=streams["stderr"].text + refusal_note(refused),
            exit_code=None if killed else outcome.exit_code,
            timed_out=outcome.timed_out,
            oom_killed=oom_killed,
            cancelled=outcome.cancelled,
            stdout_truncated=streams["stdout"].truncated,
            stderr_truncated=streams["stderr"].truncated,
            duration_ms=int((time.monotonic() - started) * 1000),
        )

    # -- files ----------------------------------------------------------------------------------------
    @property
    def files(self) -> SandboxFiles:
        """File operations inside the sandbox, as the command user (:mod:`.files`; agent channel only)."""
        return SandboxFiles(self)

    def file_operation(
        self, request: dict[str, Any], data: bytes | None, *, deadline: float, max_output: int
    ) -> tuple[dict[str, Any], bytes]:
        """One FILE operation of the agent protocol, as the command user: the low level of :attr:`files`.

        Returns the RESULT body and the bytes sent before it. :class:`InvalidRequestError` when the
        session's commands do not travel over the agent channel (file operations need it).
        """
        self.start()
        transport = self._transport
        if transport is None:
            raise SandboxFailedError(self._GONE)
        if not isinstance(transport, AgentTransport):
            raise InvalidRequestError(self._NO_FILES)
        return transport.file_op(
            self._command_user(None), request, data, deadline=deadline, max_output=max_output
        )
