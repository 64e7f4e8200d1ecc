"""The interface every sandbox backend implements."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from types import TracebackType
from typing import Self

from executor.types import Capabilities, ExecRequest, ExecResult, IsolationClass, Stream

__all__ = ["OutputCallback", "SandboxBackend"]

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
