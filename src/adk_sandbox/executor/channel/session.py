"""One session shape for every engine whose commands travel over a :class:`CommandTransport`.

:class:`ChannelSession` writes :meth:`~ChannelSession.execute` once (refuse, sync the workspace in, run
into a capped capture, sync back, assemble the :class:`ExecResult`), plus files, ports, terminals,
spawned programs, pause and snapshots; an engine's session supplies the hooks. The hooks and their
defaults: docs/BACKENDS.md, "2. The session".
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from adk_sandbox.executor._env import build_child_env
from adk_sandbox.executor._languages import request_argv
from adk_sandbox.executor._output import OutputCapture
from adk_sandbox.executor._users import is_numeric, resolve_user
from adk_sandbox.executor.backend import OutputCallback, SandboxSession
from adk_sandbox.executor.channel.agent_transport import AgentTransport
from adk_sandbox.executor.channel.files import SandboxFiles
from adk_sandbox.executor.channel.frames import MAX_PTYS
from adk_sandbox.executor.channel.gate import CallGate
from adk_sandbox.executor.channel.live import LiveChannel, Process, live_request
from adk_sandbox.executor.channel.ports import PublishedPorts
from adk_sandbox.executor.channel.terminal import Terminal, check_size, terminal_request
from adk_sandbox.executor.channel.transport import (
    MAX_COMMAND_INPUT,
    CommandOutcome,
    CommandTransport,
    PreparedCommand,
)
from adk_sandbox.executor.errors import (
    ExecutorError,
    InvalidRequestError,
    PolicyNotEnforceableError,
    SandboxFailedError,
)
from adk_sandbox.executor.types import MAX_BACKGROUND_GROUPS, ExecRequest, ExecResult, parse_user
from adk_sandbox.executor.workspace.synced import SyncedWorkspace, refusal_note

if TYPE_CHECKING:
    from adk_sandbox.executor.channel.egress import SessionEgress
    from adk_sandbox.executor.snapshots.model import Snapshot, SnapshotOptions
    from adk_sandbox.executor.snapshots.store import SnapshotStore

__all__ = ["ChannelSession", "uid_gid"]

_Live = TypeVar("_Live", bound=LiveChannel)

# The sandbox's user and group tables, as they are now (a user added a moment ago is found), split by RS.
_USER_TABLES = "cat /etc/passwd; printf '\\n\\036\\n'; cat /etc/group"
#: How long reading them may take.
_LOOKUP_SECONDS = 30.0

# Enters the requested cwd as the command's user, before the command: a cwd it cannot enter is refused.
_PROBE_CWD = 'cd -- "$1" 2>&1'


def uid_gid(user: str) -> str:
    """``"uid:gid"`` of a numeric ``user``: a bare uid runs with the group of the same number."""
    uid, gid = parse_user(user)
    return f"{uid}:{gid if gid is not None else uid}"


class ChannelSession(SandboxSession):
    """A session whose commands run through a :class:`CommandTransport` in one sandbox (see the module).

    Subclasses set ``_transport`` (None until the sandbox is up, and after it is gone), ``_workspace``
    (the synced host workspace, or None), ``_user``, ``_base_env`` and ``_egress``, and implement the
    engine's parts.
    """

    _transport: CommandTransport | None = None
    _workspace: SyncedWorkspace | None = None
    #: The ``"uid:gid"`` a command runs as when its request names no user.
    _user: str
    #: A command's environment before the request's own (PATH, HOME).
    _base_env: dict[str, str]
    #: The network in force, the proxy endpoint, the live connections and the log (channel/egress.py).
    _egress: SessionEgress
    #: Held while the sandbox starts or is removed (reentrant where a start runs commands in it).
    _lock: contextlib.AbstractContextManager[Any]
    #: How a refused memory limit is set instead (``{}``: the limit asked for).
    _MEMORY_SETTING: ClassVar[str] = "ResourceLimits(memory_mb={})"
    #: Said when a request asks for ``background=True`` here (None: the engine keeps background commands).
    _NO_BACKGROUND: ClassVar[str | None] = None
    #: Said when a file operation finds the sandbox gone (an engine may say how to get a new one).
    _GONE: ClassVar[str] = "the session's sandbox is gone"
    #: Said when a file operation finds the session's commands on another transport than the agent channel.
    _NO_FILES: ClassVar[str] = "file operations need the agent channel; this session does not use it"

    #: How messages name the sandbox ("the Docker session's container").
    _WHERE: ClassVar[str] = "the session's sandbox"
    #: (sandbox id, user) pairs known to enter the default working directory (see :meth:`_check_cwd`).
    _enterable: set[tuple[str, str]]
    _ports: PublishedPorts | None = None
    _ports_done = False  # set by close: nothing is published or opened after it
    _calls: CallGate | None = None  # the calls running inside, and holds (made on first use)
    _live: set[LiveChannel] | None = None  # the terminals and spawned processes not yet closed

    # -- the engine's parts ---------------------------------------------------------------------------
    def start(self) -> None:
        """Make the sandbox and verify it (:meth:`_open`); idempotent.

        :class:`SandboxFailedError` once closed. A start that fails removes what it made (:meth:`_discard`)
        before its error goes on.
        """
        with self._lock:
            if self._closed:
                raise SandboxFailedError(self._GONE)
            if self._transport is None:
                try:
                    self._open()
                except BaseException:
                    with contextlib.suppress(ExecutorError):
                        self._discard()
                    raise

    def _open(self) -> None:
        """Make the sandbox, verify it and set ``_transport`` (lock held; for :meth:`start`)."""
        raise NotImplementedError  # an engine with its own start needs none

    def _discard(self) -> None:
        """Remove whatever of the sandbox there is, its transport with it (lock held); idempotent."""
        raise NotImplementedError  # an engine with its own start needs none

    def ping(self, timeout: float = 2.0) -> bool:
        """True when the started sandbox's agent answers a PING within ``timeout`` seconds; starts nothing.

        A pool asks this before handing a member out: a sandbox removed or stopped from outside, or an
        agent that stopped answering, answers False.
        """
        transport = self._transport
        if self._closed or not isinstance(transport, AgentTransport):
            return False
        try:
            return transport.ping(self._user, timeout)
        except ExecutorError:
            return False

    def _refuse(self, request: ExecRequest) -> None:
        """Raise for a request this sandbox cannot honour (nothing ran); start the sandbox.

        By default: a memory limit below the sandbox's own (:meth:`_memory_limit_mb`, the only one
        enforced), and ``background=True`` where the engine does not keep background commands.
        """
        limit, asked = self._memory_limit_mb(), request.memory_limit_mb
        if limit is not None and asked is not None and asked < limit:
            raise PolicyNotEnforceableError(
                f"memory_limit_mb={asked} is below the limit of {self._WHERE} ({limit} MiB), which is the "
                f"only one enforced; use {self._MEMORY_SETTING.format(asked)}"
            )
        if request.background and self._NO_BACKGROUND is not None:
            raise InvalidRequestError(self._NO_BACKGROUND)
        self.start()
        self._running_transport()

    def _memory_limit_mb(self) -> int | None:
        """The sandbox's own memory limit in MiB, for :meth:`_refuse` (default: None, nothing refused)."""
        return None

    def _running_transport(self) -> CommandTransport:
        """The transport of the started sandbox; :class:`SandboxFailedError` once it is gone."""
        transport = self._transport
        if transport is None:
            raise SandboxFailedError(self._GONE)
        return transport

    @abstractmethod
    def _working_directory(self) -> tuple[str, str]:
        """The started sandbox's id and its default working directory (for :meth:`_check_cwd`)."""

    def _before_command(self, request: ExecRequest, started: float) -> None:
        """Checks that need the started sandbox, before the workspace syncs in: the cwd can be entered."""
        self._check_cwd(request, started)

    def _prepare_command(self, request: ExecRequest, argv: tuple[str, ...]) -> PreparedCommand:
        """``argv`` for ``request``, ready for the transport (the sandbox is started).

        As the command user, with the egress proxy's variables (its endpoint served by that user's agent,
        again after an agent restart), ``_base_env`` and the request's, in the request's ``cwd`` else the
        sandbox's working directory.
        """
        transport = self._running_transport()
        user = self._command_user(request.user)
        self._egress.ensure(transport, user)
        return PreparedCommand(
            argv=argv,
            env={**self._egress.env(), **build_child_env(self._base_env, None, request.env)},
            user=user,
            workdir=request.cwd if request.cwd is not None else self._working_directory()[1],
            stdin=request.stdin_bytes,
            marker=uuid.uuid4().hex,
            background=request.background,
        )

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
        transport = self._running_transport()
        command = self._prepare_command(request, argv)
        outcome = transport.run(command, capture, deadline=started + request.timeout, cancel=cancel)
        return outcome, bool(outcome.oom_kills)

    def _explained(self, exc: SandboxFailedError) -> ExecutorError:
        """What a broken channel means here (default: the error as it is)."""
        return exc

    def _command_user(self, requested: str | None) -> str:
        """The ``"uid:gid"`` a command (or file operation) runs as, given the request's numeric ``user``."""
        return uid_gid(requested) if requested is not None else self._user

    @abstractmethod
    def _close_sandbox(self) -> None:
        """Remove the sandbox (the engine's close: last syncs, the container or Pod or VM); idempotent."""

    def _refuse_user(self, user: str | None) -> None:
        """Raise for a user (``"uid:gid"``, from the request) this sandbox cannot run as (default: none)."""

    def _lookup_user(self) -> str:
        """The ``"uid:gid"`` the user tables are read as (default: the session's own user)."""
        return self._command_user(None)

    def agent_channel(self) -> tuple[AgentTransport, str]:
        """The session's agent channel and the user its commands run as: for linking sessions (ServiceLinks).

        :class:`SandboxFailedError` while the sandbox is not up, or when its commands use another transport.
        """
        transport = self._transport
        if not isinstance(transport, AgentTransport):
            raise SandboxFailedError(f"{self._WHERE} is not running on the agent channel")
        return transport, self._command_user(None)

    def _woken_agent_channel(self) -> tuple[AgentTransport, str]:
        """:meth:`agent_channel` of a running session: a published port's connection resumes a paused one."""
        self._wake()
        return self.agent_channel()

    # -- users ----------------------------------------------------------------------------------------
    def numeric_user(self, user: str) -> str:
        """``"uid:gid"`` of ``user``: numbers as given, names looked up in the sandbox as they are now.

        A bare uid runs with the group of the same number; names are read from the sandbox's own
        ``/etc/passwd`` and ``/etc/group``. An unknown name is an :class:`InvalidRequestError` (nothing
        ran). Starts the session.
        """
        if is_numeric(user):
            return uid_gid(user)
        self._awake()

        def run(request: ExecRequest, capture: OutputCapture) -> CommandOutcome:
            argv = request.argv or ()
            return self._run_command(request, argv, capture, started=time.monotonic(), cancel=None)[0]

        return self._lookup_numeric(user, run)

    def _lookup_numeric(self, user: str, run: Callable[[ExecRequest, OutputCapture], CommandOutcome]) -> str:
        """``"uid:gid"`` of the named ``user``, reading the sandbox's user tables through ``run``."""
        reader = ExecRequest(argv=("/bin/sh", "-c", _USER_TABLES), cwd="/", user=self._lookup_user(),
                             timeout=_LOOKUP_SECONDS)  # fmt: skip
        capture = OutputCapture(4 * 1024 * 1024)
        outcome = run(reader, capture)
        if outcome.exit_code is None:
            raise SandboxFailedError(f"reading /etc/passwd in {self._WHERE} did not finish in time")
        passwd, _, group = capture.finish()["stdout"].text.partition("\n\036\n")
        uid, gid = resolve_user(user, passwd, group, where=self._WHERE)
        return f"{uid}:{gid}"

    def _numeric_request(self, request: ExecRequest) -> ExecRequest:
        """``request`` with its user in numbers (looked up when named)."""
        if request.user is None or is_numeric(request.user):
            return request
        return request.model_copy(update={"user": self.numeric_user(request.user)})

    # -- commands -------------------------------------------------------------------------------------
    def execute(
        self,
        request: ExecRequest,
        on_output: OutputCallback | None = None,
        *,
        cancel: threading.Event | None = None,
    ) -> ExecResult:
        """Run ``request`` in the session's sandbox (see the engine's class docstring).

        Held back while a snapshot, fork or pause of the session waits for calls to end (:meth:`_quiesced`).
        """
        with self._counted():
            return self._execute(request, on_output, cancel)

    def _execute(
        self, request: ExecRequest, on_output: OutputCallback | None, cancel: threading.Event | None
    ) -> ExecResult:
        argv = request_argv(request, self.name)
        stdin = request.stdin_bytes
        if stdin is not None and len(stdin) > MAX_COMMAND_INPUT:
            raise InvalidRequestError(
                f"stdin holds {len(stdin) // (1024 * 1024)} MiB, more than one command in {self._WHERE} "
                f"may be given ({MAX_COMMAND_INPUT // (1024 * 1024)} MiB: the sandbox's agent would cut it "
                "short); nothing ran. Write larger data into the workspace and have the command read the file"
            )
        request, started = self._admitted(request)
        capture = OutputCapture(request.output_cap, on_output, keep_tail=request.truncate == "head_tail")
        refused: list[str] = []
        with self._explaining():
            workspace = self._workspace
            if workspace is not None:
                workspace.before_command()
            outcome, oom_killed = self._run_command(request, argv, capture, started=started, cancel=cancel)
            workspace = self._workspace
            if workspace is not None:
                refused = workspace.after_command()
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

    def _admitted(self, request: ExecRequest) -> tuple[ExecRequest, float]:
        """``request`` admitted as every call is, and when (its timeout counts from there).

        The sandbox's refusals, its user in numbers, the user's and the cwd's checks.
        """
        self._refuse(request)
        self._wake()
        request = self._numeric_request(request)
        self._refuse_user(request.user)
        started = time.monotonic()
        self._before_command(request, started)
        return request, started

    @contextlib.contextmanager
    def _explaining(self) -> Iterator[None]:
        """A broken channel raised inside says what it means for this engine (:meth:`_explained`)."""
        try:
            yield
        except SandboxFailedError as exc:
            explained = self._explained(exc)
            if explained is exc:
                raise
            raise explained from exc

    def _check_cwd(self, request: ExecRequest, started: float) -> None:
        """Refuse a cwd the command's user cannot enter (nothing of the command ran).

        Asked of the sandbox before the command for every explicit ``cwd``, and once per user for the
        default working directory when another user than the session's runs the call (the workspace
        root may be closed to it). Without this the program would fail to start with a misleading
        "Permission denied" or "No such file" about itself.
        """
        if request.cwd is None and request.user is None:
            return  # the session's own user in its own working directory: nothing to check
        user = self._command_user(request.user)
        if request.cwd is None and user == self._command_user(None):
            return
        sandbox, workdir = self._working_directory()
        cwd = request.cwd if request.cwd is not None else workdir
        known = (sandbox, user)
        if request.cwd is None and known in self._enterable:
            return
        # Started in "/", which every user can enter (the workspace root may be closed to this user).
        probe = ExecRequest(argv=("/bin/sh", "-c", _PROBE_CWD, "adk-sandbox-cwd", cwd), cwd="/",
                            user=user, timeout=request.timeout)  # fmt: skip
        capture = OutputCapture(4096)
        outcome, _ = self._run_command(probe, probe.argv or (), capture, started=started, cancel=None)
        if outcome.timed_out:
            return  # the call's time ran out during the check: the command then times out, a result
        if outcome.exit_code != 0:
            streams = capture.finish()
            why = (
                streams["stdout"].text + streams["stderr"].text
            ).strip() or f"exit status {outcome.exit_code}"
            if request.cwd is None:
                raise InvalidRequestError(
                    f"user {user} cannot enter the session's working directory {cwd!r} in {self._WHERE} "
                    f"({why}); nothing ran. Give a cwd this user can enter"
                )
            raise InvalidRequestError(
                f"cwd {cwd!r} is not a directory the command can enter in {self._WHERE} ({why}); "
                "nothing ran. Create it first or give another cwd"
            )
        if request.cwd is None:
            self._enterable.add(known)

    # -- files ----------------------------------------------------------------------------------------
    @property
    def files(self) -> SandboxFiles:
        """File operations inside the sandbox, as the command user (:mod:`.files`).

        They travel over the agent channel: asking starts the session, and a session whose commands use
        another transport raises :class:`InvalidRequestError` here.
        """
        self._awake()
        if self._transport is not None and not isinstance(self._transport, AgentTransport):
            raise InvalidRequestError(self._NO_FILES)
        return SandboxFiles(self)

    def file_operation(
        self, request: dict[str, Any], data: bytes | None, *, deadline: float, max_output: int
    ) -> tuple[dict[str, Any], bytes]:
        """One FILE operation of the agent protocol, as the command user: the low level of :attr:`files`.

        Returns the RESULT body and the bytes sent before it. :class:`InvalidRequestError` when the
        session's commands do not travel over the agent channel (file operations need it). Held back and
        waited for as a command is.
        """
        with self._counted():
            return self._file_operation(request, data, deadline=deadline, max_output=max_output)

    def _file_operation(
        self, request: dict[str, Any], data: bytes | None, *, deadline: float, max_output: int
    ) -> tuple[dict[str, Any], bytes]:
        self._awake()
        transport = self._running_transport()
        if not isinstance(transport, AgentTransport):
            raise InvalidRequestError(self._NO_FILES)
        return transport.file_op(
            self._command_user(None), request, data, deadline=deadline, max_output=max_output
        )

    # -- pause ----------------------------------------------------------------------------------------
    _paused = False
    last_call = 0.0
    """When a call last reached inside (``time.monotonic()``): what an idle pause watches."""
    #: Paused to a checkpoint on disk (the sandbox stopped), not frozen in place.
    _on_disk = False
    _pause_lock: threading.Lock | None = None

    @property
    def paused(self) -> bool:
        """True while the session is paused (:meth:`pause`); any call on the session resumes it first."""
        return self._paused

    def pause(self, *, keep_memory: bool = False, wait_seconds: float = 30.0) -> None:
        """Stop every process of the sandbox where it is, until :meth:`resume` or the session's next call.

        By default to a checkpoint on the host's disk (Docker with ``checkpoints=True``, the microVM),
        refused with :class:`PolicyNotEnforceableError` elsewhere; ``keep_memory=True`` freezes them
        in place. Running commands and file operations are waited for (at most ``wait_seconds``, else
        :class:`InvalidRequestError`, nothing paused). Idempotent; starts the session. Depth: docs/pause.md.
        """
        self.start()
        with self._pausing():
            if not self._paused:
                if keep_memory:
                    self._freeze(wait_seconds)
                else:
                    self._checkpoint(wait_seconds)

    def resume(self) -> None:
        """Let a paused session's processes run on from where they stopped; idempotent."""
        with self._pausing():
            if self._paused:
                self._thaw()
                self._paused = False
                self._on_disk = False

    def running_sandbox(self) -> tuple[str, int] | None:
        """The running sandbox's id and the host pid its CPU is read from (idle pause); None: none now."""
        return None

    def _call_gate(self) -> CallGate:
        gate = self._calls  # every call reads it: the shared lock only for its one-time making
        if gate is None:
            with _PORTS_LOCK:
                if self._calls is None:
                    self._calls = CallGate()
                gate = self._calls
        return gate

    def _counted(self) -> contextlib.AbstractContextManager[None]:
        """A call that runs inside: it waits while the session is quiesced, and is waited for by it."""
        return self._call_gate().counted()

    def _quiesced(
        self, wait_seconds: float, purpose: str = "a snapshot is taken"
    ) -> contextlib.AbstractContextManager[None]:
        """No command or file operation runs inside, new ones wait (:meth:`CallGate.held`).

        Refused when running ones do not end in ``wait_seconds`` (:class:`InvalidRequestError`).
        """
        return self._call_gate().held(wait_seconds, purpose)

    def _pausing(self) -> threading.Lock:
        """The session's own lock for pausing and resuming (made on first use)."""
        with _PORTS_LOCK:
            if self._pause_lock is None:
                self._pause_lock = threading.Lock()
            return self._pause_lock

    def _wake(self) -> None:
        """Resume a paused session: every call that reaches inside does this first (and notes when)."""
        self.last_call = time.monotonic()
        if self._paused:
            self.resume()

    def _awake(self) -> None:
        """The sandbox started and not paused: what a call that reaches inside needs first."""
        self.start()
        self._wake()

    def _freeze(self, wait_seconds: float) -> None:
        """Freeze every process of the started sandbox and set ``_paused`` (the engine's part).

        It sets ``_paused`` before letting waiting calls in, so each of them resumes the session first.
        """
        del wait_seconds
        raise PolicyNotEnforceableError(f"{self._WHERE} cannot be paused: its engine has no freezer here")

    def _checkpoint(self, wait_seconds: float) -> None:
        """Move the started sandbox to a checkpoint on disk, set ``_paused`` and ``_on_disk`` (engine)."""
        del wait_seconds
        raise PolicyNotEnforceableError(
            f"{self._WHERE} cannot release its memory to a checkpoint on disk and keep its processes; "
            "nothing was paused. pause(keep_memory=True) freezes every process in place (their memory "
            "stays held); docs/pause.md says which sandboxes can be checkpointed"
        )

    def _thaw(self) -> None:
        """Undo :meth:`_freeze` or :meth:`_checkpoint` (the engine's part)."""

    # -- snapshots (docs/snapshots.md, docs/pause.md) ------------------------------------------------
    def snapshot(
        self,
        name: str | None = None,
        *,
        labels: Mapping[str, str] | None = None,
        ttl_seconds: int | None = None,
        detached: bool = False,
        max_mb: int | None = None,
        wait_seconds: float | None = None,
        store: SnapshotStore | None = None,
        processes: bool = False,
    ) -> Snapshot:
        """The session now, kept on disk: a :class:`~adk_sandbox.executor.snapshots.Snapshot`.

        ``backend.session(snapshot=...)`` starts a new session from it, any number of times. Taken while no
        command runs (waits at most ``wait_seconds``); owned by this process unless ``detached``; expires
        after ``ttl_seconds``; over ``max_mb`` refused (:class:`PolicyNotEnforceableError`); kept in ``store``
        (the backend's, else the default one). ``processes=True`` keeps every process with its memory too,
        where the engine can. Starts the session. Depth: docs/snapshots.md; with processes: docs/pause.md.
        """
        from adk_sandbox.executor.snapshots.model import options_from  # noqa: PLC0415

        options = options_from(
            name=name, labels=labels, ttl_seconds=ttl_seconds, detached=detached, max_mb=max_mb,
            wait_seconds=wait_seconds,
        )  # fmt: skip
        return self._take_snapshot(options, store, processes)

    def _take_snapshot(
        self, options: SnapshotOptions, store: SnapshotStore | None, processes: bool
    ) -> Snapshot:
        """Take :meth:`snapshot` (the engine's part)."""
        del options, store
        kept = "its processes" if processes else "its files"
        raise PolicyNotEnforceableError(
            f"{self._WHERE} cannot be snapshotted with {kept}: its engine keeps none"
        )

    # -- ports ----------------------------------------------------------------------------------------
    def publish(self, port: int, host_port: int = 0) -> str:
        """An address on the host's loopback (``"127.0.0.1:N"``) that reaches ``127.0.0.1:port`` inside.

        Each connection to it is carried over the agent channel to the sandbox's own loopback and nowhere
        else (:mod:`.ports`); publishing a port again returns its address. ``host_port`` asks for that
        port on the host (0: a free one). Starts the session. Bounded (:data:`.ports.MAX_PUBLISHED` ports,
        :data:`.ports.MAX_CONNECTIONS` connections); :meth:`unpublish` and :meth:`close` end it.
        """
        self._awake()
        if self._transport is not None and not isinstance(self._transport, AgentTransport):
            raise PolicyNotEnforceableError(
                f"{self._WHERE} runs its commands on the {getattr(self._transport, 'channel', 'exec')} "
                "transport, not the agent channel, which is what carries a published port; it is refused"
            )
        with _PORTS_LOCK:
            if self._closed or self._ports_done:
                raise SandboxFailedError(self._GONE)
            if self._ports is None:
                self._ports = PublishedPorts(self._woken_agent_channel)
            ports = self._ports
        return ports.publish(port, host_port)

    def unpublish(self, port: int) -> None:
        """Stop publishing ``port``: its address refuses, its live connections are cut (none: no error)."""
        if self._ports is not None:
            self._ports.unpublish(port)

    def published(self) -> dict[int, str]:
        """The sandbox's published ports and the host address of each."""
        return self._ports.published() if self._ports is not None else {}

    # -- live programs: terminals and spawned processes ----------------------------------------------
    def open_pty(
        self,
        argv: list[str] | tuple[str, ...] | None = None,
        *,
        rows: int = 24,
        cols: int = 80,
        user: str | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 24 * 3600,
    ) -> Terminal:
        """A program on a new terminal in the sandbox (:class:`.terminal.Terminal`); the shell by default.

        ``argv`` runs as a command would (``user``, ``cwd``, ``env`` and ``timeout`` as in
        :class:`ExecRequest`; ``TERM`` is ``xterm-256color`` unless ``env`` says otherwise), in its own
        session with the terminal as its controlling one. Without ``argv``: ``bash -i`` when the sandbox
        has bash, else ``sh -i``. At most :data:`.frames.MAX_PTYS` terminals per session at once. Starts
        the session; its close ends every terminal.
        """
        size = check_size(rows, cols)
        request = terminal_request(argv, user=user, cwd=cwd, env=env, timeout=timeout)

        def make(agent: Any, number: int, channel: Any) -> Terminal:
            return Terminal(agent, number, channel, on_close=self._live_closed)

        return self._start_live(request, make, size=size, kind="terminals", limit=MAX_PTYS)

    def spawn(
        self,
        argv: list[str] | tuple[str, ...],
        *,
        user: str | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 24 * 3600,
    ) -> Process:
        """Start ``argv`` and talk to it while it runs (:class:`.live.Process`): stdin, stdout, stderr.

        As a command (``user``, ``cwd``, ``env``, ``timeout`` as in :class:`ExecRequest`; its whole tree
        killed at its end), but its input is written while it runs and its output read as it comes, paced
        by the reader. At most :data:`MAX_BACKGROUND_GROUPS` at once per session (:meth:`processes`
        lists them); the session's close kills them.
        """
        request = live_request(argv, user=user, cwd=cwd, env=env or {}, timeout=timeout, what="spawn")

        def make(agent: Any, number: int, channel: Any) -> Process:
            return Process(request.argv or (), agent, number, channel, on_close=self._live_closed)

        return self._start_live(request, make, size=None, kind="processes", limit=MAX_BACKGROUND_GROUPS)

    def processes(self) -> list[Process]:
        """The spawned processes not yet closed (running, or ended and not yet read to their end)."""
        with _PORTS_LOCK:
            return [p for p in self._live_programs() if isinstance(p, Process)]

    def _live_programs(self) -> set[LiveChannel]:
        if self._live is None:
            self._live = set()
        return self._live

    def _start_live(
        self,
        request: ExecRequest,
        make: Callable[[Any, int, Any], _Live],
        *,
        size: tuple[int, int] | None,
        kind: str,
        limit: int,
    ) -> _Live:
        """Start a live program for ``request`` (refused, checked and prepared as a command is)."""
        request, started = self._admitted(request)
        transport = self._transport
        if not isinstance(transport, AgentTransport):
            raise PolicyNotEnforceableError(
                f"{self._WHERE} runs its commands on the {getattr(transport, 'channel', 'exec')} transport, "
                f"not the agent channel, which is what carries {kind}; it is refused"
            )
        with _PORTS_LOCK:
            if self._closed or self._ports_done:
                raise SandboxFailedError(self._GONE)
            live = self._live_programs()
            same = sum(1 for program in live if (kind == "terminals") == isinstance(program, Terminal))
            if same >= limit:
                raise InvalidRequestError(
                    f"{same} {kind} are open in this session, the most it may hold at once ({limit}); "
                    "close one first"
                )
        workspace = self._workspace
        if workspace is not None:
            workspace.before_command()
        command = self._prepare_command(request, request.argv or ())
        with self._explaining():
            program = transport.start_live(command, make, deadline=started + request.timeout, size=size)
        with _PORTS_LOCK:
            live.add(program)
        return program

    def _live_closed(self, program: LiveChannel) -> None:
        with _PORTS_LOCK:
            if self._live is not None:
                self._live.discard(program)
        workspace = self._workspace
        if workspace is not None and not self._ports_done:  # at the session's close its own last sync does it
            workspace.after_command()  # what the program changed comes back to the host

    def close(self) -> None:
        """End the live programs, stop publishing ports, then remove the sandbox (:meth:`_close_sandbox`).

        Idempotent. A session frozen in place is resumed first: its programs end and its workspace comes
        back as a running one's do. One paused to disk is removed as it is (nothing of it runs).
        """
        if not self._on_disk:
            self._wake()
        with _PORTS_LOCK:
            ports, self._ports, self._ports_done = self._ports, None, True
            live, self._live = list(self._live or ()), None
        for program in live:
            program.close()
        if ports is not None:
            ports.close()
        self._close_sandbox()


#: Guards a session's published ports being made or taken away (rare: one lock for all sessions).
_PORTS_LOCK = threading.Lock()
