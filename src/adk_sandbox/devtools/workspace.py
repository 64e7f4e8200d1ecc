"""Workspace: the directory the tools work in, its permissions, and contained access to its files."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shlex
import stat
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from adk_sandbox.devtools.errors import (
    FilePermissionError,
    InvalidPathError,
    NotRegularFileError,
    PathEscapeError,
    PathNotFoundError,
    StaleReadError,
    ToolError,
)
from adk_sandbox.executor import (
    DEFAULT_MAX_OUTPUT_BYTES,
    Capabilities,
    ProcessBackend,
    SandboxBackend,
    SessionFactory,
)
from adk_sandbox.executor.backend import ClosedOnExit
from adk_sandbox.executor.workspace.beneath import (
    NAMES_DIRECTORY,
    NOT_A_DIRECTORY,
    EscapeError,
    Located,
    RootDir,
    climbs_out,
)

__all__ = [
    "DEFAULT_ENV_ALLOWLIST",
    "FileStamp",
    "SessionFactory",
    "Workspace",
    "check_permitted",
    "permitted",
]

DEFAULT_ENV_ALLOWLIST: tuple[str, ...] = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TERM", "USER", "SHELL")
"""Host variables a ``bash`` command sees when the workspace does not inherit the whole environment."""

HOST_SPECIFIC_VARIABLES = ("PATH", "HOME", "TMPDIR", "SHELL", "USER")
"""Allowlisted host variables passed only where commands see the host's filesystem: elsewhere the host's
paths and identity are wrong, and the sandbox provides its own."""

PATH_MAX = 4096
NAME_MAX = 255

_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY  # O_NONBLOCK: a FIFO must not block the open


@dataclass(frozen=True)
class FileStamp:
    """What identifies the version of a file that was read: edit_file refuses if any of it changed."""

    device: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, info: os.stat_result) -> FileStamp:
        """The stamp of an ``fstat`` result."""
        return cls(info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


class Workspace(ClosedOnExit):
    """A root directory and what the agent may do in it.

    File tools run on the host and open everything through a descriptor of ``root`` held for the
    workspace's life (see ``docs/DEVTOOLS.md``); ``bash`` runs through ``sandbox`` (default: a host
    :class:`~adk_sandbox.executor.ProcessBackend` working in ``root``). Use as a context manager, or call
    :meth:`close`.

    ``bash_timeout`` is both the default and the ceiling of a ``bash`` call's timeout, in seconds;
    ``max_output_bytes`` caps each output stream; the command's environment holds only the host variables
    named in ``env_allowlist`` unless ``inherit_env`` is set, and ``inherit_env`` applies only where the
    backend reports ``host_environment`` (a plain host process, see :meth:`command_env`): a container or
    another sandbox never receives the host's environment. ``sandbox`` is a backend used as given, or an
    :class:`~adk_sandbox.executor.SessionFactory` (``DockerBackend``) from which one session bound to ``root``
    is opened.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        writable: bool = True,
        allow_bash: bool = True,
        bash_timeout: float = 120,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        inherit_env: bool = False,
        env_allowlist: Sequence[str] = DEFAULT_ENV_ALLOWLIST,
        sandbox: SandboxBackend | SessionFactory | None = None,
    ) -> None:
        if bash_timeout <= 0:
            raise ValueError("bash_timeout must be positive")
        if max_output_bytes <= 0:
            raise ValueError("max_output_bytes must be positive")
        if not os.path.isdir(root):
            raise NotADirectoryError(f"workspace root {os.fspath(root)!r} is not a directory")
        self._root = RootDir(os.fspath(root))
        self.writable = writable
        self.allow_bash = allow_bash
        self.bash_timeout = float(bash_timeout)
        self.max_output_bytes = max_output_bytes
        self.inherit_env = inherit_env
        self.env_allowlist = tuple(env_allowlist)
        self.sandbox = sandbox
        self._backend: SandboxBackend | None = None
        self._backend_in_root = False
        self._capabilities: tuple[SandboxBackend, Capabilities] | None = None  # asked once per backend
        self._owned = contextlib.ExitStack()  # the default backend or the session this workspace opened
        self._backend_lock = threading.Lock()  # held while a (possibly slow) session opens
        self._lock = threading.Lock()
        self._stamps: dict[str, FileStamp] = {}
        self._closed = False

    @classmethod
    def read_only(cls, root: str | os.PathLike[str]) -> Workspace:
        """A workspace to explore and plan in: no writes, no bash."""
        return cls(root, writable=False, allow_bash=False)

    @property
    def root(self) -> Path:
        """The workspace root, symlinks in it resolved once at construction."""
        return Path(self._root.path)

    # -- lifecycle -------------------------------------------------------------------------------------

    def close(self) -> None:
        """Release the root descriptor and close a sandbox session this workspace opened. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._root.close()
        with self._backend_lock:
            self._backend = None
            self._owned.close()

    # -- paths -----------------------------------------------------------------------------------------

    def resolve(self, path: str) -> Path:
        """The absolute path ``path`` names inside the root, symlinks resolved.

        Relative paths join the root; absolute ones must lie inside it. Raises :class:`PathEscapeError`
        when the path or a symlink on the way leads outside, :class:`InvalidPathError` for NUL bytes,
        over-long names, dangling and looping links. A path that does not exist yet resolves to where it
        would be created (its existing parent resolved, the missing components appended).
        """
        rel = self.relative_request(path)
        with self.mapped_errors(path):
            try:
                fd = self._root.open(rel, os.O_PATH)
            except FileNotFoundError as exc:
                if exc.strerror == _DANGLING:
                    raise
                located = self._root.locate(rel, missing_ok=True)
                try:
                    if located.lstat is None and located.via_link:
                        raise OSError(errno.ENOENT, _DANGLING, rel) from None
                    base = self._root.real_path(located.dir_fd)
                    return Path(base, located.name, *located.missing)
                finally:
                    located.close()
            try:
                return Path(self._root.real_path(fd))
            finally:
                os.close(fd)

    def relative_request(self, path: str) -> str:
        """Check ``path`` lexically and return it relative to the root (not yet resolved)."""
        self._check_open()
        if path == "":
            raise InvalidPathError("the path is empty; pass a path relative to the workspace root")
        if "\0" in path:
            raise InvalidPathError(f"path {path!r} contains a NUL byte, which no file name can hold")
        try:
            # Strict UTF-8, not os.fsencode: its surrogateescape would turn U+DC80..U+DCFF into raw bytes
            # and create a name that is not UTF-8, while any other lone surrogate is refused.
            size = len(path.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidPathError(f"path {path!r} is not valid Unicode (a lone surrogate)") from None
        if size >= PATH_MAX:
            raise InvalidPathError(f"path is too long ({size} bytes; the limit is {PATH_MAX - 1})")
        for part in path.split("/"):
            if len(part.encode("utf-8")) > NAME_MAX:
                raise InvalidPathError(
                    f"path component '{part[:32]}...' is too long ({len(part.encode('utf-8'))} bytes; "
                    f"the limit is {NAME_MAX})"
                )
        if path.startswith("/"):
            try:
                rel = self._root.strip_root(path)
            except EscapeError:
                raise PathEscapeError(path) from None
        else:
            rel = path
        if climbs_out(rel):
            # Refused before anything is looked at or created: 'a/../../x' names a place outside whatever
            # exists (a missing 'a' must not turn it into "does not exist", a write must not create 'a').
            raise PathEscapeError(path)
        return rel

    def real_path_of(self, fd: int) -> str:
        """The absolute path of an open descriptor (how files are keyed for read tracking)."""
        return self._root.real_path(fd)

    def display(self, absolute: str) -> str:
        """A resolved absolute path as the model sees it: relative to the root."""
        return self._root.relative(absolute)

    @contextlib.contextmanager
    def mapped_errors(self, path: str) -> Iterator[None]:
        """Turn containment and OS errors about ``path`` into tool errors: the one place this happens."""
        try:
            yield
        except ToolError:
            raise
        except EscapeError:
            raise PathEscapeError(path) from None
        except OSError as exc:
            raise _tool_error(path, exc) from None

    def _check_open(self) -> None:
        if self._closed:
            raise ToolError("this workspace has been closed")

    # -- contained file access (used by the tools) ----------------------------------------------------

    def open_regular(self, path: str) -> tuple[int, os.stat_result, str]:
        """Open the regular file at ``path`` for reading: ``(fd, fstat, real path)``; the caller closes fd.

        A directory, FIFO, socket or device is refused after a non-blocking open, without reading.
        """
        rel = self.relative_request(path)
        with self.mapped_errors(path):
            fd = self._root.open(rel, _READ_FLAGS)
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    raise NotRegularFileError(_not_regular_message(path, info.st_mode))
                check_permitted(info, "read", path)
                return fd, info, self._root.real_path(fd)
            except BaseException:
                os.close(fd)
                raise

    def open_entry(self, path: str) -> tuple[int, os.stat_result, str]:
        """Open a file or directory to search or list: ``(fd, fstat, path relative to the root)``.

        Directories are opened for listing; FIFOs, sockets and devices are refused without blocking.
        """
        rel = self.relative_request(path)
        with self.mapped_errors(path):
            fd = self._root.open(rel, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
            try:
                info = os.fstat(fd)
                if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
                    raise NotRegularFileError(_not_regular_message(path, info.st_mode))
                return fd, info, self.display(self._root.real_path(fd))
            except BaseException:
                os.close(fd)
                raise

    def is_contained_file(self, rel: str) -> bool:
        """Whether ``rel`` (relative to the root) resolves, symlinks followed, to a regular file inside."""
        try:
            fd = self._root.open(rel, os.O_PATH)
        except (OSError, EscapeError):
            return False
        try:
            return stat.S_ISREG(os.fstat(fd).st_mode)
        finally:
            os.close(fd)

    def locate_file(self, path: str, *, create_dirs: bool) -> Located:
        """Find the entry a write to ``path`` replaces: a directory fd and a name that is not a symlink.

        Refuses directories, special files and dangling links; a refusal removes the parent directories
        ``create_dirs`` made. The caller closes the result (and calls ``rollback()`` when its write fails).
        """
        rel = self.relative_request(path)
        with self.mapped_errors(path):
            located = self._root.locate(rel, create_dirs=create_dirs)
            try:
                if located.lstat is None:
                    if located.via_link:
                        raise OSError(errno.ENOENT, _DANGLING, rel)
                elif not stat.S_ISREG(located.lstat.st_mode):
                    raise NotRegularFileError(_not_regular_message(path, located.lstat.st_mode))
                return located
            except BaseException:
                located.rollback()
                located.close()
                raise

    def replace_file(self, located: Located, data: bytes, path: str) -> tuple[str, os.stat_result]:
        """Write ``data`` as the new content of ``located``: a temp file in the same directory, renamed.

        The rename replaces the directory entry, so the inode of the old file is never written: a hard
        link to it elsewhere keeps its content, and a symlink swapped in meanwhile is replaced, not
        followed. An existing file's permission bits (and, when the tools run as root, its owner) are
        kept. A file (or directory) whose mode denies the tools' user the write is refused with
        :class:`FilePermissionError` before anything is written (:func:`check_permitted`). Returns
        ``(real path, fstat of the new file)``.
        """
        with self.mapped_errors(path):
            old = located.lstat
            if old is not None:
                check_permitted(old, "write", path)
            check_permitted(os.fstat(located.dir_fd), "write", path, directory=True)
            mode = stat.S_IMODE(old.st_mode) if old is not None else None
            temp = f".{located.name[:200]}.{secrets.token_hex(6)}.tmp"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(temp, flags, 0o666 if mode is None else 0o600, dir_fd=located.dir_fd)
            try:
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                    if old is not None and os.geteuid() == 0 and (old.st_uid, old.st_gid) != (0, 0):
                        os.fchown(fd, old.st_uid, old.st_gid)  # the owner keeps the file it could write
                    if mode is not None:
                        os.fchmod(fd, mode)  # after fchown, which clears set-id bits
                    info = os.fstat(fd)
                finally:
                    os.close(fd)
                os.rename(temp, located.name, src_dir_fd=located.dir_fd, dst_dir_fd=located.dir_fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=located.dir_fd)
                raise
            real = os.path.join(self._root.real_path(located.dir_fd), located.name)
            return real, info

    # -- read tracking ----------------------------------------------------------------------------------

    def mark_read(self, real_path: str, info: os.stat_result) -> None:
        """Remember the version of the file at ``real_path`` the model has seen."""
        with self._lock:
            self._stamps[real_path] = FileStamp.of(info)

    def read_stamp(self, real_path: str) -> FileStamp | None:
        """The version of the file last read or written through this workspace, if any."""
        with self._lock:
            return self._stamps.get(real_path)

    def check_fresh(self, real_path: str, info: os.stat_result, path: str) -> None:
        """Raise :class:`StaleReadError` when the file changed since it was read."""
        if self.read_stamp(real_path) != FileStamp.of(info):
            raise StaleReadError(path)

    # -- bash -------------------------------------------------------------------------------------------

    def bash_backend(self) -> tuple[SandboxBackend, bool]:
        """The backend ``bash`` runs in, and whether its commands already start in the root.

        ``sandbox=None``: a host ProcessBackend working in the root (owned, closed with the workspace).
        A :class:`SessionFactory`: one session opened on first use, bound to the root, closed with the
        workspace. Any other backend is used as given (the caller owns it); commands then ``cd`` into the
        root first.
        """
        with self._backend_lock:
            self._check_open()
            if self._backend is None:
                sandbox = self.sandbox
                if sandbox is None:
                    self._backend = self._owned.enter_context(ProcessBackend(workdir=self.root))
                    self._backend_in_root = True
                elif isinstance(sandbox, SessionFactory):
                    # Entered like `with backend.session(workspace=root) as s:` (a session may start its
                    # container at entry) and exited by close().
                    session = sandbox.session(workspace=self.root)
                    if not isinstance(session, SandboxBackend):
                        raise TypeError(f"{sandbox!r}.session() returned {session!r}, not a SandboxBackend")
                    self._backend = self._owned.enter_context(session)
                    self._backend_in_root = True
                elif isinstance(sandbox, SandboxBackend):
                    self._backend = sandbox  # the caller's: not closed here
                    self._backend_in_root = False
                else:
                    raise TypeError(
                        f"sandbox must be a SandboxBackend or a SessionFactory (session()), not {sandbox!r}"
                    )
            return self._backend, self._backend_in_root

    def bash_prefix(self) -> str:
        """What a command is prefixed with on a backend that does not start in the root."""
        return f"cd -- {shlex.quote(str(self.root))} || exit 1\n"

    def command_env(self, backend: SandboxBackend | None = None) -> dict[str, str]:
        """The host variables a ``bash`` command on ``backend`` receives (blocking: may ask the backend).

        Decided by the backend's ``host_filesystem`` and ``host_environment`` capabilities, not its isolation
        class: ``inherit_env`` passes all of ``os.environ`` only to a plain host process, and a sandbox with a
        filesystem of its own never gets ``PATH``, ``HOME``, ``TMPDIR``, ``SHELL`` or ``USER``.
        ``backend=None`` means the default host ``ProcessBackend``. The table: docs/DEVTOOLS.md, "bash".
        """
        allowlisted = {name: os.environ[name] for name in self.env_allowlist if name in os.environ}
        if backend is None:
            host_filesystem = host_environment = True
        else:
            capabilities = self._capabilities_of(backend)
            host_filesystem, host_environment = capabilities.host_filesystem, capabilities.host_environment
        if self.inherit_env and host_environment:
            return dict(os.environ)
        if not host_filesystem:
            return {name: value for name, value in allowlisted.items() if name not in HOST_SPECIFIC_VARIABLES}
        return allowlisted

    def _capabilities_of(self, backend: SandboxBackend) -> Capabilities:
        # Asked once per backend (a Docker session answers from its container's inspect and a probe).
        cached = self._capabilities
        if cached is not None and cached[0] is backend:
            return cached[1]
        capabilities = backend.capabilities()
        self._capabilities = (backend, capabilities)
        return capabilities


_DANGLING = "dangling symbolic link"

_BITS = {
    "read": (stat.S_IRUSR, stat.S_IRGRP, stat.S_IROTH),
    "write": (stat.S_IWUSR, stat.S_IWGRP, stat.S_IWOTH),
}


def permitted(info: os.stat_result, access: str) -> bool:
    """Whether the file's permission bits let the tools' user ``access`` ("read"/"write") it.

    The tools act as this process. An unprivileged process is judged by the class the kernel would use
    (owner, else group, else other bits of its effective uid, gid and groups). A process running as root
    bypasses those classes in the kernel; the tools refuse only what the mode denies to everyone (a 0444
    file is not written, a 0200 file not read), since they cannot know whose request root is carrying
    out (docs/DEVTOOLS.md, "File permissions").
    """
    owner, group, other = _BITS[access]
    mode = info.st_mode
    uid = os.geteuid()
    if uid == 0:
        return bool(mode & (owner | group | other))
    if info.st_uid == uid:
        return bool(mode & owner)
    if info.st_gid == os.getegid() or info.st_gid in os.getgroups():
        return bool(mode & group)
    return bool(mode & other)


def check_permitted(info: os.stat_result, access: str, path: str, *, directory: bool = False) -> None:
    """Raise :class:`FilePermissionError` unless :func:`permitted`; the message is for the model."""
    if permitted(info, access):
        return
    mode = f"mode {stat.S_IMODE(info.st_mode):04o}"
    if directory:
        raise FilePermissionError(
            f"permission denied: the directory of '{path}' is not writable ({mode}); nothing was written"
        )
    if access == "write":
        raise FilePermissionError(
            f"permission denied: '{path}' is read-only ({mode}) for this user; it was left unchanged"
        )
    raise FilePermissionError(f"permission denied: '{path}' is not readable ({mode}) for this user")


def _not_regular_message(path: str, mode: int) -> str:
    if stat.S_ISDIR(mode):
        return f"path '{path}' is a directory, not a file; use glob to list its contents"
    kinds = (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    kind = next((name for test, name in kinds if test(mode)), "not a regular file")
    return f"path '{path}' is {kind}; only regular files can be read or written"


def _tool_error(path: str, exc: OSError) -> ToolError:  # noqa: PLR0911 - one case per errno
    code = exc.errno
    if code == errno.ENOTDIR and exc.strerror == NOT_A_DIRECTORY:
        return InvalidPathError(
            f"path '{path}' ends with '/' but names a file, not a directory; remove the trailing '/'"
        )
    if code == errno.EISDIR and exc.strerror == NAMES_DIRECTORY:
        return InvalidPathError(
            f"path '{path}' ends with '/', so it names a directory; a file path must not end with '/'"
        )
    if code == errno.ENOENT and exc.strerror == _DANGLING:
        return InvalidPathError(f"path '{path}' is a symbolic link whose target does not exist")
    if code == errno.ENOENT:
        hint = " ('~' is not expanded: it is a literal name in the workspace)" if path.startswith("~") else ""
        return PathNotFoundError(f"path '{path}' does not exist{hint}")
    if code == errno.ELOOP:
        return InvalidPathError(f"path '{path}' has too many levels of symbolic links (a symlink loop)")
    if code == errno.ENAMETOOLONG:
        return InvalidPathError(f"path '{path}' is too long")
    if code == errno.ENOTDIR:
        return PathNotFoundError(f"path '{path}' does not exist (a component on the way is not a directory)")
    if code == errno.EISDIR:
        return NotRegularFileError(f"path '{path}' is a directory, not a file")
    if code == errno.ENXIO:  # open() of a socket
        return NotRegularFileError(f"path '{path}' is a socket or device; only regular files can be used")
    if code in (errno.EACCES, errno.EPERM):
        return FilePermissionError(f"permission denied for '{path}'")
    return ToolError(f"cannot access '{path}': {exc.strerror or exc}")
