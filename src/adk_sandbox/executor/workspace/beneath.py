"""Path containment through descriptors: the one place paths are turned into open files.

:class:`RootDir` holds a descriptor of the workspace root and opens everything relative to it
(``openat2(RESOLVE_BENEATH)``, else a component-by-component walk; writes always walk), so a symlink
swapped in cannot redirect a read or a write outside. A path leading outside raises :class:`EscapeError`,
any other failure ``OSError``. See docs/DEVTOOLS.md, section "Containment".
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import stat
import threading
from collections import deque
from dataclasses import dataclass, field

__all__ = [
    "MAX_SYMLINK_HOPS",
    "NAMES_DIRECTORY",
    "NOT_A_DIRECTORY",
    "EscapeError",
    "Located",
    "RootDir",
    "climbs_out",
    "names_directory",
    "openat2_available",
    "split_components",
]

MAX_SYMLINK_HOPS = 40
"""Symlinks followed in one resolution before it counts as a loop (Linux's MAXSYMLINKS)."""

_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08
_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437, "arm64": 437}.get(platform.machine())

# Directories on the way are opened without read permission needs and never through a symlink.
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class EscapeError(Exception):
    """The path, or a symlink on the way, leads outside the root."""


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


_libc: ctypes.CDLL | None = None
_openat2_state: bool | None = None  # None: not probed yet
_state_lock = threading.Lock()


def _syscall_openat2(dir_fd: int, path: bytes, flags: int, mode: int) -> int:
    global _libc  # noqa: PLW0603 - loaded once, lazily
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    how = _OpenHow(flags, mode, _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS)
    fd = int(
        _libc.syscall(
            ctypes.c_long(_SYS_OPENAT2 or -1),
            ctypes.c_int(dir_fd),
            ctypes.c_char_p(path),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), os.fsdecode(path))
    return fd


def openat2_available() -> bool:
    """Whether this kernel (and seccomp filter) lets us use ``openat2``; probed once."""
    global _openat2_state  # noqa: PLW0603 - process-wide probe result
    with _state_lock:
        if _openat2_state is None:
            _openat2_state = False
            if _SYS_OPENAT2 is not None:
                probe = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    os.close(_syscall_openat2(probe, b".", os.O_PATH | os.O_CLOEXEC, 0))
                    _openat2_state = True
                except OSError:
                    pass  # ENOSYS (old kernel) or EPERM (a seccomp filter): the walk is used instead
                finally:
                    os.close(probe)
        return _openat2_state


NOT_A_DIRECTORY = "names a file, not a directory (it ends with '/')"
"""``strerror`` of the ``ENOTDIR`` raised for ``file/`` or ``file/.`` (as the kernel refuses it)."""

NAMES_DIRECTORY = "names a directory (it ends with '/'), not a file"
"""``strerror`` of the ``EISDIR`` raised when a write would create ``new/`` as a file."""


def split_components(path: str) -> list[str]:
    """Components of ``path`` with empty ones and ``.`` dropped (``..`` kept: it is resolved by the walk)."""
    return [part for part in path.split("/") if part not in ("", ".")]


def climbs_out(rel: str) -> bool:
    """Whether the ``..`` components of ``rel`` climb above its start, counted on the text alone.

    Such a path names a place outside the root whatever exists on the way, so it is refused before any
    lookup (and before a write creates a directory). Symlinks are not considered here; the walk refuses
    the ones that lead outside.
    """
    depth = 0
    for part in split_components(rel):
        depth += -1 if part == ".." else 1
        if depth < 0:
            return True
    return False


def names_directory(rel: str) -> bool:
    """Whether ``rel`` ends with ``/`` or ``/.``: the kernel then requires a directory there."""
    return bool(split_components(rel)) and rel.rsplit("/", maxsplit=1)[-1] in ("", ".")


@dataclass
class Located:
    """Where a walk ended: a directory descriptor and a name in it that is not a symlink (or is absent).

    ``dir_fd`` is owned by the caller. ``lstat`` is None when ``name`` does not exist; ``via_link`` says the
    name came from a symlink's target (so creating it would create a dangling link's target). ``missing``
    holds the components below a missing directory (only with ``missing_ok``). ``created`` holds the
    directories the walk made (``create_dirs``), as ``(parent fd, name)``, so a write that fails later can
    remove them again (:meth:`rollback`).
    """

    dir_fd: int
    name: str
    lstat: os.stat_result | None
    via_link: bool
    missing: list[str]
    created: list[tuple[int, str]] = field(default_factory=list)

    def rollback(self) -> None:
        """Remove the directories this walk created, innermost first (only while they are still empty)."""
        _remove_created(self.created)

    def close(self) -> None:
        """Close the directory descriptor (and those kept for :meth:`rollback`)."""
        os.close(self.dir_fd)
        for fd, _ in self.created:
            os.close(fd)
        self.created = []


class RootDir:
    """A directory held open by descriptor; every path is opened beneath it.

    ``use_openat2=None`` uses ``openat2`` when the kernel has it; ``False`` forces the walk (tests run
    every containment case through both).
    """

    def __init__(self, path: str, *, use_openat2: bool | None = None) -> None:
        # An open directory's /proc/self/fd/<n> (another mount namespace's directory, _proc_root) is taken
        # as it is: resolving it would give its path in that namespace, which names another directory here.
        self.path = path if path.startswith("/proc/self/fd/") else os.path.realpath(path)
        self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._root_parts = split_components(self.path)
        self.use_openat2 = openat2_available() if use_openat2 is None else use_openat2

    def close(self) -> None:
        """Release the root descriptor. Idempotent."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # -- opening ---------------------------------------------------------------------------------------

    def open(self, rel: str, flags: int, *, attempts: int = 3) -> int:
        """Open ``rel`` (relative to the root) with ``flags``, following only symlinks that stay inside.

        ``flags`` must not contain ``O_CREAT``. Raises :class:`EscapeError` or ``OSError``.
        """
        if self.use_openat2:
            try:
                return _syscall_openat2(self.fd, os.fsencode(rel or "."), flags | os.O_CLOEXEC, 0)
            except OSError as exc:
                if exc.errno in (errno.ENOSYS, errno.EPERM) and not self._openat2_works():
                    self.use_openat2 = False
                # Any refusal is rare, and ambiguous: EXDEV may be an escape or an absolute link inside,
                # ENOENT a missing file or a dangling link, EAGAIN a concurrent rename. The walk gives the
                # precise answer, with the same descriptor-level guarantees.
        for attempt in range(attempts):
            found = self.locate(rel)
            try:
                if found.lstat is None:
                    if found.via_link:
                        raise _dangling(rel)
                    raise OSError(errno.ENOENT, os.strerror(errno.ENOENT), rel)
                try:
                    fd = os.open(found.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=found.dir_fd)
                except OSError as exc:
                    # The name became a symlink after the walk looked at it: walk again.
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR) and attempt + 1 < attempts:
                        continue
                    raise
                if stat.S_ISLNK(os.fstat(fd).st_mode):  # O_PATH|O_NOFOLLOW opens a swapped-in link itself
                    os.close(fd)
                    if attempt + 1 < attempts:
                        continue
                    raise OSError(errno.ELOOP, "the path kept changing while it was opened", rel)
                return fd
            finally:
                found.close()
        raise OSError(errno.ELOOP, "the path kept changing while it was opened", rel)  # pragma: no cover

    def _openat2_works(self) -> bool:
        # EPERM can also be a real permission answer; openat2 of the root itself tells the two apart.
        try:
            os.close(_syscall_openat2(self.fd, b".", os.O_PATH | os.O_CLOEXEC, 0))
        except OSError:
            return False
        return True

    # -- walking ---------------------------------------------------------------------------------------

    def locate(  # noqa: PLR0912, PLR0915 - one loop, one case per kind of component, kept together
        self, rel: str, *, create_dirs: bool = False, missing_ok: bool = False
    ) -> Located:
        """Walk ``rel`` from the root one component at a time (docs/DEVTOOLS.md, "Containment").

        Symlinks are followed, including at the final component; the result names an entry that is not a
        symlink, or does not exist. ``create_dirs`` creates missing directories on the way (each with
        ``mkdirat`` relative to its contained parent; removed again when the walk then fails, and listed
        in the result's ``created``); ``missing_ok`` stops at the first missing directory instead of
        raising ``ENOENT``. A path ending with ``/`` must name a directory, as for the kernel: a file there
        is ``ENOTDIR`` (:data:`NOT_A_DIRECTORY`), a name to create is ``EISDIR`` (:data:`NAMES_DIRECTORY`).
        """
        # Each pending component remembers whether it came from a symlink's target: a missing one must not
        # be created (that would create a dangling link's target), and a missing final one is "dangling".
        pending: deque[tuple[str, bool]] = deque((part, False) for part in split_components(rel))
        stack: list[int] = []  # descriptors of the directories below the root, innermost last
        created: list[tuple[int, str]] = []  # directories made here: (dup of the parent fd, name)
        want_dir = names_directory(rel)
        hops = 0
        try:
            if not pending:
                return Located(os.dup(self.fd), ".", os.fstat(self.fd), False, [])
            while pending:
                name, from_link = pending.popleft()
                if name == "..":
                    if not stack:
                        raise EscapeError(rel)
                    os.close(stack.pop())
                    if not pending:  # the path ends with '..': it names the directory reached
                        here = stack[-1] if stack else self.fd
                        return Located(os.dup(here), ".", os.fstat(here), from_link, [], created)
                    continue
                current = stack[-1] if stack else self.fd
                last = not pending
                try:
                    info = os.stat(name, dir_fd=current, follow_symlinks=False)
                except FileNotFoundError:
                    if last:
                        if want_dir and create_dirs:
                            raise OSError(errno.EISDIR, NAMES_DIRECTORY, rel) from None
                        return Located(os.dup(current), name, None, from_link, [], created)
                    if from_link:
                        raise _dangling(rel) from None
                    if missing_ok:
                        return Located(os.dup(current), name, None, False, [p for p, _ in pending])
                    if not create_dirs:
                        raise
                    try:
                        os.mkdir(name, 0o777, dir_fd=current)
                    except FileExistsError:
                        pass  # created concurrently: look again
                    else:
                        created.append((os.dup(current), name))
                    pending.appendleft((name, False))
                    continue
                if stat.S_ISLNK(info.st_mode):
                    hops += 1
                    if hops > MAX_SYMLINK_HOPS:
                        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), rel)
                    target = os.readlink(name, dir_fd=current)
                    parts = split_components(target)
                    if target.startswith("/"):
                        if parts[: len(self._root_parts)] != self._root_parts:
                            raise EscapeError(rel)
                        for fd in stack:
                            os.close(fd)
                        stack.clear()
                        parts = parts[len(self._root_parts) :]
                    pending.extendleft((part, True) for part in reversed(parts))
                    if not pending:  # a link to a directory on the stack ("." or the root's own path)
                        here = stack[-1] if stack else self.fd
                        return Located(os.dup(here), ".", os.fstat(here), True, [], created)
                    continue
                if last:
                    if want_dir and not stat.S_ISDIR(info.st_mode):
                        raise OSError(errno.ENOTDIR, NOT_A_DIRECTORY, rel)
                    return Located(os.dup(current), name, info, from_link, [], created)
                try:
                    stack.append(os.open(name, _DIR_FLAGS, dir_fd=current))
                except OSError as exc:
                    if exc.errno == errno.ENOTDIR and stat.S_ISDIR(info.st_mode):
                        pending.appendleft((name, from_link))  # swapped for a symlink since the stat
                        hops += 1
                        if hops > MAX_SYMLINK_HOPS:
                            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), rel) from exc
                        continue
                    raise
            raise AssertionError("unreachable: the loop returns at the last component")  # pragma: no cover
        except BaseException:
            _remove_created(created)  # a refused or failed walk leaves the tree as it was
            for fd, _ in created:
                os.close(fd)
            raise
        finally:
            for fd in stack:
                os.close(fd)

    def real_path(self, fd: int) -> str:
        """The absolute path the kernel knows for an open descriptor."""
        return os.readlink(f"/proc/self/fd/{fd}")

    def relative(self, absolute: str) -> str:
        """``absolute`` (inside the root) relative to the root, ``.`` for the root itself."""
        return os.path.relpath(absolute, self.path)

    def strip_root(self, path: str) -> str:
        """Turn an absolute path inside the root into a root-relative one; :class:`EscapeError` otherwise.

        Compared component by component, so ``/ws-evil`` is not inside ``/ws``, and without resolving
        ``..`` lexically (a ``..`` that leaves the root is refused by the walk later).
        """
        parts = path.split("/")
        kept = [part for part in parts if part not in ("", ".")]
        if kept[: len(self._root_parts)] != self._root_parts:
            raise EscapeError(path)
        rel = "/".join(kept[len(self._root_parts) :])
        return f"{rel}/" if rel and names_directory(path) else rel  # a final '/' keeps its meaning


def _remove_created(created: list[tuple[int, str]]) -> None:
    for fd, name in reversed(created):
        with contextlib.suppress(OSError):  # no longer empty (someone else wrote there): it stays
            os.rmdir(name, dir_fd=fd)


def _dangling(rel: str) -> OSError:
    return OSError(errno.ENOENT, "dangling symbolic link", rel)
