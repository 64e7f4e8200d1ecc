"""File operations inside a session's sandbox: :class:`SandboxFiles` (``session.files``).

Each operation is one FILE frame to the in-sandbox agent, performed as the session's command user with
the sandbox's own view and permissions. A refusal raises Python's own :class:`OSError` subclass, a
deadline :class:`FileOpCancelledError`, bad arguments ``InvalidRequestError``, a broken channel
``SandboxFailedError``. Depth: docs/docker/agent-channel.md, "File operations".
"""

from __future__ import annotations

import errno as errno_codes
import time
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from adk_sandbox.executor.channel.agent_transport import FileOpCancelledError
from adk_sandbox.executor.channel.frames import split_entries
from adk_sandbox.executor.errors import InvalidRequestError, validation_problems

__all__ = [
    "DEFAULT_READ_LIMIT",
    "DEFAULT_TIMEOUT_SECONDS",
    "MAX_LIST_BYTES",
    "DirEntry",
    "FileOpCancelledError",
    "FileOperator",
    "FileStat",
    "SandboxFiles",
]

#: Bytes a :meth:`SandboxFiles.read_bytes` returns at most unless told otherwise.
DEFAULT_READ_LIMIT = 64 * 1024 * 1024
#: Bytes of a directory listing the host accepts (names of about a million entries).
MAX_LIST_BYTES = 64 * 1024 * 1024
#: How long one operation may take before it is cancelled in the container.
DEFAULT_TIMEOUT_SECONDS = 60.0

FileType = Literal["file", "dir", "symlink", "other"]
_ENTRY_TYPES: dict[str, FileType] = {"f": "file", "d": "dir", "l": "symlink", "o": "other"}


def _container_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"{value!r} is not an absolute path inside the container")
    if "\0" in value:
        raise ValueError("a path cannot contain NUL")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{value!r} is not valid UTF-8 (the protocol carries paths as text)") from None
    return value


_Path = Annotated[str, AfterValidator(_container_path)]
_Mode = Annotated[int, Field(ge=0, le=0o777, description="permission bits only: no set-id or sticky bit")]
_Count = Annotated[int, Field(ge=0)]


class _Request(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    path: _Path


class _Read(_Request):
    op: Literal["read"] = "read"
    offset: _Count
    limit: _Count


class _Write(_Request):
    op: Literal["write"] = "write"
    mode: _Mode
    exclusive: bool
    append: bool


class _Stat(_Request):
    op: Literal["stat"] = "stat"
    follow: bool


class _List(_Request):
    op: Literal["list"] = "list"


class _Mkdir(_Request):
    op: Literal["mkdir"] = "mkdir"
    parents: bool
    mode: _Mode


class _Remove(_Request):
    op: Literal["remove"] = "remove"
    recursive: bool


class _Rename(_Request):
    op: Literal["rename"] = "rename"
    target: _Path


class FileStat(BaseModel):
    """What :meth:`SandboxFiles.stat` found (the container's view: uid and gid are the container's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: FileType
    """``"file"``, ``"dir"``, ``"symlink"`` (with ``follow=False`` only) or ``"other"`` (FIFO, device)."""
    size: int
    """Bytes (of a file; what the filesystem says for the rest)."""
    mode: int
    """Permission bits, set-id and sticky bits included (``st_mode & 0o7777``)."""
    mtime: float
    """Modification time, seconds since the epoch."""
    uid: int
    gid: int


@dataclass(frozen=True)
class DirEntry:
    """One entry of :meth:`SandboxFiles.list_dir`: its name as bytes (names need not be UTF-8)."""

    name: bytes
    type: FileType
    """The entry itself (a symlink is ``"symlink"``, never what it points to)."""

    @property
    def text(self) -> str:
        """The name as text (undecodable bytes replaced: for display, not to address the entry)."""
        return self.name.decode("utf-8", "replace")


class FileOperator(Protocol):
    """What :class:`SandboxFiles` needs of a session (a ``DockerSession``): its agent's FILE operation."""

    def file_operation(
        self, request: dict[str, Any], data: bytes | None, *, deadline: float, max_output: int
    ) -> tuple[dict[str, Any], bytes]:
        """One FILE operation as the command user: the RESULT body and the bytes sent before it.

        Starts the session if needed; :class:`InvalidRequestError` when the session has no agent.
        """
        ...


class SandboxFiles:
    """Read, write and manage files inside a session's sandbox (see the module docstring).

    Each call starts the session if needed and is bounded by ``timeout`` seconds (then cancelled in the
    container). Paths are absolute paths inside the container.
    """

    def __init__(self, session: FileOperator, *, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        if not timeout > 0:
            raise InvalidRequestError(f"timeout must be > 0 seconds, not {timeout!r}")
        self._session = session
        self._timeout = timeout

    def read_bytes(self, path: str, *, offset: int = 0, limit: int = DEFAULT_READ_LIMIT) -> bytes:
        """At most ``limit`` bytes of the regular file ``path`` from ``offset`` (a FIFO or device: EINVAL)."""
        request = _validated(_Read, path=path, offset=offset, limit=limit)
        _, data = self._call(request, max_output=limit)
        return data

    def write_bytes(
        self, path: str, data: bytes, *, mode: int = 0o644, exclusive: bool = False, append: bool = False
    ) -> int:
        """Write ``data`` to ``path``; the bytes written.

        Not appending, the data goes to a fresh file in the same directory, renamed over ``path`` when
        complete: a reader never sees half of it, and on any failure (a full disk, the deadline) ``path``
        keeps its old content. An existing file is replaced only if the command user may write it (as
        ``open(path, "w")`` would decide; otherwise :class:`PermissionError` and nothing changes, though
        the directory alone would allow the rename), and the replacement keeps its permission bits and,
        as far as the command user may give it, its owner. A new file has exactly ``mode`` (no umask); a
        symlink at ``path`` is replaced by one, never followed. ``exclusive`` fails with
        :class:`FileExistsError` when ``path`` exists; ``append`` adds to the file in place (following
        symlinks; ``mode`` applies when it is created).
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidRequestError(f"data must be bytes, not {type(data).__name__}")
        request = _validated(_Write, path=path, mode=mode, exclusive=exclusive, append=append)
        body, _ = self._call(request, data=bytes(data))
        return int(body["size"])

    def stat(self, path: str, *, follow: bool = True) -> FileStat:
        """The status of ``path`` (of a final symlink itself with ``follow=False``)."""
        body, _ = self._call(_validated(_Stat, path=path, follow=follow))
        return FileStat.model_validate(body)

    def list_dir(self, path: str) -> list[DirEntry]:
        """The entries of the directory ``path`` (without ``.`` and ``..``), in the directory's order."""
        _, data = self._call(_validated(_List, path=path), max_output=MAX_LIST_BYTES)
        return [DirEntry(name, _ENTRY_TYPES[kind]) for kind, name in split_entries(data)]

    def mkdir(self, path: str, *, parents: bool = False, mode: int = 0o755) -> None:
        """Create the directory ``path`` with exactly ``mode``.

        ``parents`` creates missing parents too (with the same mode) and accepts an existing directory.
        """
        self._call(_validated(_Mkdir, path=path, parents=parents, mode=mode))

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file, symlink or empty directory; ``recursive`` removes a directory and all it holds.

        A symlink is removed itself, never followed, at ``path`` or anywhere inside the tree.
        """
        self._call(_validated(_Remove, path=path, recursive=recursive))

    def rename(self, path: str, target: str) -> None:
        """Rename ``path`` to ``target`` (``rename(2)``: replaces a file at ``target``)."""
        self._call(_validated(_Rename, path=path, target=target))

    def _call(
        self, request: _Request, data: bytes | None = None, max_output: int = 0
    ) -> tuple[dict[str, Any], bytes]:
        body, output = self._session.file_operation(
            request.model_dump(), data, deadline=time.monotonic() + self._timeout, max_output=max_output
        )
        error = body.get("error")
        if error is not None:
            raise _os_error(request, error)
        return body, output


def _validated(model: type[_Request], **fields: Any) -> _Request:
    try:
        return model(**fields)
    except ValidationError as exc:
        problems = validation_problems(exc)
        raise InvalidRequestError(f"invalid file operation: {problems}") from None


def _os_error(request: _Request, error: dict[str, Any]) -> OSError:
    """The OSError subclass Python raises for that errno (found by its name: the host may not be Linux)."""
    name, number = str(error["name"]), int(error["errno"])
    code = getattr(errno_codes, name, number) if name.startswith("E") else number
    message = f"{error['message']} (in the sandbox: {request.model_dump()['op']})"
    target = getattr(request, "target", None)
    if target is not None:
        return OSError(code, message, request.path, None, target)
    return OSError(code, message, request.path)
