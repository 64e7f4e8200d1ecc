r"""A fake backend shipped with the library, for unit tests of code that drives a sandbox.

:class:`FakeBackend` runs nothing. It answers every :class:`~adk_sandbox.executor.types.ExecRequest` with a
result you choose (a fixed :class:`~adk_sandbox.executor.types.ExecResult`, or a function of the request),
streams that result's output to ``on_output`` as a real backend would, records every request, and can play
broken infrastructure by raising. Use it to test an agent's tool handling without Docker::

    from adk_sandbox.executor.testing import FakeBackend
    from adk_sandbox.executor.tools import SandboxTool

    fake = FakeBackend(stdout="hello\n")
    assert SandboxTool(fake).run_sync({"language": "command", "code": "echo hello"})["stdout"] == "hello\n"
    assert fake.requests[0].code == "echo hello"

It reports the capabilities it is given; by default those of a fully enforcing container, **which it does
not enforce**: it is a stand-in for logic tests, never a sandbox.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from adk_sandbox.executor.backend import OutputCallback, SandboxBackend
from adk_sandbox.executor.types import Capabilities, ExecRequest, ExecResult, IsolationClass, Language, Stream

__all__ = ["FakeBackend", "container_capabilities"]


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


class FakeBackend(SandboxBackend):
    """Records requests and answers each with a scripted result; runs nothing.

    ``respond``: an ``ExecResult``, or a function of the request returning one; by default a result with
    ``stdout``/``stderr``/``exit_code``. ``error``: raised by every ``execute`` instead (broken
    infrastructure). ``capabilities``: what it reports (default :func:`container_capabilities`).
    """

    name = "fake"

    def __init__(
        self,
        respond: ExecResult | Callable[[ExecRequest], ExecResult] | None = None,
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
        self._respond = respond
        self.error = error
        self._capabilities = capabilities or container_capabilities(*languages)
        self.requests: list[ExecRequest] = []
        """Every request given to :meth:`execute`, in order (also those answered by raising)."""
        self.threads: list[int] = []
        """The thread each request ran on (to check that callers keep blocking work off their loop)."""
        self.closed = False
        self._lock = threading.Lock()

    def capabilities(self) -> Capabilities:
        """The capabilities given at construction (not enforced: nothing runs)."""
        return self._capabilities

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
        with self._lock:
            self.requests.append(request)
            self.threads.append(threading.get_ident())
        if self.error is not None:
            raise self.error
        if cancel is not None and cancel.is_set():
            return ExecResult(stdout="", stderr="", exit_code=None, cancelled=True, duration_ms=0)
        result = self._respond(request) if callable(self._respond) else self._respond
        if on_output is not None:
            streams: tuple[tuple[Stream, str], ...] = (("stdout", result.stdout), ("stderr", result.stderr))
            for stream, text in streams:
                for line in text.splitlines(keepends=True):
                    on_output(stream, line)
        return result

    def close(self) -> None:
        """Mark the fake closed (``closed`` becomes True). Idempotent."""
        self.closed = True
