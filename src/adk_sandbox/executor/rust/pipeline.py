"""RustExecutor: validate → check → build → run a Rust snippet through any SandboxBackend.

:class:`RustExecutor` runs every step as a shell script through ``backend.execute`` (check and build are
one rustc process, each stage with its own limit); :class:`RustExecutorConfig` configures it and
:class:`RustResult` is its outcome. See docs/RUST_AND_WASM.md, section "RustExecutor".
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shlex
import shutil
import tempfile
import threading
import time
import uuid
import weakref
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field

from adk_sandbox.executor.backend import ClosedOnExit, OwnedSession, SandboxBackend, SessionFactory
from adk_sandbox.executor.errors import InvalidRequestError
from adk_sandbox.executor.rust.diagnostics import (
    CompilerOutput,
    Diagnostic,
    is_metadata_notice,
    parse_compiler_output,
)
from adk_sandbox.executor.rust.harness import SOURCE_FILE, validation_error, wrap_in_harness
from adk_sandbox.executor.rust.host import BUILD_DEPS_SCRIPT, host_rust
from adk_sandbox.executor.types import Capabilities, ExecRequest, ExecResult, Language, Stream

__all__ = [
    "CONTAINER_DEPS_DIR",
    "CONTAINER_WORK_DIR",
    "DEFAULT_RUSTC_ARGS",
    "RustExecutor",
    "RustExecutorConfig",
    "RustResult",
    "RustStage",
    "RustStatus",
]

CONTAINER_DEPS_DIR = "/opt/rust-deps"
"""Where the ``adk-sandbox/rust`` image keeps ``libserde_json.rlib`` and the rlibs it depends on."""

CONTAINER_WORK_DIR = "/tmp/adk-rust"
"""Default work directory inside a container (its tmpfs ``/tmp``; gone with the container)."""

DEFAULT_RUSTC_ARGS = ("-C", "strip=debuginfo")
"""rustc arguments every compile gets, before ``RustExecutorConfig.rustc_args``. The snippet is compiled
without debug info anyway (rustc's default); stripping std's and serde_json's too measured 8 % (host,
rust-lld) to 20 % (image, GNU ld) of the compile, and only a ``RUST_BACKTRACE`` backtrace would show it
(panic messages keep their ``main.rs:line:column``)."""

_LLD_PROBE = 'link=; if command -v ld.lld >/dev/null 2>&1; then link="-C link-arg=-fuse-ld=lld"; fi'
"""In a container: link with lld when the image has it (cc's default GNU ld took ~0.45 s of a ~0.6 s
compile in the rust image; lld ~0.07 s). Probed by the compile step itself (a shell builtin, no process):
an image without lld still links, with GNU ld."""

RustStatus = Literal[
    "success", "compile_error", "runtime_error", "timeout", "memory_exceeded", "rejected", "error"
]
"""The outcome of a snippet (docs/RUST_AND_WASM.md)."""

RustStage = Literal["check", "build", "run"]
"""The pipeline stage a timeout or memory exhaustion happened in."""

_PIPELINE_NOTE = "adk-sandbox:"
# "thread 'main' panicked at main.rs:2:5:\nmessage"; newer rustc adds the thread id: "'main' (1168)".
# Only the header: the rest of the panic is found by _find_panic (see there why not by this regex).
_PANIC_HEADER = re.compile(r"thread '[^']*'(?: \(\d+\))? panicked at ")
_PANIC_NOTE = "\nnote: "
# Bounded: a Rust line number fits in u32, and int() refuses over 4300 digits (ValueError) anyway.
_SOURCE_LINE = re.compile(rf"{re.escape(SOURCE_FILE)}:(\d{{1,10}}):")
_ALLOCATION_FAILED = re.compile(r"memory allocation of \d+ bytes failed")
# rustc errors that mean the toolchain or serde_json is missing or broken, not that the code is wrong.
_INFRASTRUCTURE_ERROR = re.compile(
    r"extern location for serde_json|can't find crate for `serde_json`|"
    r"crate `serde_json` compiled by an incompatible|linker `[^`]*` not found|could not exec the linker|"
    r"error: linking with",
)
_WATCH_INTERVAL = 0.02
_CLEANUP_TIMEOUT = 10.0

log = logging.getLogger(__name__)


class RustExecutorConfig(BaseModel):
    """How the pipeline compiles and runs. Every field has a default that fits the backend's kind."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    work_dir: str | None = None
    """Directory for sources and binaries, as the backend sees it. Default: ``/tmp/adk-rust`` in a
    container; on a host backend a temporary directory created here and removed by ``close()`` (under an
    enforcer give one the policy allows read-write)."""
    deps_dir: str | None = None
    """Directory holding ``libserde_json.rlib`` and its dependencies' rlibs, as the backend sees it.
    Default: ``/opt/rust-deps`` in a container; on the host the cache ``scripts/build-rust-deps`` fills
    for the rustc in use."""
    rustc: str | None = None
    """The compiler to run. Default: ``rustc`` on the container's PATH; on the host the sysroot's rustc
    found on the caller's PATH (with its absolute linker)."""
    rustc_args: tuple[str, ...] = ()
    """Extra rustc arguments (e.g. ``("-C", "opt-level=1")``). They come after the pipeline's own
    (:data:`DEFAULT_RUSTC_ARGS`; in a container also ``-C link-arg=-fuse-ld=lld`` when ``ld.lld`` is on
    PATH), so they can override them: ``("-C", "strip=none")`` keeps the debug info, ``("-C",
    "link-arg=-fuse-ld=bfd")`` links with GNU ld."""
    edition: Literal["2015", "2018", "2021", "2024"] = "2021"
    """Rust edition of the snippet."""
    check_timeout: Annotated[float, Field(gt=0)] = 60.0
    """Seconds for the check stage (parsing and type checking)."""
    build_timeout: Annotated[float, Field(gt=0)] = 120.0
    """Seconds for the build stage (code generation and linking)."""
    run_timeout: Annotated[float, Field(gt=0)] = 30.0
    """Seconds for running the program."""
    memory_limit_mb: Annotated[int, Field(gt=0)] | None = 512
    """Address-space limit of the running program (``ulimit -v``); an allocation beyond it fails and is
    reported as ``memory_exceeded``. Applies on every backend, also the bare host. None: no limit here
    (a container's own memory limit still applies)."""
    incremental: bool = False
    """Pass ``-C incremental=<work_dir>/incr``. Off by default: it speeds up rebuilding the *same* program
    but measured slower for a stream of different snippets (see BENCHMARKS.md)."""
    max_output_bytes: Annotated[int, Field(gt=0)] | None = None
    """Per-stream output cap of each step (backend default: 1 MiB)."""


class RustResult(BaseModel):
    """What happened to one snippet. ``status`` says which of the other fields are meaningful."""

    status: RustStatus
    """The outcome."""
    stage: RustStage | None = None
    """For ``timeout`` and ``memory_exceeded``: the stage it happened in."""
    message: str | None = None
    """Why, in words, for every status but ``success`` and ``compile_error``."""
    output: Any = None
    """The JSON value ``run`` returned (``success`` only)."""
    stdout: str = ""
    """What the program printed before its result line."""
    stderr: str = ""
    """The program's stderr; for ``compile_error`` the compiler's rendered messages."""
    exit_code: int | None = None
    """The program's exit status, when it ran to an exit."""
    duration_ms: int = 0
    """Wall-clock time of the whole pipeline."""
    diagnostics: list[Diagnostic] = Field(default_factory=list)
    """Compiler errors and warnings, line numbers in the user's code."""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timings_ms: dict[str, int] = Field(default_factory=dict)
    """Time per step: ``compile`` (check + build) and ``run``."""


class RustExecutor(ClosedOnExit):
    """Compiles and runs ``fn run(input: Value) -> Value`` snippets on ``backend``. Thread-safe.

    The program built by one step is run by the next, so the steps need one filesystem: a host backend,
    or a Docker *session*. Given a :class:`~adk_sandbox.executor.SessionFactory` (``DockerBackend``, whose
    ``execute`` uses a throw-away container per call), the executor opens one session (no workspace) and runs
    every step of every snippet in it; ``close()`` closes that session and removes its container. Otherwise
    the executor does not own the backend; ``close()`` removes only the work directory it created itself.
    Where rustc, serde_json and the work directory are follows ``capabilities().host_programs``: the
    host's toolchain and a host temporary directory, or the image's (``/opt/rust-deps``, ``/tmp/adk-rust``).
    """

    def __init__(
        self, backend: SandboxBackend | SessionFactory, config: RustExecutorConfig | None = None
    ) -> None:
        self._config = config = config if config is not None else RustExecutorConfig()
        self._owned_work_dir: str | None = None
        self._closed = False
        self._unavailable: str | None = None
        self._check_deps_on_host = False
        self._owned_session: OwnedSession | None = None
        if isinstance(backend, SessionFactory):
            # Its own execute() may use a sandbox per call (Docker: a throw-away container), and the
            # program one step builds must be there for the next: one session for the executor's life
            # (also closed when the executor is garbage-collected or the interpreter exits without close()).
            self._owned_session = OwnedSession(self, backend, "the Rust executor")
            backend = self._owned_session.session
        self._backend: SandboxBackend = backend
        try:
            capabilities = self._backend.capabilities()  # starts an owned session's container
        except BaseException:
            self.close()
            raise
        # Where rustc and serde_json are comes from what the backend runs, not from how strongly it
        # isolates: the host's toolchain and deps cache (also under bubblewrap, which binds them), or the
        # image's (a container; anything else that runs no host program is given the image layout too).
        # The host's rustc is set up by host_rust() (rustup's links with its own rust-lld).
        self._probe_lld = not capabilities.host_programs
        if not capabilities.host_programs:
            self._rustc = [config.rustc or "rustc"]
            self._deps_dir = config.deps_dir or CONTAINER_DEPS_DIR
            self._work_dir = config.work_dir or CONTAINER_WORK_DIR
        else:
            self._init_host(self._backend, config, capabilities)

    def _init_host(
        self, backend: SandboxBackend, config: RustExecutorConfig, capabilities: Capabilities
    ) -> None:
        host = host_rust()
        if config.rustc is not None:
            self._rustc = [config.rustc]
        elif host is not None:
            self._rustc = [host.rustc, *host.args]
        else:
            self._rustc = ["rustc"]
            self._unavailable = "rustc was not found on PATH; install Rust (rustup or `apt install rustc`)"
        if config.deps_dir is not None:
            self._deps_dir = config.deps_dir
        elif host is not None:
            self._deps_dir = host.deps_dir
        else:
            self._deps_dir = os.path.join(tempfile.gettempdir(), "adk-rust-deps-missing")
        # The host's filesystem is the backend's: a missing serde_json is found before compiling.
        self._check_deps_on_host = True
        if config.work_dir is not None:
            self._work_dir = os.path.abspath(config.work_dir)
        else:
            self._work_dir = self._owned_work_dir = tempfile.mkdtemp(prefix="adk-rust-")
            # Safety net for an executor dropped without close(): removed when it is garbage-collected.
            self._finalizer = weakref.finalize(self, shutil.rmtree, self._work_dir, True)
        policy = getattr(backend, "policy", None)
        # Paths confined by a policy (bubblewrap): the ones the pipeline uses must be in it.
        if (capabilities.fs_read or capabilities.fs_write) and policy is not None:
            needed = [(self._work_dir, "allow_read_write")]
            readable = (self._deps_dir, host.sysroot if host is not None else None)
            needed += [(path, "allow_read") for path in readable if path is not None]
            for path, how in needed:
                if not policy.covers(path):
                    self.close()
                    raise InvalidRequestError(
                        f"the backend's sandbox policy does not allow {path!r}, which the Rust pipeline "
                        f"needs; add .{how}({path!r}) to the policy (or pass work_dir= inside an "
                        "allowed directory)"
                    )

    @property
    def backend(self) -> SandboxBackend:
        """The backend every step runs on (the executor's own session when it was given a DockerBackend)."""
        return self._backend

    @property
    def config(self) -> RustExecutorConfig:
        """The configuration as given."""
        return self._config

    @property
    def work_dir(self) -> str:
        """The work directory in use, as the backend sees it."""
        return self._work_dir

    @property
    def deps_dir(self) -> str:
        """The serde_json rlib directory in use, as the backend sees it."""
        return self._deps_dir

    def close(self) -> None:
        """Close the session this executor opened, remove the host work dir it created. Idempotent."""
        self._closed = True
        owned, self._owned_work_dir = self._owned_work_dir, None
        if owned is not None:
            self._finalizer()  # removes the directory now, and only once
        if self._owned_session is not None:
            self._owned_session.close()  # closes the session now, and only once

    # -- the pipeline --------------------------------------------------------------------------------

    def run(
        self,
        code: str,
        input: Any = None,
        *,
        timeout: float | None = None,
        cancel: threading.Event | None = None,
    ) -> RustResult:
        """Validate, compile and run ``code`` with ``input`` (any JSON value) on its stdin.

        ``timeout`` bounds the whole call (all stages); each stage is also bounded by its own limit from
        the config. Outcomes of the code, including a missing toolchain or serde_json, are results;
        exceptions of the backend (unavailable, refused request, broken sandbox) propagate as
        :class:`~adk_sandbox.executor.errors.ExecutorError`.
        """
        started = time.monotonic()
        stdin_json = ""
        refused = self._refusal(code)
        if refused is None:
            try:
                stdin_json = json.dumps(input, allow_nan=False)
            except (TypeError, ValueError) as exc:
                refused = RustResult(status="error", message=f"input is not JSON: {exc}")
        if refused is not None:
            return _finish(refused, started)

        config = self._config
        if timeout is None:
            timeout = config.check_timeout + config.build_timeout + config.run_timeout
        budget_end = started + timeout
        source = wrap_in_harness(code)
        run_dir = f"{self._work_dir.rstrip('/')}/run-{uuid.uuid4().hex[:16]}"
        finished_cleanly = False
        try:
            compiled_at = time.monotonic()
            outcome = self._compile(source.text, run_dir, budget_end, cancel)
            compiler_stderr = outcome.result.stderr if outcome.result is not None else ""
            compiled = parse_compiler_output(compiler_stderr, source.user_lines)
            timings = {"compile": _ms_since(compiled_at)}
            failure = self._compile_failure(outcome, compiled)
            if failure is not None:
                finished_cleanly = outcome.result is not None and outcome.result.exit_code is not None
                failure.timings_ms = timings
                return _finish(failure, started)
            ran_at = time.monotonic()
            remaining = budget_end - ran_at
            if remaining <= 0:
                return _finish(_timeout("run", timings=timings), started)
            result = self._backend.execute(
                ExecRequest(
                    language=Language.COMMAND,
                    code=self._run_script(run_dir),
                    stdin=stdin_json,
                    timeout=min(config.run_timeout, remaining),
                    max_output_bytes=config.max_output_bytes,
                ),
                cancel=cancel,
            )
            timings["run"] = _ms_since(ran_at)
            finished_cleanly = result.exit_code is not None
            run_result = _run_outcome(result, source.user_lines, compiled.diagnostics)
            run_result.timings_ms = timings
            return _finish(run_result, started)
        finally:
            if not finished_cleanly:
                self._remove(run_dir)

    # -- steps ---------------------------------------------------------------------------------------

    def _refusal(self, code: str) -> RustResult | None:
        """Why the snippet cannot be compiled at all (before anything reaches the backend), or None."""
        rejected = validation_error(code)
        if rejected is not None:
            return RustResult(status="rejected", message=rejected)
        if self._closed:
            return RustResult(status="error", message="the Rust executor is closed")
        problem = self._unavailable or self._missing_deps()
        return RustResult(status="error", message=problem) if problem is not None else None

    def _missing_deps(self) -> str | None:
        if not self._check_deps_on_host:
            return None
        rlib = os.path.join(self._deps_dir, "libserde_json.rlib")
        if os.path.isfile(rlib):
            return None
        return (
            f"serde_json is not available for this rustc: {rlib} does not exist. Build it with "
            f"`{BUILD_DEPS_SCRIPT}` (run by scripts/setup), or set RustExecutorConfig(deps_dir=...) to a "
            "directory holding libserde_json.rlib and the rlibs it depends on"
        )

    def _compile(
        self, program: str, run_dir: str, budget_end: float, cancel: threading.Event | None
    ) -> _CompileOutcome:
        config = self._config
        now = time.monotonic()
        if budget_end - now <= 0:
            return _CompileOutcome(result=None, expired_stage="check", cancelled=False)
        watch = _StageWatch(
            check_end=min(now + config.check_timeout, budget_end),
            build_limit=config.build_timeout,
            budget_end=budget_end,
            caller_cancel=cancel,
        )
        request = ExecRequest(
            language=Language.COMMAND,
            code=self._compile_script(run_dir),
            stdin=program,
            # The backstop; the watch enforces each stage's own share.
            timeout=min(config.check_timeout + config.build_timeout, budget_end - now),
            max_output_bytes=config.max_output_bytes,
        )
        with watch:
            result = self._backend.execute(request, watch.on_output, cancel=watch.cancel)
        expired = watch.expired_stage
        if expired is None and result.timed_out:
            expired = "build" if watch.metadata_seen else "check"
        return _CompileOutcome(result=result, expired_stage=expired, cancelled=watch.cancelled_by_caller)

    def _compile_script(self, run_dir: str) -> str:
        config = self._config
        args = [
            *self._rustc,
            *DEFAULT_RUSTC_ARGS,
            *config.rustc_args,
            f"--edition={config.edition}",
            "--crate-type=bin",
            "--crate-name=main",
            "--error-format=json",
            "--json=artifacts",
            "--emit=metadata,link",
            "--out-dir=.",
            "-L",
            f"dependency={self._deps_dir}",
            "--extern",
            f"serde_json={self._deps_dir}/libserde_json.rlib",
        ]
        if config.incremental:
            args += ["-C", f"incremental={self._work_dir}/incr"]
        args.append(SOURCE_FILE)
        q = shlex.quote
        argv = [q(arg) for arg in args]
        probe = []
        if self._probe_lld:
            probe = [_LLD_PROBE]
            # Unquoted on purpose (nothing, or the two words the probe set); before rustc_args, which win.
            argv.insert(len(self._rustc) + len(DEFAULT_RUSTC_ARGS), "$link")
        # rustc runs in the run directory so diagnostics and panics name `main.rs`, not a temp path.
        return "\n".join(
            [
                "umask 077",
                f"mkdir -p {q(run_dir)} && cd {q(run_dir)} && cat > {SOURCE_FILE} || exit 125",
                *probe,
                " ".join(argv),
                "status=$?",
                f'if [ "$status" -ne 0 ]; then cd / && rm -rf {q(run_dir)}; fi',
                'exit "$status"',
            ]
        )

    def _run_script(self, run_dir: str) -> str:
        q = shlex.quote
        lines = [
            f"cd {q(run_dir)} 2>/dev/null && [ -x ./main ] || {{ echo "
            + q(
                f"{_PIPELINE_NOTE} the compiled program is gone; the backend must keep its "
                "filesystem between executions (use a session)"
            )
            + " >&2; exit 125; }",
        ]
        if self._config.memory_limit_mb is not None:
            kib = self._config.memory_limit_mb * 1024
            # Fail closed: without the limit a memory hog could take the whole host.
            lines.append(
                f"ulimit -v {kib} || {{ echo {q(_PIPELINE_NOTE + ' cannot set the memory limit')} >&2;"
                " exit 125; }"
            )
        lines += ["./main", "status=$?", f"cd / && rm -rf {q(run_dir)}", 'exit "$status"']
        return "\n".join(lines)

    def _compile_failure(  # noqa: PLR0911 - one return per outcome reads best
        self, outcome: _CompileOutcome, compiled: CompilerOutput
    ) -> RustResult | None:
        result = outcome.result
        if outcome.cancelled:
            return RustResult(status="error", message="cancelled by the caller", stderr=compiled.rendered)
        if outcome.expired_stage is not None:
            return _timeout(outcome.expired_stage, stderr=compiled.rendered, diagnostics=compiled.diagnostics)
        if result is None:  # only a timeout before the step started has no result; handled above
            return RustResult(status="error", message="the compile step did not run")
        stage: RustStage = "build" if compiled.metadata_emitted else "check"
        if result.oom_killed:
            return RustResult(
                status="memory_exceeded",
                stage=stage,
                message=f"the compiler ran out of memory in the {stage} stage",
                stderr=compiled.rendered,
            )
        if result.exit_code == 0 and compiled.link_emitted:
            return None
        infrastructure = [d.message for d in compiled.errors if _INFRASTRUCTURE_ERROR.search(d.message)]
        if infrastructure:
            return RustResult(
                status="error",
                message=f"the Rust toolchain in the backend is not usable: {infrastructure[0]} "
                f"(serde_json is expected in {self._deps_dir}: on the host run `{BUILD_DEPS_SCRIPT}`, "
                "in Docker use the adk-sandbox/rust image)",
                stderr=compiled.rendered,
            )
        if compiled.errors:
            return RustResult(
                status="compile_error", stderr=compiled.rendered, diagnostics=compiled.diagnostics
            )
        return RustResult(
            status="error",
            message=f"the compiler failed without a diagnostic (exit {result.exit_code}): "
            f"{compiled.rendered.strip()[:2000]}",
            stderr=compiled.rendered,
        )

    def _remove(self, run_dir: str) -> None:
        # Best effort after a killed step; a host work dir the executor owns goes entirely on close().
        request = ExecRequest(
            language=Language.COMMAND, code=f"rm -rf {shlex.quote(run_dir)}", timeout=_CLEANUP_TIMEOUT
        )
        with contextlib.suppress(Exception):  # cleanup must never hide the snippet's result
            self._backend.execute(request)


class _CompileOutcome:
    def __init__(self, result: ExecResult | None, expired_stage: RustStage | None, cancelled: bool) -> None:
        self.result = result
        self.expired_stage = expired_stage
        self.cancelled = cancelled


class _StageWatch:
    """Enforces the check and build limits inside the one rustc process, and forwards the caller's cancel.

    The check stage ends when rustc announces the metadata artifact (streamed on stderr); the build stage
    then gets its own limit. When the running stage's time is up, ``cancel`` is set, which makes the
    backend kill the step.
    """

    def __init__(
        self,
        *,
        check_end: float,
        build_limit: float,
        budget_end: float,
        caller_cancel: threading.Event | None,
    ) -> None:
        self.cancel = threading.Event()
        self.expired_stage: RustStage | None = None
        self.cancelled_by_caller = False
        self._check_end = check_end
        self._build_limit = build_limit
        self._budget_end = budget_end
        self._caller_cancel = caller_cancel
        self._metadata_at: float | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="adk-rust-stages", daemon=True)

    @property
    def metadata_seen(self) -> bool:
        return self._metadata_at is not None

    def on_output(self, stream: Stream, line: str) -> None:
        if stream == "stderr" and self._metadata_at is None and is_metadata_notice(line):
            self._metadata_at = time.monotonic()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._done.wait(_WATCH_INTERVAL):
            if self._caller_cancel is not None and self._caller_cancel.is_set():
                self.cancelled_by_caller = True
                self.cancel.set()
                return
            now = time.monotonic()
            metadata_at = self._metadata_at
            if metadata_at is None and now >= self._check_end:
                self._expire("check")
                return
            if metadata_at is not None and now >= min(metadata_at + self._build_limit, self._budget_end):
                self._expire("build")
                return

    def _expire(self, stage: RustStage) -> None:
        self.expired_stage = stage
        self.cancel.set()


def _run_outcome(  # noqa: PLR0911 - one return per outcome reads best
    result: ExecResult, user_lines: int, diagnostics: list[Diagnostic]
) -> RustResult:
    common: dict[str, Any] = {
        "stdout": result.stdout,
        "stderr": result.stderr,
        "exit_code": result.exit_code,
        "diagnostics": diagnostics,
        "stdout_truncated": result.stdout_truncated,
        "stderr_truncated": result.stderr_truncated,
    }
    if result.cancelled:
        return RustResult(status="error", message="cancelled by the caller", **common)
    if result.timed_out:
        return _timeout("run", **common)
    if result.oom_killed or _ALLOCATION_FAILED.search(result.stderr):
        return RustResult(
            status="memory_exceeded",
            stage="run",
            message="the program ran out of memory (its allocation failed or it was killed for it)",
            **common,
        )
    if result.exit_code == 125 and result.stderr.startswith(_PIPELINE_NOTE):
        return RustResult(status="error", message=result.stderr.strip(), **common)
    if result.exit_code != 0:
        return RustResult(status="runtime_error", message=_runtime_message(result, user_lines), **common)
    body, separator, last = result.stdout.removesuffix("\n").rpartition("\n")
    try:
        output = json.loads(last) if separator else None
    except (ValueError, RecursionError):  # RecursionError: nested too deep ("[" * 100000) to be a result
        separator = ""
    if not separator:
        why = (
            "its output exceeded the cap, so the result line was cut off"
            if result.stdout_truncated
            else "it exited before printing the result of run() (std::process::exit?)"
        )
        return RustResult(status="runtime_error", message=f"the program printed no result: {why}", **common)
    # The harness writes "\n" before the result line; that newline is not the program's output.
    common["stdout"] = body
    return RustResult(status="success", output=output, **common)


def _runtime_message(result: ExecResult, user_lines: int) -> str:
    panic = _find_panic(result.stderr)
    if panic is not None:
        location, message = panic[0], panic[1].strip()
        line = _SOURCE_LINE.match(location)
        if line is not None and int(line.group(1)) > user_lines:
            location = "the harness"
        return f"panicked at {location}: {message}"
    if result.exit_code is None:
        return "the program was killed by a signal"
    last_line = result.stderr.strip().rsplit("\n", 1)[-1] if result.stderr.strip() else ""
    detail = f": {last_line}" if last_line else ""
    return f"the program exited with status {result.exit_code}{detail}"


def _find_panic(stderr: str) -> tuple[str, str] | None:
    """Location and message of the first panic in ``stderr``, or None.

    A panic is a header, the rest of its line up to a final ":" (the location), then the message up to
    the next ``note:`` line or the end. Not one regex for all of it: matching the location up to the
    colon ending its line rescans the rest of the line for every header on a line not ending so,
    quadratic in the program's stderr (1 MiB of "thread 'x' panicked at " without a newline took
    minutes, holding the GIL for every session). Here a line's end is looked up once for all its
    headers: linear.
    """
    position, line_end = 0, -1
    while (header := _PANIC_HEADER.search(stderr, position)) is not None:
        if header.end() > line_end:
            line_end = stderr.find("\n", header.end())
            if line_end < 0:
                return None  # the location must end its line, and this is the last one
        if stderr[line_end - 1] == ":":
            message_end = stderr.find(_PANIC_NOTE, line_end + 1)
            message = stderr[line_end + 1 : message_end if message_end >= 0 else len(stderr)]
            return stderr[header.end() : line_end - 1], message
        # Not this header; a later one may still match (its thread name can span lines).
        position = header.start() + 1
    return None


def _timeout(stage: RustStage, **fields: Any) -> RustResult:
    doing = {"check": "type checking", "build": "generating code and linking", "run": "running the program"}
    message = f"time limit reached while {doing[stage]} ({stage} stage)"
    return RustResult(status="timeout", stage=stage, message=message, **fields)


def _ms_since(start: float) -> int:
    return int((time.monotonic() - start) * 1000)


def _finish(result: RustResult, started: float) -> RustResult:
    result.duration_ms = _ms_since(started)
    return result
