"""The conformance suite: what the README promises of every backend, as pytest tests any backend runs.

A backend's test module provides a ``conformance_target`` fixture (a :class:`ConformanceTarget`, with its
:class:`KnownDifference` list) and subclasses :class:`ConformanceSuite`; :data:`CHECKS` names every check.
See docs/BACKENDS.md, section "5. The conformance suite", for an example and the rules.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import random
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import pytest

from adk_sandbox.executor.backend import OutputCallback, SandboxBackend, SandboxSession, SessionFactory
from adk_sandbox.executor.errors import (
    BackendUnavailableError,
    InvalidRequestError,
    PolicyNotEnforceableError,
    SandboxFailedError,
)
from adk_sandbox.executor.network.policy import NetworkPolicy
from adk_sandbox.executor.testing import capability_table
from adk_sandbox.executor.testing._programs import Programs, programs_for
from adk_sandbox.executor.types import Capabilities, ExecRequest, ExecResult, Language, Stream

__all__ = ["CHECKS", "ConformanceSuite", "ConformanceTarget", "KnownDifference"]

#: Timeout of a command that should finish at once (a "does not hang" bound, not a timing).
_QUICK = 60.0
#: Timeout of the commands a timeout check kills, and how much later than it the result may come back.
_TIMEOUT = 1.0
_KILL_SLACK = 14.0
#: How long processes of a killed command may take to disappear.
_GONE_WITHIN = 2.0
#: Bytes that are no valid UTF-8, NULs and a newline: binary stdin must arrive unchanged.
_BINARY = b"a\0b\xff\xfe\0\n\x80end"
#: Shell metacharacters a program started from argv must receive as they are.
_HOSTILE = "$(id) ; `id` * && echo pwned | cat > y"


@dataclass(frozen=True)
class KnownDifference:
    """A check a target is known to fail, why, and (optionally) the error it fails with.

    ``raises``: the exception type(s) the check must fail with (e.g. ``PolicyNotEnforceableError`` for a
    request the backend refuses, ``AssertionError`` for a behaviour that differs); a failure with any
    other error is then a real failure. None: any failure is the known one.
    """

    reason: str
    raises: type[BaseException] | tuple[type[BaseException], ...] | None = None
    run: bool = True
    """False: the check is not run at all (reported as not run), for a difference that would break the
    shared sandbox or take long to show. Such a difference is not seen to go away: use it sparingly."""


@dataclass
class ConformanceTarget:
    """What the conformance suite runs against, and what it must know about it.

    ``sandbox``: a :class:`~adk_sandbox.executor.backend.SessionFactory` (one session is opened for the
    checks, and one more by the close check) or a plain
    :class:`~adk_sandbox.executor.backend.SandboxBackend` (used as given). The caller owns it (and closes
    it); the suite closes only the sessions it opened.
    """

    sandbox: SandboxBackend | SessionFactory
    known_differences: Mapping[str, str | KnownDifference] = field(default_factory=dict)
    """Checks this target fails, by name (see :data:`CHECKS`), with the reason (a string: any failure)."""
    workspace: str | os.PathLike[str] | None = None
    """Passed to ``sandbox.session(workspace=...)`` for the shared session (None: a session without one)."""
    processes: Literal["host", "inside"] = "inside"
    """Where the suite looks for processes a command left: ``"host"`` (this machine's ``/proc``: for
    backends running commands as host processes) or ``"inside"`` (another command in the same sandbox
    lists its ``/proc``)."""
    shell: bool = True
    """The target runs ``command`` requests (``sh -c``) with POSIX utilities; False (WASM) leaves out the
    checks that need one and runs the others with programs in the target's language."""
    scratch: str = "/tmp"
    """A directory, as commands see it, that the command user may write and that outlives one command
    (a marker written there by a command that should not have run is looked for by a later one)."""
    memory_limit_mb: int | None = None
    """The memory limit (MiB) the backend enforces; required when ``capabilities().memory`` is claimed (the
    check allocates twice as much, sending this value as the request's ``memory_limit_mb``)."""
    pids_limit: int | None = None
    """The process limit the backend enforces; required when ``capabilities().pids`` is claimed."""
    leftovers: Callable[[SandboxBackend], Sequence[str]] | None = None
    """For a closed session: what of it remains (containers, Pods, processes), as descriptions; the close
    check requires none. None: only the session's own state and, with ``processes="host"``, host
    processes are checked."""
    warm_pool: Callable[[], SandboxBackend] | None = None
    """Makes another backend of this engine with a warm pool of one session (closed by the suite), for the
    ``warm_pool`` check; a refusal it raises is the table's reason. None: the check does not run."""
    table: capability_table.TableColumn | None = None
    """The target's column of a capability table (docs/CAPABILITIES.md): the cells the checks record are
    compared with it by the last check (see :mod:`adk_sandbox.executor.testing.capability_table`)."""


class _Context:
    """The shared sandbox of a suite's checks and the ways to run in and look into it."""

    def __init__(
        self, target: ConformanceTarget, backend: SandboxBackend, capabilities: Capabilities, outside: Path
    ) -> None:
        self.target = target
        self.backend = backend
        self.capabilities = capabilities
        self.programs: Programs | None = programs_for(capabilities.languages)
        self.outside = outside
        """A host directory no policy of the target allows (the fs checks' secret and planted files)."""
        self.cells: dict[str, str] = {}
        """The capability table's cells the checks found (row -> ``✅`` or ``no: <reason>``)."""

    def record(self, row: str, reason: str | None = None) -> None:
        """Record the table's cell of ``row``: ``✅``, or ``no`` with ``reason``."""
        self.cells[row] = "✅" if reason is None else f"no: {reason}"

    def run(
        self,
        request: ExecRequest,
        on_output: OutputCallback | None = None,
        *,
        cancel: threading.Event | None = None,
        backend: SandboxBackend | None = None,
    ) -> ExecResult:
        """Run ``request``; a backend that does not come back in time fails the check instead of hanging it.

        ``execute`` runs in a thread of its own (left behind if it never returns); its exception is raised.
        """
        runner = backend or self.backend
        results: list[ExecResult] = []
        failures: list[BaseException] = []

        def execute() -> None:
            try:
                results.append(runner.execute(request, on_output, cancel=cancel))
            except BaseException as exc:  # raised again in the check's thread
                failures.append(exc)

        worker = threading.Thread(target=execute, name="adk-conformance-execute", daemon=True)
        worker.start()
        worker.join(request.timeout + _KILL_SLACK)
        if worker.is_alive():
            raise AssertionError(
                f"execute() did not come back within {_KILL_SLACK:.0f} s of the request's timeout "
                f"({request.timeout} s): the backend ignores the timeout, or hangs"
            )
        if failures:
            raise failures[0]
        return results[0]

    def sh(self, code: str, *, backend: SandboxBackend | None = None, **fields: Any) -> ExecResult:
        fields.setdefault("timeout", _QUICK)
        request = ExecRequest(language=Language.COMMAND, code=code, **fields)
        return self.run(request, backend=backend)

    def program(self, what: Callable[[Programs], str], **fields: Any) -> ExecRequest:
        """A request running the program ``what`` picks from the target's dialect."""
        programs = self.programs
        if programs is None:
            languages = ", ".join(language.value for language in self.capabilities.languages)
            raise AssertionError(
                f"the suite has programs in 'command' (a shell) and 'wasm' only; this target runs {languages}"
            )
        fields.setdefault("timeout", _QUICK)
        return ExecRequest(language=programs.language, code=what(programs), **fields)

    def survivors(self, marker: str, *, backend: SandboxBackend | None = None) -> list[str]:
        """The processes whose command line contains ``marker``, seen where the target says to look."""
        if self.target.processes == "host":
            return _host_processes_with(marker)
        half = len(marker) // 2
        # The halves are joined at run time: this command's own command line does not contain the marker.
        script = (
            f"a='{marker[:half]}'; b='{marker[half:]}'\n"
            "for d in /proc/[0-9]*; do\n"
            "  c=$(tr '\\000' ' ' < \"$d/cmdline\" 2>/dev/null) || continue\n"
            '  case "$c" in *"$a$b"*) echo "${d#/proc/} $c";; esac\n'
            "done\n"
            "true\n"
        )
        result = self.sh(script, backend=backend)
        _expect(result.exit_code == 0, f"listing the processes failed: {_shown(result)}")
        return result.stdout.splitlines()

    def expect_gone(self, *markers: str, what: str, backend: SandboxBackend | None = None) -> None:
        """Wait (bounded) until no process has any of ``markers``; else fail saying ``what`` they are.

        Survivors seen on the host are killed before failing, so a failed check leaves nothing behind.
        """
        deadline = time.monotonic() + _GONE_WITHIN
        while True:
            alive = [line for marker in markers for line in self.survivors(marker, backend=backend)]
            if not alive:
                return
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if self.target.processes == "host":
            for line in alive:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(line.split()[0]), signal.SIGKILL)
        raise AssertionError(f"{what} still running: {alive}")


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def _shown(result: ExecResult) -> str:
    return (
        f"exit {result.exit_code}, timed_out={result.timed_out}, cancelled={result.cancelled}, "
        f"oom_killed={result.oom_killed}, stdout={result.stdout[-400:]!r}, stderr={result.stderr[-400:]!r}"
    )


def _marker() -> str:
    """A sleep duration no other process uses: it marks a check's processes in ``/proc``."""
    return f"{300 + random.randint(1, 10**6) / 10**7:.7f}"  # noqa: S311 - a marker, not a secret


def live_host_processes(needle: bytes) -> dict[int, bytes]:
    """Live (non-zombie) processes of this machine whose NUL-separated command line contains ``needle``.

    The one ``/proc`` scan of the tests: the suite's leftover checks and the project's own tests use it.
    """
    found: dict[int, bytes] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read()
            with open(f"/proc/{entry}/stat", "rb") as handle:
                state = handle.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if needle in cmdline and state != b"Z":
            found[int(entry)] = cmdline
    return found


def _host_processes_with(marker: str) -> list[str]:
    """Live host processes whose command line contains ``marker``, as ``"pid command line"``."""
    found = live_host_processes(marker.encode())
    shown = {pid: cmdline.replace(b"\0", b" ").decode(errors="replace") for pid, cmdline in found.items()}
    return [f"{pid} {line}" for pid, line in shown.items()]


def _host_addresses() -> list[str]:
    """The IPv4 addresses of this machine a listener on 0.0.0.0 answers on (loopback, the primary one)."""
    found = {"127.0.0.1"}
    with contextlib.suppress(OSError):
        found.update(
            str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
        )
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # a documentation address: no packet is sent
        found.add(str(probe.getsockname()[0]))
    return sorted(found)


def _refused_or_ran(context: _Context, request: ExecRequest, marker: str) -> ExecResult:
    """Run ``request`` (which touches ``marker`` first); a refusal must have run nothing, and is raised."""
    try:
        return context.run(request)
    except (InvalidRequestError, PolicyNotEnforceableError):
        seen = context.sh(f"test -e {marker} && echo ran; true")
        _expect("ran" not in seen.stdout, f"the request was refused, yet it ran ({marker} exists)")
        raise


def _background(marker: str) -> ExecRequest:
    """A command leaving ``sleep <marker>`` running, asking (``background=True``) that it be kept."""
    return ExecRequest(
        language=Language.COMMAND,
        code=f"sleep {marker} >/dev/null 2>&1 & echo started",
        background=True,
        timeout=_QUICK,
    )


@dataclass(frozen=True)
class _Needs:
    """What a check needs of a target to apply."""

    sh: bool = False
    """A shell (``ConformanceTarget.shell``)."""
    claim: str | None = None
    """A field of ``Capabilities`` that must be True (the check tests that claim)."""
    session: bool = False
    files: bool = False

    def missing(self, context: _Context) -> str | None:
        """Why the check does not apply to ``context``'s target (None: it does)."""
        if self.sh and not context.target.shell:
            return "the target runs no shell (ConformanceTarget(shell=False))"
        if self.claim is not None and not getattr(context.capabilities, self.claim):
            return f"capabilities().{self.claim} is False: the backend does not claim it"
        if self.session and not isinstance(context.target.sandbox, SessionFactory):
            return "the target opens no sessions"
        if self.files:
            if not isinstance(context.backend, SandboxSession):
                return "the target opens no sessions (file operations are a session's)"
            try:
                context.backend.files  # noqa: B018 - asking is the check: a session without them refuses
            except InvalidRequestError as exc:
                return f"the session offers no file operations ({exc})"
        return None


_Check = TypeVar("_Check", bound=Callable[..., None])


def _check(
    *, sh: bool = False, claim: str | None = None, session: bool = False, files: bool = False
) -> Callable[[_Check], _Check]:
    """Mark a check with what it needs of a target to apply (see :class:`_Needs`)."""

    def mark(function: _Check) -> _Check:
        function._conformance_needs = _Needs(sh, claim, session, files)  # type: ignore[attr-defined]
        return function

    return mark


def _name_of(test_name: str) -> str:
    return test_name.removeprefix("test_")


def _read_until(terminal: Any, wanted: bytes, timeout: float = 30.0) -> bytes:
    """What a terminal showed until ``wanted`` (an AssertionError with what it showed if it never came)."""
    seen, deadline = b"", time.monotonic() + timeout
    while wanted not in seen:
        left = deadline - time.monotonic()
        try:
            piece = terminal.read(timeout=max(left, 0.001))
        except TimeoutError:
            piece = b""
        _expect(
            bool(piece) or (left > 0 and terminal.running), f"no {wanted!r} on the terminal: {seen[-300:]!r}"
        )
        seen += piece
    return seen


class ConformanceSuite:
    """The checks; subclass it as ``Test...`` in a module that provides a ``conformance_target`` fixture.

    Every check's name (its method name without ``test_``) is a key of :data:`CHECKS` and of
    :attr:`ConformanceTarget.known_differences`.
    """

    @pytest.fixture(scope="class")
    @classmethod
    def conformance(
        cls, conformance_target: ConformanceTarget, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[_Context]:
        """The shared sandbox: one session of a session factory (closed at the end), else the backend."""
        target = conformance_target
        outside = tmp_path_factory.mktemp("conformance-outside")
        with contextlib.ExitStack() as stack:
            sandbox = target.sandbox
            backend: SandboxBackend = (
                stack.enter_context(sandbox.session(workspace=target.workspace))
                if isinstance(sandbox, SessionFactory)
                else sandbox
            )
            yield _Context(target, backend, backend.capabilities(), outside)

    @pytest.fixture(autouse=True)
    def _known_difference(self, request: pytest.FixtureRequest, conformance: _Context) -> None:
        """Skip a check that does not apply; mark a listed one as a strict xfail (with its error)."""
        name = _name_of(getattr(request.node, "originalname", None) or request.node.name)
        needs: _Needs | None = getattr(request.function, "_conformance_needs", None)
        missing = needs.missing(conformance) if needs is not None else None
        listed = conformance.target.known_differences.get(name)
        if missing is not None:
            if listed is not None:
                pytest.fail(f"check {name!r} is a listed known difference but does not apply ({missing})")
            for row in _ROWS_OF_CHECK.get(name, ()):
                conformance.record(row, missing)
            pytest.skip(f"not applicable: {missing}")
        if listed is not None:
            difference = listed if isinstance(listed, KnownDifference) else KnownDifference(listed)
            request.node.add_marker(
                pytest.mark.xfail(
                    reason=f"known difference: {difference.reason}",
                    raises=difference.raises,
                    run=difference.run,
                    strict=True,
                )
            )

    # -- the list itself ------------------------------------------------------------------------------

    def test_known_differences_are_checks(self, conformance: _Context) -> None:
        """Every name in ``known_differences`` is a check of the suite."""
        unknown = sorted(set(conformance.target.known_differences) - set(CHECKS))
        _expect(not unknown, f"known_differences names no check: {unknown}; the checks are {sorted(CHECKS)}")

    # -- results --------------------------------------------------------------------------------------

    def test_capabilities(self, conformance: _Context) -> None:
        """``capabilities()`` is stable, agrees with ``isolation()``, and lists the target's languages."""
        capabilities = conformance.capabilities
        _expect(bool(capabilities.languages), "capabilities().languages is empty")
        _expect(
            conformance.backend.isolation() == capabilities.isolation,
            f"isolation() is {conformance.backend.isolation()!r}, capabilities(): {capabilities.isolation!r}",
        )
        _expect(
            conformance.backend.capabilities() == capabilities, "capabilities() changed between two calls"
        )
        if conformance.target.shell:
            _expect(
                Language.COMMAND in capabilities.languages,
                "the target has a shell (ConformanceTarget(shell=True)); capabilities() lists no 'command'",
            )

    @_check()
    def test_results(self, conformance: _Context) -> None:
        """stdout, stderr and a non-zero exit status come back as a result, never an exception."""
        failed = conformance.run(conformance.program(lambda p: p.results(3)))
        _expect(
            (failed.stdout, failed.stderr, failed.exit_code) == ("out\n", "err\n", 3),
            f"expected stdout 'out\\n', stderr 'err\\n', exit 3: {_shown(failed)}",
        )
        _expect(not failed.ok and failed.duration_ms >= 0, f"a failed command is not ok: {_shown(failed)}")
        _expect(
            not (failed.timed_out or failed.cancelled or failed.oom_killed),
            f"a plain exit is flagged as killed: {_shown(failed)}",
        )
        succeeded = conformance.run(conformance.program(lambda p: p.results(0)))
        _expect(succeeded.ok and succeeded.exit_code == 0, f"exit 0 is not ok: {_shown(succeeded)}")
        conformance.record("exec")

    @_check(claim="timeout")
    def test_timeout(self, conformance: _Context) -> None:
        """A timeout is a result (``timed_out``, no exit code) with the output so far; the tree is killed."""
        marker = _marker()
        started = time.monotonic()
        result = conformance.run(conformance.program(lambda p: p.hang(marker), timeout=_TIMEOUT))
        elapsed = time.monotonic() - started
        _expect(elapsed < _TIMEOUT + _KILL_SLACK, f"a {_TIMEOUT} s timeout came back after {elapsed:.1f} s")
        _expect(
            result.timed_out and result.exit_code is None and not result.cancelled,
            f"expected timed_out and no exit code: {_shown(result)}",
        )
        _expect(result.stdout == "started\n", f"the output before the timeout was not kept: {_shown(result)}")
        if conformance.target.shell:
            conformance.expect_gone(marker, what="processes of the timed-out command are")

    @_check(claim="timeout")
    def test_cancel(self, conformance: _Context) -> None:
        """Setting ``cancel`` kills the command's tree; the result is ``cancelled`` with the output so far."""
        marker = _marker()
        cancel = threading.Event()

        def on_output(stream: Stream, chunk: str) -> None:
            if "started" in chunk:
                cancel.set()

        started = time.monotonic()
        result = conformance.run(
            conformance.program(lambda p: p.hang(marker), timeout=30), on_output, cancel=cancel
        )
        elapsed = time.monotonic() - started
        _expect(
            cancel.is_set(), f"on_output never saw the first line while the command ran: {_shown(result)}"
        )
        _expect(elapsed < _KILL_SLACK, f"a cancelled command came back after {elapsed:.1f} s")
        _expect(
            result.cancelled and result.exit_code is None and not result.timed_out,
            f"expected cancelled and no exit code: {_shown(result)}",
        )
        _expect(result.stdout == "started\n", f"the output before the cancel was not kept: {_shown(result)}")
        if conformance.target.shell:
            conformance.expect_gone(marker, what="processes of the cancelled command are")

    @_check(sh=True, claim="timeout")
    def test_leftovers_die_at_exit(self, conformance: _Context) -> None:
        """What a command leaves running in the background dies when it exits."""
        marker = _marker()
        result = conformance.sh(f"(sleep {marker}) & (sleep {marker} &); sleep {marker} & echo done")
        _expect((result.exit_code, result.stdout) == (0, "done\n"), f"the command failed: {_shown(result)}")
        conformance.expect_gone(marker, what="background processes of a command that exited are")

    @_check(sh=True, claim="timeout")
    def test_escapees_die(self, conformance: _Context) -> None:
        """Processes that leave the command's session or process group (setsid, a double fork) die with it."""
        at_exit, at_timeout = _marker(), _marker()
        result = conformance.sh(
            # Their output goes elsewhere: a process holding the command's pipes is another matter.
            f"setsid sleep {at_exit} >/dev/null 2>&1 & "
            f"(setsid sh -c 'sleep {at_exit} &' >/dev/null 2>&1 &); sleep 0.2; echo done"
        )
        _expect((result.exit_code, result.stdout) == (0, "done\n"), f"the command failed: {_shown(result)}")
        killed = conformance.sh(
            f"setsid sleep {at_timeout} >/dev/null 2>&1 & echo started; sleep {at_timeout}", timeout=_TIMEOUT
        )
        _expect(killed.timed_out, f"expected a timeout: {_shown(killed)}")
        conformance.expect_gone(at_exit, at_timeout, what="processes that left the command's group are")

    # -- output ---------------------------------------------------------------------------------------

    @_check()
    def test_output_cap(self, conformance: _Context) -> None:
        """``max_output_bytes`` keeps that many bytes of a stream, flags it truncated, streams only those."""
        streamed: list[str] = []
        line = "0123456789\n"
        request = conformance.program(lambda p: p.output("", line, 200, ""), max_output_bytes=100)
        result = conformance.run(
            request, lambda stream, chunk: streamed.append(chunk) if stream == "stdout" else None
        )
        expected = (line * 200)[:100]
        _expect(result.exit_code == 0, f"the command failed: {_shown(result)}")
        _expect(
            result.stdout == expected and result.stdout_truncated,
            f"expected the first 100 bytes, truncated: {_shown(result)}, truncated={result.stdout_truncated}",
        )
        _expect(
            "".join(streamed) == expected, f"on_output got more or less than was kept: {''.join(streamed)!r}"
        )
        whole = conformance.run(
            conformance.program(lambda p: p.output("", line, 5, ""), max_output_bytes=100)
        )
        _expect(
            whole.stdout == line * 5 and not whole.stdout_truncated,
            f"output under the cap was cut: {_shown(whole)}",
        )

    @_check()
    def test_output_head_tail(self, conformance: _Context) -> None:
        """``truncate="head_tail"`` keeps the start and the end, with the omission between them."""
        head, line, tail = "start\n", "0123456789\n", "the end\n"
        whole = head + line * 200 + tail
        streamed: list[str] = []
        request = conformance.program(
            lambda p: p.output(head, line, 200, tail), max_output_bytes=64, truncate="head_tail"
        )
        result = conformance.run(
            request, lambda stream, chunk: streamed.append(chunk) if stream == "stdout" else None
        )
        omitted = len(whole) - 64
        expected = whole[:32] + f"\n[... {omitted} bytes omitted ...]\n" + whole[-32:]
        _expect(result.exit_code == 0, f"the command failed: {_shown(result)}")
        _expect(
            result.stdout == expected and result.stdout_truncated,
            f"expected {expected!r}, truncated: {_shown(result)}, truncated={result.stdout_truncated}",
        )
        _expect(
            "".join(streamed) == expected, f"on_output got other text than was kept: {''.join(streamed)!r}"
        )

    # -- requests -------------------------------------------------------------------------------------

    @_check()
    def test_stdin_bytes(self, conformance: _Context) -> None:
        """``stdin`` as bytes (NULs, invalid UTF-8) reaches the program unchanged."""
        result = conformance.run(conformance.program(lambda p: p.stdin_hex(), stdin=_BINARY))
        expected = " ".join(f"{byte:02x}" for byte in _BINARY)
        _expect(result.exit_code == 0, f"the command failed: {_shown(result)}")
        _expect(
            " ".join(result.stdout.split()) == expected, f"expected the bytes {expected}: {_shown(result)}"
        )

    @_check()
    def test_argv(self, conformance: _Context) -> None:
        """An ``argv`` program gets its arguments uninterpreted; a missing program is exit 127, a result."""
        result = conformance.run(ExecRequest(argv=("printf", "%s|", _HOSTILE, "*", "$HOME"), timeout=_QUICK))
        _expect(
            (result.exit_code, result.stdout) == (0, f"{_HOSTILE}|*|$HOME|"),
            f"the arguments did not arrive as given: {_shown(result)}",
        )
        missing = conformance.run(ExecRequest(argv=("adk-conformance-no-such-program",), timeout=_QUICK))
        _expect(missing.exit_code == 127, f"a missing program is not exit 127: {_shown(missing)}")

    @_check()
    def test_cwd(self, conformance: _Context) -> None:
        """``cwd`` is used for one call; a directory the command cannot enter is refused, nothing run."""
        marker = f"{conformance.target.scratch}/adk-conformance-{uuid.uuid4().hex[:12]}"
        missing = f"/adk-conformance-missing-{uuid.uuid4().hex[:12]}"
        touch = (
            ExecRequest(language=Language.COMMAND, code=f"touch {marker}", cwd=missing, timeout=_QUICK)
            if conformance.target.shell
            else conformance.program(lambda p: p.results(0), cwd=missing)
        )
        refused = False
        try:
            conformance.run(touch)
        except InvalidRequestError:
            refused = True
        _expect(refused, f"a missing cwd ({missing}) was not refused with InvalidRequestError")
        if conformance.target.shell:
            _expect(
                "ran" not in conformance.sh(f"test -e {marker} && echo ran; true").stdout, "it ran anyway"
            )
        default = conformance.run(conformance.program(lambda p: p.pwd()))
        moved = conformance.run(conformance.program(lambda p: p.pwd(), cwd="/usr"))
        _expect(moved.stdout == "/usr\n", f"cwd='/usr' was not the working directory: {_shown(moved)}")
        again = conformance.run(conformance.program(lambda p: p.pwd()))
        _expect(
            again.stdout != "/usr\n" and again.exit_code == default.exit_code == 0,
            f"the next call did not get the default working directory again: {_shown(again)}",
        )

    @_check(sh=True)
    def test_user_self(self, conformance: _Context) -> None:
        """A request naming the user commands run as by default (``uid`` or ``uid:gid``) runs as that user."""
        default = conformance.sh("id -u; id -g")
        uid, gid = default.stdout.split()
        for user in (uid, f"{uid}:{gid}"):
            result = conformance.sh("id -u", user=user)
            _expect(result.stdout == f"{uid}\n", f"user={user!r} ran as someone else: {_shown(result)}")

    @_check()
    def test_user_other(self, conformance: _Context) -> None:
        """A request's ``user`` (another uid:gid) runs the command as that user."""
        other = "4321"
        if not conformance.target.shell:
            result = conformance.run(conformance.program(lambda p: p.whoami(), user=f"{other}:{other}"))
        else:
            if conformance.sh("id -u").stdout.strip() == other:
                other = "4322"
            marker = f"{conformance.target.scratch}/adk-conformance-{uuid.uuid4().hex[:12]}"
            request = ExecRequest(  # in the scratch directory: the default one may be closed to others
                language=Language.COMMAND,
                code=f"touch {marker}; id -u; id -g",
                user=f"{other}:{other}",
                cwd=conformance.target.scratch,
                timeout=_QUICK,
            )
            result = _refused_or_ran(conformance, request, marker)
        _expect(result.stdout.split() == [other, other], f"expected uid and gid {other}: {_shown(result)}")

    @_check(sh=True, claim="env")
    def test_env_cleared(self, conformance: _Context, monkeypatch: pytest.MonkeyPatch) -> None:
        """A host variable does not reach the command; the request's ``env`` does."""
        secret = uuid.uuid4().hex
        monkeypatch.setenv("ADK_CONFORMANCE_HOST_SECRET", secret)
        result = conformance.sh("env", env={"ADK_CONFORMANCE_GIVEN": "given"})
        _expect(result.exit_code == 0, f"env failed: {_shown(result)}")
        _expect(secret not in result.stdout, "a host variable reached the command")
        _expect(
            "ADK_CONFORMANCE_GIVEN=given" in result.stdout.splitlines(), "the request's env did not arrive"
        )

    @_check()
    def test_background(self, conformance: _Context) -> None:
        """``background=True`` keeps what the command leaves running, or is refused with nothing run.

        Refused means ``InvalidRequestError``; never accepted and then killed at the command's exit. A
        target without a shell is asked with a program of its language (refused, or run).
        """
        marker = _marker()
        shell = conformance.target.shell
        request = (
            _background(marker) if shell else conformance.program(lambda p: p.results(0), background=True)
        )
        try:
            result = conformance.run(request)
        except InvalidRequestError as exc:
            if shell:
                alive = conformance.survivors(marker)
                _expect(not alive, f"background=True was refused, yet the command ran: {alive}")
            conformance.record("background", str(exc))
            return
        if not shell:
            _expect(result.exit_code == 0, f"the program failed: {_shown(result)}")
            conformance.record("background")
            return
        _expect(result.stdout == "started\n", f"the command failed: {_shown(result)}")
        time.sleep(0.5)  # what is killed at a command's exit is gone by now
        _expect(
            bool(conformance.survivors(marker)),
            "background=True was accepted, but what the command left running was killed at its exit",
        )
        conformance.record("background")

    # -- files ----------------------------------------------------------------------------------------

    @_check(files=True)
    def test_files(self, conformance: _Context) -> None:
        """``session.files`` writes, reads, stats, lists, renames and removes what commands see.

        ``files`` is used with the surface of the Docker session's ``SandboxFiles`` (``write_bytes``,
        ``read_bytes``, ``stat``, ``list_dir``, ``rename``, ``remove``).
        """
        assert isinstance(conformance.backend, SandboxSession)  # noqa: S101 - applies to sessions only
        files = conformance.backend.files
        directory = conformance.target.scratch
        name = f"adk-conformance-{uuid.uuid4().hex[:12]}"
        path, renamed = f"{directory}/{name}.bin", f"{directory}/{name}.moved"
        written = files.write_bytes(path, _BINARY)
        _expect(written == len(_BINARY), f"write_bytes said {written} bytes, not {len(_BINARY)}")
        _expect(files.read_bytes(path) == _BINARY, "read_bytes did not return what was written")
        status = files.stat(path)
        _expect((status.type, status.size) == ("file", len(_BINARY)), f"stat says {status}")
        _expect(name.encode() + b".bin" in [entry.name for entry in files.list_dir(directory)], "not listed")
        if conformance.target.shell:
            seen = conformance.sh(f"od -An -v -tx1 {path}")
            expected = " ".join(f"{byte:02x}" for byte in _BINARY)
            _expect(" ".join(seen.stdout.split()) == expected, f"a command sees other bytes: {_shown(seen)}")
        files.rename(path, renamed)
        _expect(files.read_bytes(renamed) == _BINARY, "the renamed file lost its content")
        files.remove(renamed)
        gone = False
        try:
            files.stat(renamed)
        except FileNotFoundError:
            gone = True
        _expect(gone, "a removed file is still there (stat did not raise FileNotFoundError)")
        conformance.record("files")

    # -- what capabilities() claims is enforced --------------------------------------------------------

    @_check(sh=True, claim="network")
    def test_network_denied(self, conformance: _Context) -> None:
        """Network denied: no connection reaches this machine's listener, on any of its addresses."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
            listener.bind(("0.0.0.0", 0))  # noqa: S104 - the command must not reach any of them
            listener.listen(16)
            port = listener.getsockname()[1]
            reachable = []
            for address in _host_addresses():  # the control: from here, each one answers
                with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=2):
                    reachable.append(address)
            probe = (
                "import socket, sys\n"
                "for a in sys.argv[2:]:\n"
                "    try:\n"
                "        socket.create_connection((a, int(sys.argv[1])), timeout=2).close()\n"
                "        print('open', a)\n"
                "    except OSError as e:\n"
                "        print('closed', a, e.errno)\n"
            )
            script = (
                'if command -v python3 >/dev/null 2>&1; then python3 -c "$0" "$@"; '
                "else echo no-python3; tail -n +2 /proc/net/route; fi"
            )
            result = conformance.run(
                ExecRequest(argv=("sh", "-c", script, probe, str(port), *reachable), timeout=_QUICK)
            )
        _expect(reachable != [], "this machine's own listener answers on none of its addresses")
        _expect("open" not in result.stdout.split(), f"the command reached this machine: {_shown(result)}")
        if "no-python3" in result.stdout:
            routes = result.stdout.split("no-python3", 1)[1].split()
            _expect(
                routes == [], f"no python3 to try a connection, and the route table is not empty: {routes}"
            )
        else:
            _expect(
                result.stdout.count("closed") == len(reachable),
                f"the connection attempts failed: {_shown(result)}",
            )

    @_check(claim="memory")
    def test_memory_limit(self, conformance: _Context) -> None:
        """Memory limited: an allocation of twice the limit is killed, and reported as ``oom_killed``."""
        limit = conformance.target.memory_limit_mb
        if limit is None:
            raise AssertionError(
                "memory is claimed: ConformanceTarget(memory_limit_mb=...) must give the limit"
            )
        request = conformance.program(lambda p: p.allocate(2 * limit), memory_limit_mb=limit, timeout=5)
        result = conformance.run(request)
        _expect("survived" not in result.stdout, f"{2 * limit} MiB were allocated under a {limit} MiB limit")
        _expect(
            result.oom_killed and result.exit_code is None,
            f"expected oom_killed, no exit code: {_shown(result)}",
        )
        after = conformance.run(conformance.program(lambda p: p.results(0)))
        _expect(
            after.ok and not after.oom_killed, f"the sandbox did not work after the OOM kill: {_shown(after)}"
        )

    @_check(sh=True, claim="pids")
    def test_pids_limit(self, conformance: _Context) -> None:
        """Processes limited: starting more processes than the limit fails, and the sandbox works after."""
        limit = conformance.target.pids_limit
        if limit is None:
            raise AssertionError("pids is claimed: ConformanceTarget(pids_limit=...) must give the limit")
        marker = _marker()
        wanted = limit + 16
        result = conformance.sh(
            f"i=0; while [ $i -lt {wanted} ]; do sleep {marker} & i=$((i+1)); done; echo spawned $i",
            timeout=30,
        )
        _expect(f"spawned {wanted}" not in result.stdout, f"{wanted} processes ran under a limit of {limit}")
        conformance.expect_gone(marker, what="processes of the command are")
        after = conformance.sh("echo alive")
        _expect(after.stdout == "alive\n", f"the sandbox did not work after: {_shown(after)}")

    @_check(sh=True, claim="fs_read")
    def test_fs_read_confined(self, conformance: _Context) -> None:
        """Reads confined: a host file no policy allows cannot be read or listed."""
        secret = uuid.uuid4().hex
        (conformance.outside / "secret.txt").write_text(secret + "\n")
        result = conformance.sh(f"cat {conformance.outside}/secret.txt; ls {conformance.outside}; true")
        _expect(secret not in result.stdout, "a host file outside the policy was read")
        _expect("secret.txt" not in result.stdout, "a host directory outside the policy was listed")

    @_check(sh=True, claim="fs_write")
    def test_fs_write_confined(self, conformance: _Context) -> None:
        """Writes confined: a host directory or file no policy allows is left unchanged."""
        outside = conformance.outside
        kept = outside / "kept.txt"
        kept.write_text("unchanged\n")
        planted = outside / f"planted-{uuid.uuid4().hex[:12]}"
        conformance.sh(f"echo pwned > {planted}; echo pwned > {kept}; rm -f {kept}; true")
        _expect(not planted.exists(), f"the command created {planted} on the host")
        _expect(kept.exists() and kept.read_text() == "unchanged\n", f"the command changed or removed {kept}")

    # -- what a sandbox offers besides commands (the capability table's rows) ---------------------------

    @_check()
    def test_egress(self, conformance: _Context) -> None:
        """A ``NetworkPolicy`` is in force, or ``set_network`` sets one, or refuses it and nothing changed.

        A policy set is taken away again with ``set_network(False)``; a refusal is a
        ``PolicyNotEnforceableError``.
        """
        backend = conformance.backend
        if conformance.capabilities.network_policy is not None:
            conformance.record("egress")
            return
        set_network = getattr(backend, "set_network", None)
        if set_network is None:
            conformance.record(
                "egress",
                f"{type(backend).__name__} takes no NetworkPolicy: capabilities().network_policy is None "
                "and there is no set_network",
            )
            return
        policy = NetworkPolicy(allow=("adk-conformance.invalid",))
        try:
            set_network(policy)
        except PolicyNotEnforceableError as exc:
            _expect(backend.capabilities().network_policy is None, "set_network was refused, yet took effect")
            conformance.record("egress", str(exc))
            return
        try:
            in_force = backend.capabilities().network_policy
            _expect(in_force == policy, f"set_network(policy) was accepted; capabilities() says {in_force}")
        finally:
            set_network(False)
        _expect(backend.capabilities().network_policy is None, "set_network(False) left a policy in force")
        conformance.record("egress")

    @_check()
    def test_snapshot_fork(self, conformance: _Context) -> None:
        """``fork()`` starts a session holding a file written before; what it writes stays its own.

        Applies where ``capabilities().snapshots`` has ``"files"``; elsewhere that is the table's reason.
        """
        snapshots = conformance.capabilities.snapshots
        if "files" not in snapshots:
            reason = f"capabilities().snapshots is {snapshots!r}: the backend does not snapshot sessions"
            conformance.record("snapshot", reason)
            conformance.record("fork", reason)
            return
        fork = getattr(conformance.backend, "fork", None)
        _expect(callable(fork), "capabilities().snapshots has 'files', yet the session has no fork()")
        _expect(conformance.target.shell, "a target that snapshots is expected to run a shell")
        name = f"{conformance.target.scratch}/adk-conformance-{uuid.uuid4().hex[:12]}"
        made = conformance.sh(f"echo parent > {name}")
        _expect(made.exit_code == 0, f"writing {name} failed: {_shown(made)}")
        assert fork is not None  # noqa: S101 - for the type checker: _expect above
        with fork() as child:
            conformance.record("snapshot")
            seen = conformance.sh(f"cat {name}; echo child > {name}.child", backend=child)
            _expect(seen.stdout == "parent\n", f"the fork does not hold its parent's file: {_shown(seen)}")
        after = conformance.sh(f"test -e {name}.child && echo reached; rm -f {name}; true")
        _expect("reached" not in after.stdout, "what the fork wrote reached its parent")
        conformance.record("fork")

    @_check(session=True, sh=True)
    def test_processes_in_snapshots(self, conformance: _Context) -> None:
        """``fork(processes=True)``: a program started before runs on in the fork, from its own memory.

        A program kept by ``background=True`` holds a random token in its memory and writes it to a file
        every 100 ms; in the fork the file is removed and comes back with the same token (the program runs
        there, its memory copied); what the fork writes does not reach its parent. A backend whose
        ``fork`` takes no ``processes``, or that refuses it, gives the table its reason.
        """
        row = "processes in snapshots"
        fork = getattr(conformance.backend, "fork", None)
        if fork is None or "processes" not in inspect.signature(fork).parameters:
            conformance.record(row, "fork() carries the files only: no checkpoint of processes here")
            return
        name = f"/tmp/adk-processes-{_marker()}"
        random_hex = "od -An -N8 -tx8 /dev/urandom | tr -dc 0-9a-f"
        program = f"t=$({random_hex}); while :; do echo $t > {name}; sleep 0.1; done"
        try:
            started = conformance.sh(f"sh -c '{program}' >/dev/null 2>&1 & echo $!", background=True)
        except (PolicyNotEnforceableError, InvalidRequestError) as exc:
            conformance.record(row, str(exc))
            return
        _expect(started.exit_code == 0, f"the program did not start: {_shown(started)}")
        try:
            time.sleep(0.5)
            token = conformance.sh(f"cat {name}").stdout.strip()
            _expect(len(token) == 16, f"the program wrote no token: {token!r}")
            try:
                child = fork(processes=True)
            except (PolicyNotEnforceableError, InvalidRequestError) as exc:
                conformance.record(row, str(exc))
                return
            with child:
                again = conformance.sh(
                    f"rm -f {name}; sleep 0.5; cat {name}; touch {name}.child", backend=child
                )
                _expect(again.stdout.strip() == token, f"the fork's program did not run on: {_shown(again)}")
            after = conformance.sh(f"test -e {name}.child && echo reached; true")
            _expect("reached" not in after.stdout, "what the fork wrote reached its parent")
        finally:
            conformance.sh(f"kill {started.stdout.strip() or 0} 2>/dev/null; rm -f {name}*; true")
        conformance.record(row)

    @_check(session=True, sh=True)
    def test_pause(self, conformance: _Context) -> None:
        """``pause(keep_memory=True)`` stops the sandbox's processes where they are; a command resumes it.

        A counter kept by ``background=True`` ticks every 50 ms: while paused for two seconds it moves by
        less than a third of what it would; the next command resumes the session (``paused`` says so) and
        the counter runs again. A refusal of ``pause`` (or of keeping the counter) is the table's reason.
        """
        session = conformance.backend
        pause = getattr(session, "pause", None)
        if pause is None:
            conformance.record("pause", f"{type(session).__name__} has no pause(): nothing to freeze")
            return
        name = f"/tmp/adk-pause-{_marker()}"
        counter = f"i=0; while :; do i=$((i+1)); echo $i > {name}; sleep 0.05; done"
        try:
            started = conformance.sh(f"sh -c '{counter}' >/dev/null 2>&1 & echo $!", background=True)
        except (PolicyNotEnforceableError, InvalidRequestError) as exc:
            conformance.record("pause", str(exc))
            return
        _expect(started.exit_code == 0, f"the counter did not start: {_shown(started)}")

        def count() -> int:
            seen = conformance.sh(f"cat {name} 2>/dev/null || echo 0")
            return int(seen.stdout.strip() or 0)

        try:
            time.sleep(0.3)
            before = count()
            try:
                pause(keep_memory=True)
            except (PolicyNotEnforceableError, InvalidRequestError) as exc:
                conformance.record("pause", str(exc))
                return
            _expect(bool(getattr(session, "paused", False)), "pause() returned but paused is not True")
            # 40 ticks if it ran. What runs between `before` and the freeze, and between the resume and
            # the read, counts too (a few hundred ms on a loaded machine): under a third of 40 is paused.
            time.sleep(2.0)
            during = count() - before  # this command resumes the session first
            _expect(not getattr(session, "paused", True), "a command did not resume the paused session")
            _expect(during < 14, f"the counter moved {during} ticks while the session was paused")
            time.sleep(0.3)
            _expect(count() > before + during, "the counter did not run again after the session resumed")
        finally:
            conformance.sh(f"kill {started.stdout.strip() or 0} 2>/dev/null; rm -f {name}; true")
        conformance.record("pause")

    @_check()
    def test_ports(self, conformance: _Context) -> None:
        """``publish(port)`` gives a host address reaching a server on the sandbox's loopback; then refuses.

        The server is a command (python3) that answers one connection with a token; the host connects to
        the published address until the token comes. After ``unpublish`` the address refuses. A backend
        without ``publish`` (or refusing it) gives the table's reason.
        """
        backend = conformance.backend
        publish = getattr(backend, "publish", None)
        if publish is None:
            conformance.record(
                "ports", f"{type(backend).__name__} has no publish(): no agent channel to carry one"
            )
            return
        if Language.PYTHON not in conformance.capabilities.languages:
            pytest.skip("no python3 inside to serve a port")
        port, token = random.randint(20000, 29999), uuid.uuid4().hex  # noqa: S311 - a port, not a secret
        server = (
            "import socket, sys\ns = socket.socket()\ns.bind(('127.0.0.1', int(sys.argv[1])))\ns.listen(1)\n"
            "c, _ = s.accept()\nc.sendall(sys.argv[2].encode())\nc.close()\n"
        )
        served: list[ExecResult] = []
        thread = threading.Thread(
            target=lambda: served.append(
                conformance.run(ExecRequest(argv=("python3", "-c", server, str(port), token), timeout=30))
            ),
            daemon=True,
        )
        try:
            address = publish(port)
        except (PolicyNotEnforceableError, InvalidRequestError) as exc:
            conformance.record("ports", str(exc))
            return
        host, _, number = str(address).rpartition(":")
        _expect(host == "127.0.0.1", f"publish gave {address}, not an address on the host's loopback")
        thread.start()
        received, deadline = b"", time.monotonic() + 30
        while not received and time.monotonic() < deadline:  # until the server listens inside
            with (
                contextlib.suppress(OSError),
                socket.create_connection((host, int(number)), timeout=5) as client,
            ):
                received = client.recv(100)
            if not received:
                time.sleep(0.1)
        thread.join(35)
        _expect(
            received == token.encode(), f"the published address gave {received!r}, not the server's token"
        )
        getattr(backend, "unpublish")(port)  # noqa: B009 - a session that publishes has it
        with pytest.raises(OSError):
            socket.create_connection((host, int(number)), timeout=5).close()
        conformance.record("ports")

    @_check()
    def test_pty(self, conformance: _Context) -> None:
        """``open_pty`` gives a shell on a terminal of the asked size: resized, Ctrl-C, its exit status.

        Driven by keystrokes as a person would: ``stty size`` shows the size given and, after ``resize``,
        the new one; Ctrl-C (byte 3) interrupts a ``sleep`` and the shell lives; ``exit 7`` ends it with
        status 7. A backend without ``open_pty`` (or refusing it) gives the table's reason.
        """
        open_pty = getattr(conformance.backend, "open_pty", None)
        if open_pty is None:
            conformance.record(
                "pty",
                f"{type(conformance.backend).__name__} has no open_pty(): no agent channel to carry one",
            )
            return
        try:
            terminal = open_pty(["/bin/sh", "-i"], rows=33, cols=101, env={"PS1": "ready$ "})
        except (PolicyNotEnforceableError, InvalidRequestError) as exc:
            conformance.record("pty", str(exc))
            return
        with terminal:
            seen = _read_until(terminal, b"ready$ ")
            terminal.write(b"stty size\n")
            seen = _read_until(terminal, b"33 101")
            terminal.resize(40, 120)
            terminal.write(b"stty size\n")
            seen = _read_until(terminal, b"40 120")
            # Quoted in the command, so its echo never holds the word its output does.
            terminal.write(b"sleep 60; echo sl''ept\n")
            time.sleep(0.5)
            terminal.write(b"\x03")
            # An empty line first: gVisor's terminal (before google/gvisor#12786) also leaves the ^C in the
            # shell's input, which would spoil the next command (docs/terminals.md).
            terminal.write(b"\necho al''ive\n")
            seen = _read_until(terminal, b"alive")
            _expect(b"slept" not in seen, f"Ctrl-C did not interrupt the sleep: {seen[-300:]!r}")
            terminal.write(b"exit 7\n")
            _expect(terminal.wait(30) == 7, f"the shell ended with {terminal.exit_code}, not 7")
        conformance.record("pty")

    @_check(session=True)
    def test_warm_pool(self, conformance: _Context) -> None:
        """A backend made with a warm pool gives a session that runs a command, or refuses when asked.

        The backend is made by ``ConformanceTarget.warm_pool``; a refusal when it is made or asked for a
        session is the table's reason.
        """
        make = conformance.target.warm_pool
        if make is None:
            pytest.skip("the target gives no warm_pool to make")
        refusals = (PolicyNotEnforceableError, InvalidRequestError, BackendUnavailableError)
        try:
            pooled = make()
        except refusals as exc:
            conformance.record("pool", str(exc))
            return
        with pooled:
            _expect(isinstance(pooled, SessionFactory), "warm_pool() made a backend that opens no sessions")
            assert isinstance(pooled, SessionFactory)  # noqa: S101 - for the type checker: _expect above
            try:
                session = pooled.session()
            except refusals as exc:
                conformance.record("pool", str(exc))
                return
            with session:
                result = conformance.run(conformance.program(lambda p: p.results(0)), backend=session)
            _expect(result.exit_code == 0, f"a command in a pooled session failed: {_shown(result)}")
        conformance.record("pool")

    # -- close ----------------------------------------------------------------------------------------

    @_check(session=True)
    def test_close_leaves_nothing(self, conformance: _Context) -> None:
        """A closed session refuses commands, is no longer tracked, and nothing of it remains."""
        factory = conformance.target.sandbox
        if not isinstance(factory, SessionFactory):  # pragma: no cover - the check applies to factories only
            raise TypeError(f"{factory!r} opens no sessions")
        marker = _marker()
        session = factory.session()
        with session:
            if conformance.target.shell:  # something to kill: what background=True keeps, where it does
                try:
                    started = session.execute(_background(marker))
                except InvalidRequestError:
                    started = conformance.sh("true", backend=session)
            else:
                started = conformance.run(conformance.program(lambda p: p.results(0)), backend=session)
            _expect(started.exit_code == 0, f"a command in a fresh session failed: {_shown(started)}")
        if isinstance(session, SandboxSession):
            _expect(session.closed, "the session does not say it is closed")
        refused = False
        try:
            session.execute(ExecRequest(language=Language.COMMAND, code="true", timeout=_QUICK))
        except SandboxFailedError:
            refused = True
        _expect(
            refused,
            "a closed session ran a command (or refused it with another error than SandboxFailedError)",
        )
        find = getattr(factory, "session_by_id", None)
        session_id = getattr(session, "session_id", None)
        if callable(find) and session_id is not None:
            _expect(find(session_id) is None, f"the factory still tracks the closed session {session_id}")
        if conformance.target.leftovers is not None:
            left = list(conformance.target.leftovers(session))
            _expect(not left, f"left after close: {left}")
        if conformance.target.processes == "host":
            conformance.expect_gone(marker, what="processes of the closed session are")

    # -- last: the capability table ------------------------------------------------------------------

    def test_capability_table(self, conformance: _Context) -> None:
        """The target's column of its capability table (``ConformanceTarget.table``) is what was found."""
        column = conformance.target.table
        if column is None:
            pytest.skip("the target names no column of a capability table")
        cells = {**dict.fromkeys(capability_table.FUTURE_ROWS, capability_table.NOT_YET), **conformance.cells}
        if capability_table.writing():
            capability_table.write_column(column, cells)
            return
        found = capability_table.differences(column, cells)
        _expect(not found, f"{column.path} differs: {found}; made again with: {capability_table.COMMAND}")


#: The capability table's rows a check records, also when it does not apply (with the reason it does not).
_ROWS_OF_CHECK: dict[str, tuple[str, ...]] = {
    "results": ("exec",),
    "files": ("files",),
    "background": ("background",),
    "warm_pool": ("pool",),
    "pause": ("pause",),
    "processes_in_snapshots": ("processes in snapshots",),
}


CHECKS: dict[str, str] = {
    _name_of(name): (function.__doc__ or "").strip().splitlines()[0]
    for name, function in vars(ConformanceSuite).items()
    if name.startswith("test_")
}
"""Every check of :class:`ConformanceSuite` by name (the keys of ``known_differences``): what it checks."""
