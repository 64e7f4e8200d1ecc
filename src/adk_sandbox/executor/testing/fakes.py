"""Fakes shipped with the library, for unit tests of code that drives a sandbox.

:class:`FakeBackend`, :class:`FakeSession` and :class:`FakeSessionFactory` run nothing: they answer every
request as scripted, stream and record it, and can raise. They report capabilities they **do not
enforce**. What each does, with an example: docs/GUIDE.md, "The workspace, the tools and the executor layer".
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Sequence

from adk_sandbox.executor.backend import ClosedOnExit, OutputCallback, SandboxBackend, SandboxSession
from adk_sandbox.executor.errors import SandboxFailedError
from adk_sandbox.executor.types import Capabilities, ExecRequest, ExecResult, IsolationClass, Language, Stream

__all__ = ["FakeBackend", "FakeSession", "FakeSessionFactory", "Respond", "container_capabilities"]

Respond = ExecResult | Callable[[ExecRequest], ExecResult]
"""What a fake answers: one result for every request, or a function of the request returning one."""


def container_capabilities(*languages: Language) -> Capabilities:
    """What a fully enforcing container backend reports (all of ``Language`` when none are given)."""
    return Capabilities(
        isolation=IsolationClass.CONTAINER,
        timeout=True,
        memory=True,
        cpu=True,
        pids=True,
        network=True,
        fs_read=True,
        fs_write=True,
        env=True,
        languages=languages or tuple(Language),
    )


class _Scripted:
    """The scripted answers, the record of requests and the reported capabilities a fake shares."""

    def __init__(
        self,
        respond: Respond | None = None,
        *,
        stdout: str = "",
        stderr: str = "",
        exit_code: int = 0,
        error: BaseException | None = None,
        capabilities: Capabilities | None = None,
        languages: Sequence[Language] = (),
    ) -> None:
        if respond is None:
            respond = ExecResult(stdout=stdout, stderr=stderr, exit_code=exit_code, duration_ms=1)
        self.respond: Respond = respond
        """The scripted answer (may be replaced between calls)."""
        self.error = error
        """Raised by every ``execute`` instead of answering, while set (broken infrastructure)."""
        self._capabilities = capabilities or container_capabilities(*languages)
        self.requests: list[ExecRequest] = []
        """Every request given to ``execute``, in order (also those answered by raising ``error``)."""
        self.threads: list[int] = []
        """The thread each request ran on (to check that callers keep blocking work off their loop)."""
        self.capabilities_asked = 0
        """How many times ``capabilities()`` was called (to check that a caller remembers the answer)."""
        self._lock = threading.Lock()

    def _reported(self) -> Capabilities:
        with self._lock:
            self.capabilities_asked += 1
        return self._capabilities

    def _answer(
        self, request: ExecRequest, on_output: OutputCallback | None, cancel: threading.Event | None
    ) -> ExecResult:
        with self._lock:
            self.requests.append(request)
            self.threads.append(threading.get_ident())
        if self.error is not None:
            raise self.error
        if cancel is not None and cancel.is_set():
            return ExecResult(stdout="", stderr="", exit_code=None, cancelled=True, duration_ms=0)
        respond = self.respond
        result = respond(request) if callable(respond) else respond
        if on_output is not None:
            streams: tuple[tuple[Stream, str], ...] = (("stdout", result.stdout), ("stderr", result.stderr))
            for stream, text in streams:
                for line in text.splitlines(keepends=True):
                    on_output(stream, line)
        return result


class FakeBackend(_Scripted, SandboxBackend):
    """Records requests and answers each with a scripted result; runs nothing.

    ``respond``: an ``ExecResult``, or a function of the request returning one; by default a result with
    ``stdout``/``stderr``/``exit_code``. ``error``: raised by every ``execute`` instead (broken
    infrastructure). ``capabilities``: what it reports (default :func:`container_capabilities` of
    ``languages``).
    """

    name = "fake"
    closed = False
    """True once :meth:`close` ran (a fake backend keeps answering after it, as a stateless one would)."""

    def capabilities(self) -> Capabilities:
        """The capabilities given at construction (not enforced: nothing runs); counted."""
        return self._reported()

    def execute(
        self,
        request: ExecRequest,
        on_output: OutputCallback | None = None,
        *,
        cancel: threading.Event | None = None,
    ) -> ExecResult:
        """Record ``request``; raise ``error`` if set; else stream and return the scripted result.

        Output goes to ``on_output`` line by line, stdout first, as a real backend's reader would deliver it.
        A ``cancel`` already set gives a cancelled result with no output, as if killed at once.
        """
        return self._answer(request, on_output, cancel)

    def close(self) -> None:
        """Mark the fake closed (``closed`` becomes True). Idempotent."""
        self.closed = True


class FakeSession(_Scripted, SandboxSession):
    """A session that runs nothing: answers as :class:`FakeBackend` does, with a real session's lifecycle.

    Like a Docker or Kubernetes session it has a :attr:`session_id` before it starts, is started by
    :meth:`start` (on entry, ``with factory.session() as s``, or by its first ``execute`` or
    ``capabilities``), and once :meth:`close` ran refuses every command with
    :class:`~adk_sandbox.executor.errors.SandboxFailedError`. ``start_error`` is raised by every start
    while it is set (a container that cannot start; clear it and the next start succeeds); the other
    arguments are :class:`FakeBackend`'s. ``workspace`` is what the session was opened for (None: none).
    """

    name = "fake-session"

    def __init__(
        self,
        respond: Respond | None = None,
        *,
        stdout: str = "",
        stderr: str = "",
        exit_code: int = 0,
        error: BaseException | None = None,
        start_error: BaseException | None = None,
        capabilities: Capabilities | None = None,
        languages: Sequence[Language] = (),
        workspace: str | os.PathLike[str] | None = None,
        session_id: str | None = None,
    ) -> None:
        super().__init__(
            respond,
            stdout=stdout,
            stderr=stderr,
            exit_code=exit_code,
            error=error,
            capabilities=capabilities,
            languages=languages,
        )
        self.start_error = start_error
        """Raised by :meth:`start` while set, leaving the session unstarted."""
        self.workspace = workspace
        """The workspace the session was opened for, as given (None: a session without one)."""
        self._session_id = session_id if session_id is not None else f"fake-{next(_NUMBERS)}"
        self.started = False
        """True once a :meth:`start` made the (pretend) sandbox."""
        self.start_calls = 0
        """How many times :meth:`start` was called (entering the session calls it once)."""
        self.close_calls = 0
        """How many times :meth:`close` was called (the first one closes; the rest do nothing)."""

    @property
    def session_id(self) -> str:
        """The id given at construction, else ``fake-N`` (unique in this process)."""
        return self._session_id

    def start(self) -> None:
        """Make the pretend sandbox (idempotent): ``start_error`` if set; once closed, SandboxFailedError."""
        with self._lock:
            self.start_calls += 1
            if self._closed:
                raise SandboxFailedError(f"this fake session ({self._session_id}) is closed")
            if self.started:
                return
            if self.start_error is not None:
                raise self.start_error
            self.started = True

    def capabilities(self) -> Capabilities:
        """Start the session (a real one reads what its sandbox enforces), then the given capabilities."""
        self.start()
        return self._reported()

    def execute(
        self,
        request: ExecRequest,
        on_output: OutputCallback | None = None,
        *,
        cancel: threading.Event | None = None,
    ) -> ExecResult:
        """Start the session (refused once closed, nothing recorded); then as :meth:`FakeBackend.execute`."""
        self.start()
        return self._answer(request, on_output, cancel)

    def close(self) -> None:
        """Close the session: :attr:`closed` becomes True and every later command is refused. Idempotent."""
        with self._lock:
            self.close_calls += 1
            self._closed = True


_NUMBERS = itertools.count()


class FakeSessionFactory(ClosedOnExit):
    """Opens :class:`FakeSession` s: a :class:`~adk_sandbox.executor.backend.SessionFactory` running nothing.

    Every session it opens answers with ``respond`` (or ``stdout``/``stderr``/``exit_code``), raises
    ``error`` from each ``execute`` and ``start_error`` from each start while those are set, and reports
    ``capabilities``; see :class:`FakeSession`. ``open_error``, while set, is raised by :meth:`session`
    itself (a backend that cannot open one; nothing is opened). Sessions get the ids ``fake-0``,
    ``fake-1``, ... in the order opened. It is not a :class:`~adk_sandbox.executor.backend.SandboxBackend`:
    only the protocol (``session(workspace=...)``) makes it usable, as for any third-party factory.
    """

    name = "fake-factory"

    def __init__(
        self,
        respond: Respond | None = None,
        *,
        stdout: str = "",
        stderr: str = "",
        exit_code: int = 0,
        error: BaseException | None = None,
        start_error: BaseException | None = None,
        open_error: BaseException | None = None,
        capabilities: Capabilities | None = None,
        languages: Sequence[Language] = (),
    ) -> None:
        if respond is None:
            respond = ExecResult(stdout=stdout, stderr=stderr, exit_code=exit_code, duration_ms=1)
        self.respond: Respond = respond
        """What each session answers (sessions opened later get the new value when it is replaced)."""
        self.error = error
        """Given to each session opened from now on as its ``error``."""
        self.start_error = start_error
        """Given to each session opened from now on as its ``start_error``."""
        self.open_error = open_error
        """Raised by :meth:`session` while set."""
        self._capabilities = capabilities or container_capabilities(*languages)
        self.opened: list[FakeSession] = []
        """Every session opened, in order (closed ones too)."""
        self.workspaces: list[str | os.PathLike[str] | None] = []
        """The ``workspace`` of every :meth:`session` call, in order (those refused by ``open_error`` too)."""
        self.closed = False
        """True once :meth:`close` ran."""
        self._lock = threading.Lock()

    def session(self, workspace: str | os.PathLike[str] | None = None) -> FakeSession:
        """Open a new (unstarted) :class:`FakeSession` bound to ``workspace``; ``open_error`` if set."""
        with self._lock:
            self.workspaces.append(workspace)
            if self.open_error is not None:
                raise self.open_error
            session = FakeSession(
                self.respond,
                error=self.error,
                start_error=self.start_error,
                capabilities=self._capabilities,
                workspace=workspace,
                session_id=f"fake-{len(self.opened)}",
            )
            self.opened.append(session)
        return session

    def sessions(self) -> tuple[FakeSession, ...]:
        """The sessions opened and not closed yet, in the order opened."""
        with self._lock:
            return tuple(session for session in self.opened if not session.closed)

    def session_by_id(self, session_id: str) -> FakeSession | None:
        """The open session whose :attr:`~FakeSession.session_id` is ``session_id``, if any."""
        return next((session for session in self.sessions() if session.session_id == session_id), None)

    def capabilities(self) -> Capabilities:
        """What its sessions report (not enforced: nothing runs)."""
        return self._capabilities

    def close(self) -> None:
        """Close every session still open (as a session backend's close does). Idempotent."""
        self.closed = True
        for session in self.sessions():
            session.close()
