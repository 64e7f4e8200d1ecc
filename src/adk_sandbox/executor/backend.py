"""The backend interfaces: :class:`SandboxBackend`, :class:`SessionFactory` (opens sessions).

Also the shared parts of the backends that open sessions: :class:`SandboxSession` (one sandbox for many
commands) and :class:`SessionBackend` (tracks the sessions it opened, runs a throw-away one for
``execute``, probes its capabilities once).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Generic, Protocol, Self, TypeVar, runtime_checkable

from adk_sandbox.executor.errors import InvalidRequestError
from adk_sandbox.executor.types import Capabilities, ExecRequest, ExecResult, IsolationClass, Stream

if TYPE_CHECKING:
    from adk_sandbox.executor.channel.files import SandboxFiles

__all__ = [
    "ClosedOnExit",
    "OutputCallback",
    "OwnedSession",
    "SandboxBackend",
    "SandboxSession",
    "SessionBackend",
    "SessionFactory",
    "check_one_source",
]

log = logging.getLogger(__name__)

OutputCallback = Callable[[Stream, str], None]
"""``on_output(stream, chunk)``: called with whole lines as they arrive (from a reader thread)."""


class ClosedOnExit:
    """A context manager whose ``with`` block ends with its :meth:`close`."""

    def close(self) -> None:
        """Release what it holds (a backend's containers, sessions). Idempotent."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class SandboxBackend(ClosedOnExit, ABC):
    """Runs :class:`ExecRequest` s and reports the isolation it really enforces.

    Backends are synchronous and thread-safe: several threads may call :meth:`execute` at once.
    """

    #: Short identifier of the backend ("process", "bwrap", "docker", ...).
    name: str

    @abstractmethod
    def capabilities(self) -> Capabilities:
        """What this backend enforces for every execution, as it is configured now."""

    def isolation(self) -> IsolationClass:
        """The isolation class this backend really enforces."""
        return self.capabilities().isolation

    @abstractmethod
    def execute(
        self,
        request: ExecRequest,
        on_output: OutputCallback | None = None,
        *,
        cancel: threading.Event | None = None,
    ) -> ExecResult:
        """Run ``request`` and return its result.

        ``on_output`` receives output line by line while it runs (only the part kept under the cap).
        Setting ``cancel`` from another thread kills the execution's whole process tree; the result then
        has ``cancelled=True`` and keeps the output produced so far.

        If ``on_output`` raises, the execution is stopped as by a cancel (its whole process tree is
        killed, a WASM module interrupted) and the callback's exception propagates to the caller: no
        result is returned and the callback is not called again. The same holds for any exception that
        reaches the calling thread while the execution runs (e.g. ``KeyboardInterrupt``): nothing the
        execution started keeps running behind it. Every backend behaves this way.
        """


@runtime_checkable
class SessionFactory(Protocol):
    """A backend that opens sessions: ``with factory.session(workspace=root) as session: ...``.

    A session is itself a :class:`SandboxBackend`: its commands share one sandbox until it is closed, and with
    ``workspace`` they run in that directory, at the same absolute path as on the host (``None``: no
    workspace). Callers that need state carried between commands open a session rather than call the
    factory's ``execute``. ``isinstance(obj, SessionFactory)`` checks only that ``session`` exists.
    Depth: docs/DESIGN.md, "Sessions: one protocol".
    """

    def session(self, workspace: str | os.PathLike[str] | None = None) -> SandboxSession:
        """Open a new session, bound to ``workspace`` when given; the caller closes it."""
        ...


class SandboxSession(SandboxBackend):
    """A session: one sandbox (a container, a Pod) that every command it runs shares, until :meth:`close`.

    What :meth:`SessionBackend.session` returns. The sandbox is made by :meth:`start` -- on entry
    (``with backend.session() as session``) or on first use -- and removed by :meth:`close`, after which
    the session refuses to run anything (:class:`~adk_sandbox.executor.errors.SandboxFailedError`).
    """

    _closed: bool = False
    """Set by :meth:`close` in a subclass (read through :attr:`closed`)."""

    @property
    @abstractmethod
    def session_id(self) -> str:
        """The session's id, known before its sandbox starts: the label its sandbox carries."""

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran: the sandbox is removed (or being removed) and no command runs."""
        return self._closed

    @abstractmethod
    def start(self) -> None:
        """Make the sandbox and verify it (idempotent); ``SandboxFailedError`` once the session is closed."""

    @property
    def files(self) -> SandboxFiles:
        """File operations inside the sandbox, as the command user (read, write, stat, list, remove...).

        Every session on the agent channel has them (the Docker and Kubernetes sessions: both are a
        ``ChannelSession``); a session that cannot offer them raises :class:`InvalidRequestError` here, so
        an adapter can take any :class:`SessionFactory` and ask.
        """
        raise InvalidRequestError(f"a {self.name} session has no file operations inside its sandbox")

    def __enter__(self) -> Self:
        self.start()
        return self


SessionT = TypeVar("SessionT", bound=SandboxSession)


class SessionBackend(SandboxBackend, Generic[SessionT]):
    """A backend whose every command runs in a :class:`SandboxSession` it opened (Docker, Kubernetes).

    It holds the sessions it opened until they close, so that :meth:`close` removes whatever a caller
    left open; :meth:`sessions` and :meth:`session_by_id` read them. :meth:`execute` runs each request in
    a throw-away session, and :meth:`capabilities` is probed once from a real session
    (:meth:`_probe_capabilities`). A subclass implements :meth:`session` (passing each new session to
    :meth:`_track`), and extends :meth:`close` for what else it holds.
    Thread-safe: sessions may be opened and closed from several threads at once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        """Guards the tracked sessions (and what a subclass keeps alongside them)."""
        self._sessions: set[SessionT] = set()
        self._capabilities: Capabilities | None = None

    @abstractmethod
    def session(self, workspace: str | os.PathLike[str] | None = None) -> SessionT:
        """Open a new session, bound to ``workspace`` when given; the caller closes it."""

    def _track(self, session: SessionT) -> SessionT:
        """Hold ``session`` until it closes (and :meth:`close` closes it if nobody did); returns it.

        Sessions closed meanwhile are dropped here, so a long-lived backend holds only about the open ones.
        """
        with self._lock:
            self._sessions = {held for held in self._sessions if not held.closed}
            self._sessions.add(session)
        return session

    def sessions(self) -> tuple[SessionT, ...]:
        """The sessions of this backend that are open now (a snapshot; in no particular order)."""
        with self._lock:
            self._sessions = {held for held in self._sessions if not held.closed}
            return tuple(self._sessions)

    def session_by_id(self, session_id: str) -> SessionT | None:
        """The open session of this backend whose :attr:`~SandboxSession.session_id` is ``session_id``."""
        return next((held for held in self.sessions() if held.session_id == session_id), None)

    def capabilities(self) -> Capabilities:
        """What a session of this backend enforces, read from a real one (probed once, then remembered)."""
        if self._capabilities is None:
            self._capabilities = self._probe_capabilities()
        return self._capabilities

    def _probe_capabilities(self) -> Capabilities:
        """Open a session, read what it enforces, close it (called once, by :meth:`capabilities`)."""
        with self.session() as probe:
            return probe.capabilities()

    def execute(
        self,
        request: ExecRequest,
        on_output: OutputCallback | None = None,
        *,
        cancel: threading.Event | None = None,
    ) -> ExecResult:
        """Run ``request`` in a throw-away session (a fresh sandbox, removed afterwards)."""
        with self.session() as session:
            return session.execute(request, on_output, cancel=cancel)

    def close(self) -> None:
        """Close every session of this backend still open (their sandboxes are removed). Idempotent."""
        with self._lock:
            sessions, self._sessions = list(self._sessions), set()
        for session in sessions:
            session.close()


def check_one_source(workspace: object, copy_of: object, snapshot: object) -> None:
    """Refuse a ``session()`` asked to start from two of ``workspace``, ``copy_of`` and ``snapshot``."""
    if snapshot is not None and (workspace is not None or copy_of is not None):
        raise InvalidRequestError(
            "give snapshot= (the session starts from what the snapshot kept) alone, not with workspace= or "
            "copy_of="
        )
    if copy_of is not None and workspace is not None:
        raise InvalidRequestError(
            "give workspace= (the session works in that directory) or copy_of= (it works in a copy of it), "
            "not both"
        )


class OwnedSession:
    """A session opened from a :class:`SessionFactory` for the lifetime of an owner (a tool, an executor).

    :meth:`close` closes it; so does the owner being garbage-collected or the interpreter exiting without
    a close (a finalizer), so a forgotten owner never leaks a container. The one place for this: the Rust
    executor and ``SandboxTool`` hold their sessions through it.
    """

    def __init__(self, owner: object, factory: SessionFactory, what: str) -> None:
        session = factory.session()
        if not isinstance(session, SandboxBackend):
            raise TypeError(f"{factory!r}.session() returned {session!r}, not a SandboxBackend")
        self.session: SandboxBackend = session
        """The session (a :class:`SandboxBackend`)."""
        self._finalizer = weakref.finalize(owner, _close_quietly, session, what)

    def close(self) -> None:
        """Close the session (idempotent)."""
        self._finalizer()


def _close_quietly(session: SandboxBackend, what: str) -> None:
    try:
        session.close()
    except Exception:  # also runs from a finalizer, where raising helps nobody
        log.warning("closing %s's sandbox session failed", what, exc_info=True)
