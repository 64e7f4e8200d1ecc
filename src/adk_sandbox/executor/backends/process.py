"""ProcessBackend: runs requests as host processes, optionally wrapped by an OS enforcer (bubblewrap).

Each child leads its own process group, SIGKILLed on timeout, cancellation and normal exit; a process
that leaves the group can outlive it without an enforcer (``SUBPROCESS_ONLY``). Under bubblewrap a
:class:`~adk_sandbox.executor.network.NetworkPolicy` is served by an in-sandbox forwarder.
See docs/DESIGN.md, section "ProcessBackend", and docs/network.md, "Host processes under bubblewrap".
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from adk_sandbox.executor._env import build_child_env
from adk_sandbox.executor._languages import LANGUAGES, RUSTC_EDITION, check_argument_sizes, inline_argv
from adk_sandbox.executor._output import OutputCapture, start_pipe_reader
from adk_sandbox.executor._proctree import kill_process_group, wait_for_exit_unreaped
from adk_sandbox.executor._users import host_user
from adk_sandbox.executor.backend import OutputCallback, SandboxBackend
from adk_sandbox.executor.backends.bwrap import RUNTIME_READ_ONLY_PATHS
from adk_sandbox.executor.backends.enforcer import Confinement, Enforcer
from adk_sandbox.executor.backends.host_terminal import HostTerminal
from adk_sandbox.executor.channel.frames import MAX_PTYS
from adk_sandbox.executor.channel.terminal import check_size, terminal_request
from adk_sandbox.executor.errors import (
    BackendUnavailableError,
    InvalidRequestError,
    PolicyNotEnforceableError,
    SandboxFailedError,
)
from adk_sandbox.executor.network.addresses import IPAddress, IPNetwork, infrastructure_addresses
from adk_sandbox.executor.network.log import ConnectionLog, LogSnapshot
from adk_sandbox.executor.network.policy import NetworkPolicy, network_setting
from adk_sandbox.executor.network.unix_endpoint import CommandEgress
from adk_sandbox.executor.policy import SandboxPolicy
from adk_sandbox.executor.types import (
    Capabilities,
    ExecRequest,
    ExecResult,
    IsolationClass,
    Language,
    Stream,
)

if TYPE_CHECKING:
    from adk_sandbox.executor.network.intercept import Interceptor

__all__ = [
    "SYSTEM_PYTHONS",
    "ProcessBackend",
    "ProcessConfig",
    "Toolchain",
    "find_system_python",
    "probe_toolchain",
    "resolve_program",
]

SYSTEM_PYTHONS: tuple[str, ...] = ("/usr/bin/python3", "/bin/python3", "/usr/local/bin/python3")
"""Where the system's Python is looked for, first found first: it runs a network policy's forwarder inside
the sandbox (visible there through the runtime read-only paths, whatever the caller's own Python is)."""


class ProcessConfig(BaseModel):
    """A plain :class:`ProcessBackend` (no isolation: ``SUBPROCESS_ONLY``), for the backend factory."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["process"] = "process"
    workdir: str | None = None
    """Every command's working directory (default: a fresh scratch directory per execution)."""
    search_path: str | None = None
    """The PATH programs are resolved on (default: the caller's)."""

    def make(self) -> ProcessBackend:
        """The backend."""
        return ProcessBackend(workdir=self.workdir, search_path=self.search_path)


# How long to keep reading after the process tree was killed. Pipes normally reach EOF at once; only a
# process that escaped the group (possible without an enforcer) can hold them open longer.
_DRAIN_GRACE_SECONDS = 1.0

# What a host backend does differently from the shared table (executor._languages): programs are resolved
# to absolute paths on the caller's PATH, Python/JavaScript/Rust sources are written to the scratch
# directory (no argv limit), Rust is compiled by rustc as a step of its own; only ``command`` strings
# travel on the argv (inline_argv, in pieces when long).
# Exit status of a program that was not found (as a shell reports it), for an argv request.
_NOT_FOUND = 127


def resolve_program(name: str, search_path: str | None) -> str | None:
    """Resolve a bare program name on ``search_path`` (a PATH string) to an absolute path, or None.

    This happens in the caller's environment, *before* the child's environment is cleared, so the child
    gets an absolute path and needs no PATH of its own to start.
    """
    found = shutil.which(name, path=search_path)
    return os.path.abspath(found) if found else None


@dataclass(frozen=True)
class Toolchain:
    """How to start one language's program here, and which host paths its installation occupies."""

    program: str
    """Absolute path of the interpreter, compiler or shell."""
    install_roots: tuple[str, ...]
    """Host directories the program reads at run time (bound read-only inside an enforcer)."""
    extra_args: tuple[str, ...] = ()
    """Arguments the program needs in a cleared environment (e.g. rustc's absolute linker path)."""


class ProcessBackend(SandboxBackend):
    """Runs requests as host processes: ``SUBPROCESS_ONLY``, or ``OS_ENFORCED`` with an enforcer.

    ``workdir`` is the working directory of every command (default: a fresh scratch directory per
    execution); a request's ``cwd`` replaces it for that call: any host directory the caller can enter,
    and under an enforcer one the sandbox shows (allowed by the policy, or a runtime path such as
    ``/usr``), else ``InvalidRequestError``. ``search_path`` is the PATH programs are resolved on
    (default: the caller's ``PATH`` at execution time); an ``argv`` request's bare program name is
    resolved on the request's (or policy's) ``PATH`` when it sets one, else there, and a program found on
    neither gives exit status 127 with a message on stderr, as a shell would.

    Commands run as the caller: a request's ``user`` is accepted only when it names the caller's own
    uid (and gid), and refused with ``PolicyNotEnforceableError`` otherwise -- switching users needs
    privileges this backend deliberately does not use, even when the caller is root.

    ``network`` is ``False`` (the default: as the policy says, no route out under an enforcer unless it
    allows network), ``True`` (a route out: the policy's ``allow_network``, which is where the enforcer
    reads it) or a :class:`NetworkPolicy`, also as a mapping of its fields (``{"allow": [...]}``);
    anything else is an ``InvalidRequestError``. A policy needs the bubblewrap enforcer, a system Python
    (:data:`SYSTEM_PYTHONS`) and a SandboxPolicy that does not allow network; otherwise it is refused
    with ``PolicyNotEnforceableError``, never weakened. :meth:`network_log` is what it logged.
    """

    def __init__(
        self,
        *,
        workdir: str | os.PathLike[str] | None = None,
        search_path: str | None = None,
        enforcer: Enforcer | None = None,
        policy: SandboxPolicy | None = None,
        network: bool | NetworkPolicy | Mapping[str, object] = False,
    ) -> None:
        setting = network_setting(network)
        if enforcer is not None:
            policy = policy if policy is not None else SandboxPolicy()
            if setting is True:
                # One place decides the route out: the policy's allow_network (bwrap_arguments, confinement).
                policy = policy.model_copy(update={"allow_network": True})
            enforcer.check_policy(policy)
        elif policy is not None:
            raise PolicyNotEnforceableError(
                "a SandboxPolicy needs an enforcer to be applied to host processes; use "
                "ProcessBackend.with_sandbox(get_enforcer(), policy)"
            )
        self._forwarder_python: str | None = None
        if isinstance(setting, NetworkPolicy):
            if enforcer is None:
                raise PolicyNotEnforceableError(
                    "a NetworkPolicy needs an enforcer that takes the route out away (bubblewrap): a plain "
                    "host process reaches the network as the caller does; it is refused. Use "
                    "ProcessBackend.with_sandbox(get_enforcer(), policy, network=...)"
                )
            assert policy is not None  # noqa: S101 - set above with the enforcer
            enforcer.check_network_policy(policy)
            self._forwarder_python = find_system_python()
            if self._forwarder_python is None:
                raise PolicyNotEnforceableError(
                    "a NetworkPolicy under bubblewrap needs the system's Python 3 (one of "
                    f"{', '.join(SYSTEM_PYTHONS)}) to serve the proxy inside the sandbox, and none was "
                    "found; it is refused. Install python3, or use a DockerBackend"
                )
        self._network: bool | NetworkPolicy = setting
        self._network_log = ConnectionLog()
        self._infrastructure: frozenset[IPAddress | IPNetwork] | None = None
        self._workdir = os.path.abspath(workdir) if workdir is not None else None
        self._search_path = search_path
        self._enforcer = enforcer
        self._policy = policy if policy is not None else SandboxPolicy()
        self._toolchains: dict[tuple[Language, str], Toolchain] = {}
        self._toolchains_lock = threading.Lock()
        self._terminals: set[HostTerminal] = set()
        self._terminals_lock = threading.Lock()
        self.name = "process" if enforcer is None else f"process+{enforcer.name}"

    @classmethod
    def with_sandbox(
        cls,
        enforcer: Enforcer,
        policy: SandboxPolicy,
        *,
        workdir: str | os.PathLike[str] | None = None,
        search_path: str | None = None,
        network: bool | NetworkPolicy | Mapping[str, object] = False,
    ) -> ProcessBackend:
        """A backend whose every child (compile steps included) runs under ``enforcer`` and ``policy``.

        Raises ``PolicyNotEnforceableError`` if the enforcer cannot enforce the policy (or ``network``).
        """
        return cls(
            workdir=workdir, search_path=search_path, enforcer=enforcer, policy=policy, network=network
        )

    @property
    def policy(self) -> SandboxPolicy:
        """The policy in force (deny-all and unenforced when there is no enforcer)."""
        return self._policy

    @property
    def network(self) -> bool | NetworkPolicy:
        """The network of every command: a :class:`NetworkPolicy`, or whether there is a route out.

        Without an enforcer always True: a plain host process reaches the network as the caller does,
        whatever ``network=`` said (``capabilities().network`` is False: nothing is confined).
        """
        if isinstance(self._network, NetworkPolicy):
            return self._network
        return self._enforcer is None or self._network or self._policy.allow_network

    @property
    def egress(self) -> NetworkPolicy | None:
        """The network policy commands run under (None without one)."""
        return self._network if isinstance(self._network, NetworkPolicy) else None

    def set_network(self, network: bool | NetworkPolicy) -> None:
        """Refused: a host backend has no session whose network could be switched while it runs.

        Each command runs under the backend's ``network``; make another backend for another network.
        """
        del network
        raise PolicyNotEnforceableError(
            f"backend {self.name!r} cannot change its network at run time (set_network): its commands are "
            "host processes with no session to switch. Make another backend with the network you want "
            "(ProcessBackend(network=False or True); a NetworkPolicy needs bubblewrap: make_backend({'type': "
            "'bwrap', 'network': {'allow': [...]}})), or use a DockerBackend session"
        )

    def network_log(self) -> LogSnapshot:
        """The connections this backend's commands asked for under its network policy (bounded)."""
        return self._network_log.snapshot()

    @property
    def network_log_store(self) -> ConnectionLog:
        """The connection log itself (``network_log()`` gives a snapshot of it)."""
        return self._network_log

    def isolation(self) -> IsolationClass:
        """OS_ENFORCED under an enforcer, else SUBPROCESS_ONLY (without probing the toolchains)."""
        return IsolationClass.SUBPROCESS_ONLY if self._enforcer is None else IsolationClass.OS_ENFORCED

    def capabilities(self) -> Capabilities:
        """Honest report: without an enforcer only the timeout and the environment are controlled."""
        languages = tuple(lang for lang in LANGUAGES if self._find_toolchain(lang) is not None)
        if self._enforcer is None:
            isolation = IsolationClass.SUBPROCESS_ONLY
            confined = Confinement(network=False, fs_read=False, fs_write=False, pids=False)
        else:
            isolation = IsolationClass.OS_ENFORCED
            confined = self._enforcer.confinement(self._policy)
        return Capabilities(
            isolation=isolation,
            timeout=True,  # the process group (or bwrap's PID namespace) is killed at the deadline
            memory=False,
            cpu=False,
            pids=confined.pids,
            network=confined.network,
            fs_read=confined.fs_read,
            fs_write=confined.fs_write,
            env=True,  # children get only policy and request env, never the host's
            languages=languages,
            # An enforcer that confines reads shows the command only the bound paths (and its own
            # scratch dir, /proc, /dev): not the host's filesystem as it is.
            host_filesystem=not confined.fs_read,
            # Under an enforcer the host's variables are host state its sandbox keeps out, like the files.
            host_environment=self._enforcer is None,
            host_programs=True,  # bare names resolve on the caller's PATH; bwrap binds their runtimes
            # Under a policy `network` stays True (no route out): the proxy reaches what it allows.
            network_policy=self.egress,
        )

    def execute(
        self,
        request: ExecRequest,
        on_output: OutputCallback | None = None,
        *,
        cancel: threading.Event | None = None,
    ) -> ExecResult:
        """Run ``request`` as a host process (see the class docstring for what is enforced)."""
        started = time.monotonic()
        deadline = started + request.timeout
        self._check_user(request.user)
        if request.background:
            # A host command's processes are killed with its process group (or bubblewrap's PID
            # namespace) at its exit; there is no session for survivors to belong to and die with.
            raise InvalidRequestError(
                f"backend {self.name!r} cannot keep background processes: everything a command starts is "
                "killed when it exits, and there is no session for them to outlive it in. Omit background, "
                "or run the command in a DockerBackend session (the agent channel keeps them until it closes)"
            )
        env = build_child_env(policy_env=self._policy.env, request_env=request.env)
        if request.argv is not None:
            check_argument_sizes(request.argv, self.name)
            toolchain = self._argv_toolchain(request.argv[0], env)
        else:
            toolchain = self._require_toolchain(request)
        self._check_enforceable(request)
        if request.cwd is not None:
            self._check_cwd(request.cwd, toolchain)
        # A failing on_output callback (called from the reader thread) must stop the wait at once: the
        # command is killed and the callback's exception raised, as on every backend.
        stop = _StopEvent(cancel)
        capture = OutputCapture(
            request.output_cap, _stopping_on_error(on_output, stop), keep_tail=request.truncate == "head_tail"
        )
        stdin = request.stdin_bytes

        with tempfile.TemporaryDirectory(prefix="adk-sandbox-") as scratch, self._command_egress() as egress:
            if egress is not None:
                env.update(egress.env)  # the trust bundle's variables (header injection); the proxy's: inside
            runner = _StepRunner(
                enforcer=self._enforcer,
                policy=self._policy,
                toolchain=toolchain or Toolchain(program="", install_roots=()),
                scratch=scratch,
                workdir=request.cwd or self._workdir or scratch,
                env=env,
                capture=capture,
                deadline=deadline,
                cancel=stop,
                egress=egress,
                forwarder_python=self._forwarder_python,
            )
            outcome = self._run_steps(request, runner, toolchain, scratch, stdin)

        streams = capture.finish()
        return ExecResult(
            stdout=streams["stdout"].text,
            stderr=streams["stderr"].text,
            exit_code=outcome.exit_code,
            timed_out=outcome.timed_out,
            cancelled=outcome.cancelled,
            stdout_truncated=streams["stdout"].truncated,
            stderr_truncated=streams["stderr"].truncated,
            duration_ms=int((time.monotonic() - started) * 1000),
        )

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
    ) -> HostTerminal:
        """A program on a new terminal of the host (:class:`.host_terminal.HostTerminal`); a shell by default.

        As a command of this backend (its enforcer, policy, network and working directory; ``user``,
        ``cwd``, ``env`` and ``timeout`` as in :class:`ExecRequest`; ``TERM`` is ``xterm-256color`` unless
        ``env`` says otherwise), in its own session with the terminal as its controlling one. Without
        ``argv``: ``bash -i`` when the host has bash, else ``sh -i``. At most :data:`MAX_PTYS` at once;
        :meth:`close` ends them.
        """
        size = check_size(rows, cols)
        request = terminal_request(argv, user=user, cwd=cwd, env=env, timeout=timeout)
        program = request.argv or ()
        self._check_user(request.user)
        child_env = build_child_env(policy_env=self._policy.env, request_env=request.env)
        check_argument_sizes(program, self.name)
        toolchain = self._argv_toolchain(program[0], child_env)
        self._check_enforceable(request)
        if request.cwd is not None:
            self._check_cwd(request.cwd, toolchain)
        setsid, env_program = shutil.which("setsid"), shutil.which("env")
        needed: tuple[tuple[str, str | None], ...] = (
            (program[0], toolchain.program if toolchain else None),
            ("setsid", setsid),
            ("env", env_program),
        )
        for name, path in needed:
            if path is None:
                raise InvalidRequestError(
                    f"{name}: program not found on backend {self.name!r}; nothing was started"
                )
            if self._enforcer is not None and not self._visible(os.path.realpath(path), ()):
                raise InvalidRequestError(
                    f"{path} is not visible in the {self._enforcer.name} sandbox (allow its directory in the "
                    "policy); nothing was started"
                )
        assert toolchain is not None and setsid is not None and env_program is not None  # noqa: S101 - checked just above
        with self._terminals_lock:
            if len(self._terminals) >= MAX_PTYS:
                raise InvalidRequestError(
                    f"{len(self._terminals)} terminals are open on backend {self.name!r}, the most it may "
                    f"hold at once ({MAX_PTYS}); close one first"
                )
            with contextlib.ExitStack() as stack:
                scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="adk-sandbox-"))
                egress = stack.enter_context(self._command_egress())
                if egress is not None:
                    child_env.update(egress.env)
                workdir = request.cwd or self._workdir or scratch
                # `setsid -c` (in the sandbox, under an enforcer) makes the terminal the program's
                # controlling one; `-w` keeps its status when it must fork (bwrap made it a session leader).
                # `env --default-signal`: Ctrl-C and Ctrl-\ work even when this process was started with
                # them ignored (nohup, a shell's background job), which a shell would otherwise keep.
                line = _command_line(
                    [
                        env_program,
                        "--default-signal=INT,QUIT",
                        setsid,
                        "-w",
                        "-c",
                        toolchain.program,
                        *program[1:],
                    ],
                    enforcer=self._enforcer,
                    policy=self._policy,
                    workdir=workdir,
                    scratch=scratch,
                    runtime_paths=(),
                    egress=egress,
                    forwarder_python=self._forwarder_python,
                )
                resources = stack.pop_all()

            def closed(terminal: HostTerminal) -> None:
                with self._terminals_lock:
                    self._terminals.discard(terminal)
                resources.close()  # the scratch directory and the network policy's socket

            try:
                terminal = HostTerminal(
                    line,
                    env=child_env,
                    cwd=workdir,
                    size=size,
                    timeout=request.timeout,
                    # Under an enforcer the host's group is bwrap's (the sandbox dies with it); without,
                    # setsid makes the program lead its own.
                    new_session=self._enforcer is not None,
                    on_close=closed,
                )
            except BaseException:
                resources.close()
                raise
            self._terminals.add(terminal)
        return terminal

    def close(self) -> None:
        """End the terminals this backend opened (:meth:`open_pty`); idempotent."""
        with self._terminals_lock:
            terminals = list(self._terminals)
        for terminal in terminals:
            terminal.close()

    # -- internals -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _command_egress(self) -> Iterator[CommandEgress | None]:
        """One command's host side of the network policy (None without one): its socket and listener."""
        policy = self.egress
        if policy is None:
            yield None
            return
        intercept: Interceptor | None = None
        if policy.headers:
            # Imported here: only a policy with headers needs cryptography's CA (a fresh one per command,
            # so nothing of it outlives the command and it never nears its expiry).
            from adk_sandbox.executor.network.intercept import Interceptor  # noqa: PLC0415

            intercept = Interceptor(policy)
        try:
            if self._infrastructure is None:  # this machine's own addresses: found once per backend
                self._infrastructure = infrastructure_addresses()
            egress = CommandEgress(
                policy, self._network_log, intercept=intercept, extra_refused=self._infrastructure
            )
        except (OSError, ValueError) as exc:
            raise SandboxFailedError(f"the network policy's socket could not be set up: {exc}") from exc
        with egress:
            yield egress

    def _run_steps(
        self,
        request: ExecRequest,
        runner: _StepRunner,
        toolchain: Toolchain | None,
        scratch: str,
        stdin: bytes | None,
    ) -> _StepOutcome:
        if request.argv is not None:
            missing = None
            if toolchain is None:
                missing = "program not found"
            elif self._enforcer is not None and not self._visible(os.path.realpath(toolchain.program), ()):
                # Never widened for an argv program: binding its directory could expose host files.
                missing = (
                    f"{toolchain.program} is not visible in the {self._enforcer.name} sandbox (allow its "
                    "directory in the policy)"
                )
            if missing is not None or toolchain is None:
                runner.capture.feed("stderr", f"adk-sandbox: {request.argv[0]}: {missing}\n".encode())
                return _StepOutcome(exit_code=_NOT_FOUND, timed_out=False, cancelled=False)
            # The program runs under its resolved path (bwrap could not set another argv[0]); a bare name
            # found on PATH keeps its base name there.
            return runner.run([toolchain.program, *request.argv[1:]], stdin)
        assert toolchain is not None and request.language is not None and request.code is not None  # noqa: S101
        if request.language is Language.COMMAND:
            return runner.run(list(inline_argv(Language.COMMAND, request.code, toolchain.program)), stdin)
        source_name = LANGUAGES[request.language].source_file
        assert source_name is not None  # noqa: S101 - every language but command has a source file
        source = os.path.join(scratch, source_name)
        with open(source, "w", encoding="utf-8") as handle:
            handle.write(request.code)
        if request.language is Language.RUST:
            binary = os.path.join(scratch, "main")
            # Compiling goes through the same runner: same enforcer, limits and deadline as the run.
            outcome = runner.run([toolchain.program, *toolchain.extra_args, "-o", binary, source], None)
            if outcome.exit_code == 0:
                outcome = runner.run([binary], stdin)
            return outcome
        return runner.run([toolchain.program, source], stdin)

    def _check_user(self, user: str | None) -> None:
        """Refuse any identity but the caller's own (names are the host's: ``pwd``/``grp``)."""
        if user is None:
            return
        uid, gid = host_user(user)
        if uid == os.geteuid() and gid in (None, os.getegid()):
            return  # the caller's own identity: nothing to switch
        raise PolicyNotEnforceableError(
            f"backend {self.name!r} runs commands as the caller ({os.geteuid()}:{os.getegid()}) and cannot "
            f"run them as user {user!r}: switching users needs privileges it does not use. Omit user, or "
            "run the command in a DockerBackend session, which runs each call as any uid:gid"
        )

    def _check_cwd(self, cwd: str, toolchain: Toolchain | None) -> None:
        """A cwd the command could not enter is refused before anything runs (as on every backend)."""
        if not os.path.isdir(cwd) or not os.access(cwd, os.X_OK):
            raise InvalidRequestError(
                f"cwd {cwd!r} is not a directory the command can enter on backend {self.name!r}; "
                "nothing ran. Create it first or give another cwd"
            )
        if self._enforcer is None:
            return
        if not self._visible(cwd, toolchain.install_roots if toolchain else ()):
            raise InvalidRequestError(
                f"cwd {cwd!r} is not visible in the {self._enforcer.name} sandbox of backend {self.name!r} "
                "(not among the policy's allowed paths); nothing ran. Allow it with allow_read() or "
                "allow_read_write(), or give a cwd inside an allowed path"
            )

    def _visible(self, path: str, runtime_roots: tuple[str, ...]) -> bool:
        """Whether ``path`` is shown in the enforcer's sandbox: allowed by the policy, or a runtime path."""
        target = os.path.normpath(path)
        roots = (*RUNTIME_READ_ONLY_PATHS, *runtime_roots)
        return self._policy.covers(target) or any(
            target == root or target.startswith(root.rstrip("/") + "/") for root in roots
        )

    def _argv_toolchain(self, program: str, env: dict[str, str]) -> Toolchain | None:
        """The program of an argv request, resolved like a shell would; None when it is not found."""
        if "/" in program:
            path: str | None = os.path.abspath(program) if os.access(program, os.X_OK) else None
        else:
            search_path = env.get("PATH") or self._search_path or os.environ.get("PATH")
            path = resolve_program(program, search_path)
        if path is None or os.path.isdir(path):
            return None
        # Nothing more is bound for it under an enforcer: it must be visible there already (checked when
        # it runs), since binding its installation could expose host files the policy keeps out.
        return Toolchain(program=path, install_roots=())

    def _check_enforceable(self, request: ExecRequest) -> None:
        if request.memory_limit_mb is not None:
            raise PolicyNotEnforceableError(
                f"backend {self.name!r} cannot enforce memory_limit_mb={request.memory_limit_mb}; "
                "refusing to run without it. Use a DockerBackend for memory limits."
            )
        if self._enforcer is None:
            return
        for allowed in self._policy.allowed_paths:
            if not os.path.exists(allowed.path):
                raise InvalidRequestError(f"allowed path {allowed.path!r} does not exist")
        if self._workdir is not None and not self._policy.covers(self._workdir):
            raise PolicyNotEnforceableError(
                f"workdir {self._workdir!r} is not among the policy's allowed paths, so the sandboxed "
                "command could not see its own working directory; allow it with allow_read_write()"
            )

    def _require_toolchain(self, request: ExecRequest) -> Toolchain:
        assert request.language is not None  # noqa: S101 - a request without argv has a language
        if request.language not in LANGUAGES:
            supported = ", ".join(lang.value for lang in LANGUAGES)
            raise InvalidRequestError(
                f"language {request.language.value!r} is not supported by backend {self.name!r}; "
                f"supported: {supported}"
            )
        toolchain = self._find_toolchain(request.language)
        if toolchain is None:
            known = LANGUAGES[request.language]
            raise BackendUnavailableError(
                f"{known.program!r} (needed for {request.language.value}) was not found on PATH; "
                f"{known.install_hint}"
            )
        return toolchain

    def _find_toolchain(self, language: Language) -> Toolchain | None:
        search_path = self._search_path if self._search_path is not None else os.environ.get("PATH")
        key = (language, search_path or "")
        with self._toolchains_lock:
            if key not in self._toolchains:
                toolchain = probe_toolchain(language, search_path)
                if toolchain is None:
                    return None
                self._toolchains[key] = toolchain
            return self._toolchains[key]


def find_system_python() -> str | None:
    """The system's Python 3 (the first of :data:`SYSTEM_PYTHONS` that runs, 3.8 or later), or None.

    Only one that lies under the runtime read-only paths (its real path too) counts: it must be visible
    in the sandbox without binding anything more. It is started isolated (``-I -S``) to check.
    """
    for candidate in SYSTEM_PYTHONS:
        real = os.path.realpath(candidate)
        visible = all(
            any(path == root or path.startswith(root + "/") for root in RUNTIME_READ_ONLY_PATHS)
            for path in (candidate, real)
        )
        if not visible or not os.access(real, os.X_OK):
            continue
        check = [candidate, "-I", "-S", "-c", "import sys; sys.exit(sys.version_info < (3, 8))"]
        try:
            done = subprocess.run(check, capture_output=True, timeout=30, env={}, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return candidate
    return None


def probe_toolchain(language: Language, search_path: str | None) -> Toolchain | None:
    """How to start ``language``'s program found on ``search_path`` in a cleared environment, or None.

    Also used by the Rust pipeline (``adk_sandbox.executor.rust``), which runs rustc through ``sh`` on host
    backends.
    """
    program = resolve_program(LANGUAGES[language].program, search_path)
    if program is None:
        return None
    if language is Language.PYTHON:
        return _python_toolchain(program)
    if language is Language.RUST:
        return _rust_toolchain(program, search_path)
    # A shell or node: the installation is the prefix above its bin/ directory (e.g. /usr).
    real = os.path.realpath(program)
    return Toolchain(program=program, install_roots=(os.path.dirname(os.path.dirname(real)),))


def _ask(argv: Sequence[str]) -> list[str] | None:
    # Asked once, in the caller's environment: version managers (pyenv, rustup) need it to answer.
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.split("\n") if done.returncode == 0 else None


def _python_toolchain(program: str) -> Toolchain | None:
    # A pyenv shim is a script that needs the caller's environment; the interpreter it selects does not.
    lines = _ask(
        [
            program,
            "-c",
            "import sys; print(sys.executable); print(sys.prefix); print(sys.base_prefix)",
        ]
    )
    if lines is None or len(lines) < 3 or not lines[0]:
        return None
    return Toolchain(program=lines[0], install_roots=tuple(dict.fromkeys(lines[1:3])))


def _rust_toolchain(program: str, search_path: str | None) -> Toolchain | None:
    # rustup installs a proxy that needs RUSTUP_HOME/HOME; the real compiler lives in the sysroot.
    lines = _ask([program, "--print", "sysroot"])
    linker = resolve_program("cc", search_path)
    if lines is None or not lines[0] or linker is None:
        return None
    sysroot = lines[0]
    real = os.path.join(sysroot, "bin", "rustc")
    return Toolchain(
        program=real if os.path.exists(real) else program,
        install_roots=(sysroot,),
        # With no PATH in the cleared environment rustc could not find its linker by name.
        extra_args=(RUSTC_EDITION, "-C", f"linker={linker}"),
    )


@dataclass(frozen=True)
class _StepOutcome:
    exit_code: int | None
    timed_out: bool
    cancelled: bool


def _command_line(
    argv: list[str],
    *,
    enforcer: Enforcer | None,
    policy: SandboxPolicy,
    workdir: str,
    scratch: str,
    runtime_paths: tuple[str, ...],
    egress: CommandEgress | None,
    forwarder_python: str | None,
) -> list[str]:
    """``argv`` as the host starts it: behind the network policy's forwarder and the enforcer, if any."""
    egress_dir = None
    if egress is not None:
        # Checked when the backend was made: a policy has the bubblewrap enforcer and a system Python.
        assert enforcer is not None and forwarder_python is not None  # noqa: S101
        argv = egress.wrap(forwarder_python, argv)
        egress_dir = egress.directory
    if enforcer is not None:
        argv = enforcer.wrap(
            argv,
            policy=policy,
            workdir=workdir,
            scratch_dir=scratch,
            runtime_paths=runtime_paths,
            egress_dir=egress_dir,
        )
    return argv


@dataclass(frozen=True)
class _StepRunner:
    """Runs the steps of one execution (compile, run) with a shared deadline and output capture."""

    enforcer: Enforcer | None
    policy: SandboxPolicy
    toolchain: Toolchain
    scratch: str
    workdir: str
    env: dict[str, str]
    capture: OutputCapture
    deadline: float
    cancel: threading.Event | None
    egress: CommandEgress | None = None
    forwarder_python: str | None = None

    def run(self, argv: list[str], stdin: bytes | None) -> _StepOutcome:
        argv = _command_line(
            argv,
            enforcer=self.enforcer,
            policy=self.policy,
            workdir=self.workdir,
            scratch=self.scratch,
            runtime_paths=self.toolchain.install_roots,
            egress=self.egress,
            forwarder_python=self.forwarder_python,
        )
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        in_read, in_write = os.pipe() if stdin is not None else (None, None)
        try:
            proc = subprocess.Popen(
                argv,
                stdin=in_read if in_read is not None else subprocess.DEVNULL,
                stdout=out_write,
                stderr=err_write,
                env=self.env,
                cwd=self.workdir,
                start_new_session=True,  # leader of a new process group: the unit we kill
                close_fds=True,
            )
        except OSError as exc:
            for fd in (out_read, err_read, in_write):
                if fd is not None:
                    os.close(fd)
            # The program was resolved before; failing to start it now is the sandbox's failure.
            raise SandboxFailedError(f"could not start {argv[0]!r}: {exc}") from exc
        finally:
            for fd in (out_write, err_write, in_read):
                if fd is not None:
                    os.close(fd)

        reader = start_pipe_reader({"stdout": out_read, "stderr": err_read}, self.capture)
        writer = _StdinWriter(in_write, stdin) if in_write is not None and stdin is not None else None
        exited = False
        try:
            exited = wait_for_exit_unreaped(proc, self.deadline, self.cancel)
        finally:
            # Always, also after a normal exit: leftovers such as `cmd &` die with the execution.
            kill_process_group(proc.pid)
            proc.wait()
            if writer is not None:
                writer.stop()
            reader.finish(_DRAIN_GRACE_SECONDS)
        if reader.error is not None:
            raise reader.error
        cancelled = not exited and self.cancel is not None and self.cancel.is_set()
        if not exited:
            return _StepOutcome(exit_code=None, timed_out=not cancelled, cancelled=cancelled)
        code = proc.returncode
        return _StepOutcome(exit_code=code if code >= 0 else None, timed_out=False, cancelled=False)


class _StdinWriter:
    """Feeds stdin from a thread so that a child that does not read it cannot block the backend."""

    def __init__(self, fd: int, data: bytes) -> None:
        self._fd = fd
        self._data = data
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="adk-sandbox-stdin", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()

    def _run(self) -> None:
        os.set_blocking(self._fd, False)
        view = memoryview(self._data)
        try:
            while view and not self._stopped.is_set():
                _, writable, _ = select.select([], [self._fd], [], 0.1)
                if not writable:
                    continue
                try:
                    written = os.write(self._fd, view[:65536])
                except BlockingIOError:
                    continue
                view = view[written:]
        except (BrokenPipeError, OSError):
            pass  # the child closed stdin or died: what it did not read is not an error
        finally:
            with contextlib.suppress(OSError):
                os.close(self._fd)


class _StopEvent(threading.Event):
    """Set by a failing ``on_output`` callback; also reads as set when the caller's ``cancel`` is."""

    def __init__(self, cancel: threading.Event | None) -> None:
        super().__init__()
        self._cancel = cancel

    def is_set(self) -> bool:
        """True once the callback failed or the caller cancelled."""
        return super().is_set() or (self._cancel is not None and self._cancel.is_set())


def _stopping_on_error(on_output: OutputCallback | None, stop: threading.Event) -> OutputCallback | None:
    if on_output is None:
        return None
    callback = on_output

    def guarded(stream: Stream, text: str) -> None:
        try:
            callback(stream, text)
        except BaseException:
            stop.set()  # the reader thread re-raises it in the caller's thread after the kill
            raise

    return guarded
