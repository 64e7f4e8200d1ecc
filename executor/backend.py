"""The backend interfaces: :class:`SandboxBackend`, and :class:`SessionFactory` (opens sessions)."""

from __future__ import annotations

import logging
import os
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, Self, runtime_checkable

from executor.types import Capabilities, ExecRequest, ExecResult, IsolationClass, Stream

__all__ = ["OutputCallback", "OwnedSession", "SandboxBackend", "SessionFactory"]

log = logging.getLogger(__name__)

OutputCallback = Callable[[Stream, str], None]
"""``on_output(stream, chunk)``: called with whole lines as they arrive (from a reader thread)."""


class SandboxBackend(ABC):
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

    def close(self) -> None:  # noqa: B027 - optional hook; backends without resources need no cleanup
        """Release what the backend holds (containers, sessions). Idempotent."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@runtime_checkable
class SessionFactory(Protocol):
    """A backend that opens sessions: ``with factory.session(workspace=root) as session: ...``.

    A session is itself a :class:`SandboxBackend` (so a context manager): every command it runs shares
    one sandbox -- one filesystem, one container -- until it is closed, and with ``workspace`` given its
    commands run with that directory as their working directory, at the same absolute path as on the host.
    ``workspace=None`` opens a session with no workspace (the Rust pipeline's own scratch session).

    The factory's own ``execute``, where it has one, may run each call in a sandbox of its own (Docker: a
    throw-away container), which is why callers that need state to carry over from one command to the
    next (``Workspace``'s bash, ``RustExecutor``'s compile-then-run) open a session instead. ``DockerBackend``
    is one; ``isinstance(obj, SessionFactory)`` tells whether an object is (it checks that ``session``
    exists, not its signature).
    """

    def session(self, workspace: str | os.PathLike[str] | None = None) -> SandboxBackend:
        """Open a new session, bound to ``workspace`` when given; the caller closes it."""
        ...


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


if TYPE_CHECKING:  # checked by mypy, never run: the Docker backend is a SessionFactory as it is written
    from executor.backends.docker.backend import DockerBackend

    def _docker_backend_opens_sessions(backend: DockerBackend) -> SessionFactory:
        return backend
