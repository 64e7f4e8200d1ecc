"""Core value types shared by every backend: requests, results, isolation classes and capabilities."""

from __future__ import annotations

import enum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "DEFAULT_MAX_OUTPUT_BYTES",
    "Capabilities",
    "ExecRequest",
    "ExecResult",
    "IsolationClass",
    "Language",
    "ResourceLimits",
    "Stream",
    "validate_env",
]

DEFAULT_MAX_OUTPUT_BYTES = 1024 * 1024
"""Per-stream output cap used when a request does not set ``max_output_bytes`` (1 MiB)."""

Stream = Literal["stdout", "stderr"]
"""The name of an output stream, as passed to ``on_output`` callbacks."""


class Language(enum.StrEnum):
    """What ``ExecRequest.code`` is: a shell command string or a program in a language."""

    COMMAND = "command"
    """A ``sh -c`` command string."""
    PYTHON = "python"
    JAVASCRIPT = "javascript"
    TYPESCRIPT = "typescript"
    RUST = "rust"
    WASM = "wasm"


_ISOLATION_ORDER = ("subprocess_only", "os_enforced", "container", "gvisor", "wasm")


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


class ExecRequest(BaseModel):
    """One program or command to run. Immutable; ``timeout`` is required (there is no silent default)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    language: Language
    """What ``code`` is."""
    code: str
    """The command string (``command``) or the program's source text."""
    stdin: str | None = None
    """Text fed to the program's standard input; ``None`` means ``/dev/null``."""
    timeout: Annotated[float, Field(gt=0, le=24 * 3600)]
    """Wall-clock limit in seconds for the whole execution (compile steps included)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Variables added to the cleared environment; they override the policy's."""
    memory_limit_mb: Annotated[int, Field(gt=0)] | None = None
    """Memory limit; a backend that cannot enforce it refuses the request."""
    max_output_bytes: Annotated[int, Field(gt=0)] | None = None
    """Bytes kept per stream; ``None`` means the backend default (1 MiB). The rest is read and dropped."""

    @field_validator("code")
    @classmethod
    def _no_nul_in_code(cls, code: str) -> str:
        if "\0" in code:
            raise ValueError("code contains a NUL byte, which cannot be passed to a program")
        return code

    @field_validator("env")
    @classmethod
    def _env_is_passable(cls, env: dict[str, str]) -> dict[str, str]:
        return validate_env(env)

    @property
    def output_cap(self) -> int:
        """The per-stream byte cap in force for this request."""
        return self.max_output_bytes if self.max_output_bytes is not None else DEFAULT_MAX_OUTPUT_BYTES


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
    """Network access is denied."""
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
    """How commands reach the sandbox, where that is a choice: ``"agent"`` (one long-lived in-sandbox agent
    per session, Docker's default) or ``"exec"`` (one Docker exec per command); None for backends that
    start each execution as a host process or in-process (process, bubblewrap, WASM)."""


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
