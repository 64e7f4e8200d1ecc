"""Core value types shared by every backend: requests, results, isolation classes and capabilities."""

from __future__ import annotations

import enum
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from adk_sandbox.executor.network.policy import NetworkPolicy

__all__ = [
    "DEFAULT_MAX_OUTPUT_BYTES",
    "MAX_BACKGROUND_GROUPS",
    "Capabilities",
    "ExecRequest",
    "ExecResult",
    "IsolationClass",
    "Language",
    "ResourceLimits",
    "Stream",
    "check_user",
    "is_numeric_user",
    "parse_user",
    "validate_env",
]

DEFAULT_MAX_OUTPUT_BYTES = 1024 * 1024
"""Per-stream output cap used when a request does not set ``max_output_bytes`` (1 MiB)."""

MAX_BACKGROUND_GROUPS = 16
"""``background=True`` commands whose processes a Docker session keeps at once, per user (each user's
commands have their own in-sandbox agent): a bound, so a loop of background calls cannot pile up survivors
without end. One counts from its start until the last process it left has exited (or the session closes)."""

Stream = Literal["stdout", "stderr"]
"""The name of an output stream, as passed to ``on_output`` callbacks."""


class Language(enum.StrEnum):
    """What ``ExecRequest.code`` is: a shell command string or a program in a language.

    A request that runs a program directly gives ``argv`` instead, and no language.
    """

    COMMAND = "command"
    """A ``sh -c`` command string."""
    PYTHON = "python"
    JAVASCRIPT = "javascript"
    TYPESCRIPT = "typescript"
    RUST = "rust"
    WASM = "wasm"


_ISOLATION_ORDER = ("subprocess_only", "os_enforced", "container", "gvisor", "microvm", "wasm")


class IsolationClass(enum.StrEnum):
    """How strongly a backend isolates what it runs, ordered weakest to strongest.

    Comparisons follow that order (``cls >= IsolationClass.CONTAINER``), not the alphabetical order of the
    string values.
    """

    SUBPROCESS_ONLY = "subprocess_only"
    """A plain host process: only the timeout and environment are controlled."""
    OS_ENFORCED = "os_enforced"
    """A host process inside OS namespaces (bubblewrap): filesystem and network confined by the kernel."""
    CONTAINER = "container"
    """A Docker container under runc: namespaces, cgroups, dropped capabilities, seccomp."""
    GVISOR = "gvisor"
    """A container under gVisor's user-space kernel (runsc): the host kernel is not directly exposed."""
    MICROVM = "microvm"
    """A virtual machine of its own (QEMU microvm): its own kernel, no network device, host files unshared."""
    WASM = "wasm"
    """A WebAssembly module in wasmtime: no syscalls beyond the WASI functions it is given."""

    @property
    def rank(self) -> int:
        """Position in the weakest-to-strongest order (0 = weakest)."""
        return _ISOLATION_ORDER.index(self.value)

    # Every comparison is defined here: str's own (alphabetical) ones would otherwise answer for a plain
    # string operand, and `SUBPROCESS_ONLY >= "container"` would be True -- a check failing open.
    def __lt__(self, other: object) -> bool:
        return self.rank < _rank_of(other)

    def __le__(self, other: object) -> bool:
        return self.rank <= _rank_of(other)

    def __gt__(self, other: object) -> bool:
        return self.rank > _rank_of(other)

    def __ge__(self, other: object) -> bool:
        return self.rank >= _rank_of(other)

    __hash__ = str.__hash__


def _rank_of(other: object) -> int:
    """Rank of an isolation class given as the enum or its string value; TypeError for anything else."""
    if isinstance(other, str):
        try:
            return IsolationClass(other).rank
        except ValueError:
            pass
    raise TypeError(f"cannot order an IsolationClass against {other!r}")


def validate_env(env: dict[str, str]) -> dict[str, str]:
    """Check that every variable could really be passed to a process; return ``env`` unchanged.

    Raises ``ValueError`` naming the bad variable: an empty name, ``=`` in a name, or a NUL byte anywhere
    would be silently mangled or rejected by ``execve`` later.
    """
    for name, value in env.items():
        if not name or "=" in name or "\0" in name:
            raise ValueError(f"invalid environment variable name {name!r}: must be non-empty, no '=' or NUL")
        if "\0" in value:
            raise ValueError(f"environment variable {name!r} contains a NUL byte")
    return env


_USER = re.compile(r"([0-9]{1,10})(?::([0-9]{1,10}))?")
_MAX_ID = 2**32 - 2  # (uid_t)-1 means "unchanged" to the kernel: never a real id


_NAME = r"(?:[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?|[0-9]{1,10})"
_NAMED_USER = re.compile(f"{_NAME}(?::{_NAME})?")


def check_user(user: str) -> str:
    """``user`` as given if it names a user: ``"uid"``, ``"uid:gid"``, or names (``"root"``, ``"app:app"``).

    Names are looked up where the command runs (a container's ``/etc/passwd`` and ``/etc/group``);
    ``ValueError`` for anything that is neither a number nor a name.
    """
    if is_numeric_user(user):
        parse_user(user)  # the range of the ids
        return user
    if _NAMED_USER.fullmatch(user) is None:
        raise ValueError(
            f"user must be a uid, 'uid:gid', or user and group names ('root', 'app:app'), not {user!r}"
        )
    return user


def is_numeric_user(user: str) -> bool:
    """True for ``"uid"`` or ``"uid:gid"`` in numbers (nothing to look up)."""
    return _USER.fullmatch(user) is not None


def parse_user(user: str) -> tuple[int, int | None]:
    """``"uid"`` or ``"uid:gid"`` as numbers (gid None when not given); ``ValueError`` for anything else."""
    match = _USER.fullmatch(user)
    if match is None:
        raise ValueError(f"user must be numeric 'uid' or 'uid:gid' (e.g. '1000:1000'), not {user!r}")
    uid, gid = int(match[1]), int(match[2]) if match[2] is not None else None
    if uid > _MAX_ID or (gid is not None and gid > _MAX_ID):
        raise ValueError(f"user {user!r}: ids must be at most {_MAX_ID}")
    return uid, gid


class ExecRequest(BaseModel):
    """One program or command to run. Immutable; ``timeout`` is required (there is no silent default).

    What runs is given in exactly one of two ways:

    * ``language`` + ``code``: a ``sh -c`` command string (``command``) or a program's source text;
    * ``argv`` (and no ``language``, no ``code``): a program and its arguments, started directly -- no
      shell, so ``$(...)``, ``;``, globs and quotes in the arguments reach the program as they are. A bare
      program name is looked up on the command's ``PATH`` (the backend's default one unless ``env`` sets it).

    ``cwd`` and ``user`` change where and as whom it runs for this call only. A backend that cannot honour
    one of them refuses the request (``InvalidRequestError`` or ``PolicyNotEnforceableError``) rather than
    run it differently; a ``cwd`` that is not a directory the command can enter is refused with
    ``InvalidRequestError`` (nothing ran) on every backend.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    language: Language | None = None
    """What ``code`` is; required with ``code``, omitted with ``argv``."""
    code: str | None = None
    """The command string (``command``) or the program's source text; omitted with ``argv``."""
    argv: tuple[str, ...] | None = None
    """A program and its arguments, run without a shell (instead of ``language`` and ``code``).

    Non-empty, no NUL byte anywhere, a non-empty program. Linux limits each argument to 128 KiB
    (``MAX_ARG_STRLEN``) on every backend that starts a real program: pass bigger data on ``stdin``."""
    stdin: str | bytes | None = None
    """Fed to the program's standard input: text (sent as UTF-8) or bytes (sent unchanged, NULs
    included); ``None`` means ``/dev/null``."""
    cwd: str | None = None
    """Working directory for this call, an absolute path as the command sees it (inside the container or
    sandbox); ``None``: the backend's default (a session's workspace root, a host backend's workdir)."""
    user: str | None = None
    """Who runs this call: ``"uid"``, ``"uid:gid"``, or names (``"root"``, ``"app:app"``, looked up in the
    sandbox's ``/etc/passwd`` and ``/etc/group``, the host's for a host backend); ``None``: the backend's
    default. Only backends that can switch users honour it (a Docker session); others refuse any other
    identity than their own."""
    timeout: Annotated[float, Field(gt=0, le=24 * 3600)]
    """Wall-clock limit in seconds for the whole execution (compile steps included)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Variables added to the cleared environment; they override the policy's."""
    memory_limit_mb: Annotated[int, Field(gt=0)] | None = None
    """Memory limit; a backend that cannot enforce it refuses the request."""
    max_output_bytes: Annotated[int, Field(gt=0)] | None = None
    """Bytes kept per stream; ``None`` means the backend default (1 MiB). The rest is read and dropped."""
    truncate: Literal["head", "head_tail"] = "head"
    """Which part of a stream longer than the cap is kept: ``"head"`` its first ``max_output_bytes``;
    ``"head_tail"`` its first half and its last half (``max_output_bytes // 2``), the text joined by a
    line ``[... N bytes omitted ...]``. Output beyond the head reaches ``on_output`` only at the end
    (which bytes are the tail is known only then). Every backend honours it, the Docker agent inside
    the container (a flood still costs the host nothing)."""
    background: bool = False
    """Let processes the command leaves behind outlive it (a server it starts with ``cmd &``, ``setsid``
    or a double fork), until the session closes. By default (``False``) nothing outlives its command: at
    its exit every process it started is killed. With ``True`` the call still returns when the command
    itself exits (its output up to then, its exit status); what it left running is kept, and killed when
    the session closes, its in-sandbox agent exits or is replaced, or its container is removed. Their
    output after the command's exit is read and discarded. A command that times out or is cancelled is
    killed with its whole tree, background or not. Only a Docker session over the agent channel keeps
    them, for at most :data:`MAX_BACKGROUND_GROUPS` such commands at once per session and user (one
    more is refused with ``InvalidRequestError``, nothing ran); every other backend refuses
    ``background=True`` with ``InvalidRequestError`` rather than kill what the caller asked to keep."""

    @field_validator("code")
    @classmethod
    def _no_nul_in_code(cls, code: str | None) -> str | None:
        if code is not None and "\0" in code:
            raise ValueError("code contains a NUL byte, which cannot be passed to a program")
        return code

    @field_validator("argv")
    @classmethod
    def _argv_is_passable(cls, argv: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if argv is None:
            return None
        if not argv:
            raise ValueError("argv must name a program: give at least one element")
        if not argv[0]:
            raise ValueError("argv[0] (the program) must not be empty")
        for index, arg in enumerate(argv):
            if "\0" in arg:
                raise ValueError(f"argv[{index}] contains a NUL byte, which cannot be passed to a program")
        return argv

    @field_validator("cwd")
    @classmethod
    def _cwd_is_absolute(cls, cwd: str | None) -> str | None:
        if cwd is None:
            return None
        if "\0" in cwd:
            raise ValueError("cwd contains a NUL byte")
        if not cwd.startswith("/"):
            raise ValueError(f"cwd must be an absolute path, not {cwd!r}")
        return cwd

    @field_validator("user")
    @classmethod
    def _user_is_valid(cls, user: str | None) -> str | None:
        if user is not None:
            check_user(user)
        return user

    @field_validator("env")
    @classmethod
    def _env_is_passable(cls, env: dict[str, str]) -> dict[str, str]:
        return validate_env(env)

    @model_validator(mode="after")
    def _one_way_to_run(self) -> ExecRequest:
        if self.argv is not None:
            if self.code is not None:
                raise ValueError("give either code (with a language) or argv, not both")
            if self.language is not None:
                raise ValueError(
                    "argv runs a program directly and takes no language; omit language (or give "
                    "language and code instead of argv)"
                )
        elif self.code is None:
            raise ValueError("nothing to run: give language and code, or argv")
        elif self.language is None:
            raise ValueError(
                "code needs a language: one of " + ", ".join(language.value for language in Language)
            )
        return self

    @property
    def output_cap(self) -> int:
        """The per-stream byte cap in force for this request."""
        return self.max_output_bytes if self.max_output_bytes is not None else DEFAULT_MAX_OUTPUT_BYTES

    @property
    def stdin_bytes(self) -> bytes | None:
        """``stdin`` as the bytes the program reads (text encoded as UTF-8); None for ``/dev/null``."""
        if isinstance(self.stdin, str):
            return self.stdin.encode("utf-8")
        return self.stdin


class ExecResult(BaseModel):
    """What an execution produced. A non-zero exit code is a result, never an exception."""

    stdout: str
    """Standard output, decoded as UTF-8 (invalid bytes replaced), at most the per-stream cap."""
    stderr: str
    """Standard error, decoded like ``stdout``."""
    exit_code: int | None
    """The program's exit status; ``None`` when it was killed by a signal, timed out or was cancelled."""
    timed_out: bool = False
    """The timeout expired and the whole process tree was killed."""
    oom_killed: bool = False
    """The memory limit was hit and the program was killed for it."""
    cancelled: bool = False
    """The caller cancelled the execution and the whole process tree was killed."""
    stdout_truncated: bool = False
    """More stdout was produced than the cap; the excess was read and discarded."""
    stderr_truncated: bool = False
    """More stderr was produced than the cap; the excess was read and discarded."""
    duration_ms: int
    """Wall-clock time of the whole execution in milliseconds."""

    @property
    def ok(self) -> bool:
        """True when the program exited with status 0."""
        return self.exit_code == 0


class Capabilities(BaseModel):
    """What a backend really enforces, so a caller can tell isolation levels apart instead of assuming.

    Each flag is ``True`` only when the backend enforces it for every execution it runs.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    isolation: IsolationClass
    """The isolation class (see :class:`IsolationClass`)."""
    timeout: bool
    """Executions are killed, with their whole process tree, when the timeout expires."""
    memory: bool
    """A memory limit is enforced."""
    cpu: bool
    """A CPU limit is enforced."""
    pids: bool
    """The number of processes is limited (a fork bomb is contained)."""
    network: bool
    """Network access is denied: no route out of the sandbox. With :attr:`network_policy` set, the names
    that policy allows are still reached, through the host's proxy only."""
    fs_read: bool
    """Reads of the host filesystem are confined to what the policy allows."""
    fs_write: bool
    """Writes to the host filesystem are confined to what the policy allows."""
    env: bool
    """The environment is cleared: host variables (and secrets) do not reach the program."""
    languages: tuple[Language, ...]
    """Languages this backend can run here."""

    # Facts about where commands run rather than things enforced: callers decide from these what to hand a
    # command (host paths, host variables, host programs) instead of guessing from the isolation rank.
    # Each defaults to False, the answer for a backend with a filesystem of its own (Docker, gVisor):
    # a backend that does not say is never handed host state.
    host_filesystem: bool = False
    """Commands see the host's filesystem as it is: every host path readable at its own path (subject only
    to the user's permissions). True for a plain host process (and bubblewrap binding ``/``); False where
    the command sees a filesystem of its own (a container's image, a confining bubblewrap, WASM)."""
    host_environment: bool = False
    """Commands may be handed the host process's whole environment: they run as an ordinary host process
    of the caller, with nothing to keep from them that they could not read anyway. Only a plain host
    ``ProcessBackend``; a sandbox (bubblewrap, a container, WASM) keeps host variables out."""
    host_programs: bool = False
    """Commands run the host's installed programs at their host paths (a bare name such as ``rustc``
    resolves on the caller's PATH), so host toolchains and caches can be used. True for a host process,
    with or without bubblewrap; False for a container (the image's programs) and WASM (none)."""
    channel: str | None = None
    """How commands reach the sandbox: ``"agent"`` (one long-lived in-sandbox agent per user of a session:
    Docker, Kubernetes, microVMs); None for backends that start each execution as a host process or
    in-process (process, bubblewrap, WASM)."""
    workspace: str | None = None
    """How a session's workspace reaches the sandbox, where that is a choice: ``"bind"`` (the host directory
    mounted at its path, both sides see the same files) or ``"mirror"`` (a size-capped copy at the same
    path, synced before and after each command; docs/DOCKER.md, "Workspace transport"); ``"auto"`` from a
    backend that decides per workspace when each session starts (a session says what it got, and
    ``DockerBackend.capabilities(workspace=...)`` what a given directory gets); always ``"mirror"`` for a
    Kubernetes backend (None with a warm pool, which takes no host workspace); None for backends that work
    on the host's directory itself, or a session without a workspace."""
    profile: str | None = None
    """The shape of a container (docs/docker/profiles.md): ``"hardened"`` (read-only root, no capabilities)
    or ``"task"`` (an evaluation's image as it is: its user, a writable root with a capped layer, a few
    capabilities); None for backends with one shape."""
    root_cap: str | None = None
    """How a writable root filesystem's writes are capped (the task profile): ``"memory"`` (gVisor holds
    them in memory, within the memory limit), ``"quota"`` (the engine's storage quota) or ``"watched"``
    (the session stops once its layer passes the cap); None where the root is read-only."""
    network_policy: NetworkPolicy | None = None
    """The policy in force when the sandbox reaches the network by name (docs/network.md): ``network`` stays
    True (no route out: network none) and the in-sandbox proxy carries to the host what the policy allows,
    decided there; None without one."""
    snapshots: tuple[Literal["files", "processes", "memory"], ...] = ()
    """What a snapshot of a session carries (``session.snapshot()``, docs/snapshots.md): ``("files",)``
    (workspace, tmpfs directories, the task profile's root layer) where a session can be snapshotted and
    forked, empty where it cannot; with ``"processes"`` and ``"memory"`` where ``snapshot(processes=True)``
    and ``fork(processes=True)`` keep every process too (docs/pause.md)."""
    accel: str | None = None
    """How a virtual machine's CPU runs (the microVM backend): ``"kvm"`` (hardware virtualisation) or
    ``"tcg"`` (QEMU's emulation, 5-15x slower); None where commands run on no VM."""


class ResourceLimits(BaseModel):
    """Resource limits for a container (used by the Docker backend)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    memory_mb: Annotated[int, Field(gt=0)] = 2048
    """Memory limit, also used as memory+swap so no swap is available (MiB)."""
    cpus: Annotated[float, Field(gt=0)] = 2.0
    """CPU limit in cores."""
    pids: Annotated[int, Field(gt=0)] = 512
    """Maximum number of processes and threads."""
    tmpfs_mb: Annotated[int, Field(gt=0)] = 256
    """Size of the writable tmpfs mounts (``/tmp``, HOME)."""
    file_size_mb: Annotated[int, Field(gt=0)] = 1024
    """Largest file a program may write (``ulimit -f``)."""
    nofile: Annotated[int, Field(gt=0)] = 4096
    """Maximum number of open file descriptors."""
