"""Pull-back's writes of the host copy: what the sandbox gives back is hostile input.

Every name is checked (docs/DOCKER.md, "Workspace transport"; :func:`safe_name`: relative, no
``..``/``.``/empty component, no NUL, UTF-8, no ``.git`` component at any depth), every
write goes through :class:`adk_sandbox.executor.workspace.beneath.RootDir` descriptors with the literal
path checked (no symlink on the host is followed by a write), special files are refused, a symlink is
recreated only when it resolves inside the workspace (and not into a ``.git``), set-id bits are dropped,
and ownership stays the workspace owner's. The mirror writes its pull-back through :class:`_HostTree`, and
the workspace copies (:mod:`adk_sandbox.executor.workspace.copies`) make their links through it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field

from adk_sandbox.executor.workspace.beneath import EscapeError, RootDir
from adk_sandbox.executor.workspace.scan import Entry

__all__ = ["safe_name"]


def safe_name(path: str) -> bool:
    """Whether pull-back may write ``path``: relative, plain components only, no ``.git`` anywhere."""
    if not path or path.startswith("/") or "\0" in path or len(path.encode("utf-8")) >= 4096:
        return False
    return all(part not in ("", ".", "..", ".git") for part in path.split("/"))


class _Refused(Exception):
    """Pull-back will not write this entry (the message says why, for the model)."""


@dataclass
class _HostTree:
    """Writes of the host copy: every path opened beneath the root by descriptor, never through a link."""

    tree: RootDir
    owner: tuple[int, int]
    _as_root: bool = field(default_factory=lambda: os.geteuid() == 0)

    @contextlib.contextmanager
    def parent(self, rel: str, *, create: bool) -> Iterator[int]:
        """A descriptor of ``rel``'s directory, which must be the literal path (no link followed)."""
        directory = posixpath.dirname(rel)
        try:
            if create and directory:
                self._make_parents(directory)
            fd = self.tree.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        except EscapeError:
            raise _Refused("its directory leads outside the workspace") from None
        try:
            if self.tree.real_path(fd) != os.path.join(self.tree.path, directory).rstrip("/"):
                raise _Refused("a symbolic link on its way on the host")
            yield fd
        finally:
            os.close(fd)

    def _make_parents(self, directory: str) -> None:
        parts = directory.split("/")
        for depth in range(1, len(parts) + 1):
            here = "/".join(parts[:depth])
            with self.parent(here, create=False) as fd:
                name = parts[depth - 1]
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    continue
                self._own(name, fd)

    def entry(self, rel: str) -> Entry | None:
        """The host entry at ``rel`` now (None: absent, a special file, or not reachable as written)."""
        try:
            with self.parent(rel, create=False) as fd:
                info = os.stat(posixpath.basename(rel), dir_fd=fd, follow_symlinks=False)
                if stat.S_ISLNK(info.st_mode):
                    return Entry("l", 0o777, target=os.readlink(posixpath.basename(rel), dir_fd=fd))
        except (OSError, _Refused):
            return None
        if stat.S_ISDIR(info.st_mode):
            return Entry("d", info.st_mode & 0o777)
        if stat.S_ISREG(info.st_mode):
            return Entry(
                "f", info.st_mode & 0o777, info.st_size, info.st_mtime_ns, inode=info.st_ino,
                ctime_ns=info.st_ctime_ns,
            )  # fmt: skip
        return None

    def holds(self, rel: str, data: bytes, mode: int, mtime: float) -> bool:
        """Whether the host file ``rel`` (reached as written, no link) is ``data``, ``mode``, ``mtime``."""
        try:
            with self.parent(rel, create=False) as fd:
                out = os.open(posixpath.basename(rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
        except (OSError, _Refused):
            return False
        with os.fdopen(out, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode) or (info.st_size, info.st_mode & 0o777, int(info.st_mtime)) != (
                len(data),
                mode,
                int(mtime),
            ):
                return False
            return handle.read(len(data) + 1) == data

    def remove(self, rel: str) -> None:
        """Remove ``rel`` (a directory with all it holds), never following a link; absent is done."""
        with contextlib.suppress(FileNotFoundError, _Refused), self.parent(rel, create=False) as fd:
            self._clear(posixpath.basename(rel), fd)

    @staticmethod
    def _clear(name: str, fd: int) -> None:
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(name, dir_fd=fd)  # descriptor-based: a link inside is removed, never followed
        else:
            os.unlink(name, dir_fd=fd)

    def make_dir(self, rel: str, mode: int) -> None:
        """A directory at ``rel`` with ``mode`` (whatever else was there is replaced)."""
        with self.parent(rel, create=True) as fd:
            name = posixpath.basename(rel)
            info = _lstat(name, fd)
            if info is not None and not stat.S_ISDIR(info.st_mode):
                self._clear(name, fd)
                info = None
            if info is None:
                os.mkdir(name, 0o700, dir_fd=fd)
                self._own(name, fd)
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            try:
                os.fchmod(sub, mode & 0o777)
            finally:
                os.close(sub)

    def make_link(self, rel: str, target: str) -> None:
        """A symbolic link at ``rel`` to ``target``, when that stays inside and out of any ``.git``."""
        if not target or "\0" in target:
            raise _Refused("an empty symbolic link")
        absolute = posixpath.normpath(posixpath.join(self.tree.path, posixpath.dirname(rel), target))
        inside = absolute == self.tree.path or absolute.startswith(self.tree.path.rstrip("/") + "/")
        if not inside:
            raise _Refused(f"a symbolic link to {target!r}, outside the workspace")
        if ".git" in absolute[len(self.tree.path) :].split("/"):
            raise _Refused(f"a symbolic link to {target!r}, into a .git directory")
        with self.parent(rel, create=True) as fd:
            name = posixpath.basename(rel)
            if _lstat(name, fd) is not None:
                self._clear(name, fd)
            os.symlink(target, name, dir_fd=fd)
            self._own(name, fd)

    def link_stays_inside(self, rel: str) -> bool:
        """Whether the link at ``rel`` resolves inside the workspace (and out of ``.git``), or dangles."""
        try:
            fd = self.tree.open(rel, os.O_PATH)
        except EscapeError:
            return False
        except OSError as exc:
            return exc.errno in (errno.ENOENT, errno.ENOTDIR)  # dangling: it leads nowhere (checked again)
        try:
            real = self.tree.real_path(fd)
        finally:
            os.close(fd)
        return ".git" not in real[len(self.tree.path) :].split("/")

    def write_file(self, rel: str, data: bytes, mode: int, mtime: float) -> None:
        """``data`` as the file ``rel``: a temp file in its directory, renamed over whatever was there."""
        with self.parent(rel, create=True) as fd:
            name = posixpath.basename(rel)
            old = _lstat(name, fd)
            if old is not None and stat.S_ISDIR(old.st_mode):
                self._clear(name, fd)
                old = None
            temp = f".{name[:200]}.adk-mirror.{os.urandom(6).hex()}.tmp"
            out = os.open(
                temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd
            )
            try:
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(out, view) :]
                    if self._as_root:
                        keep = (
                            (old.st_uid, old.st_gid)
                            if old is not None and stat.S_ISREG(old.st_mode)
                            else None
                        )
                        os.fchown(out, *(keep or self.owner))
                    os.fchmod(out, mode & 0o777)  # after fchown, and never a set-id bit
                    os.utime(out, (mtime, mtime))
                finally:
                    os.close(out)
                os.rename(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=fd)
                raise

    def _own(self, name: str, fd: int) -> None:
        if self._as_root:
            os.chown(name, *self.owner, dir_fd=fd, follow_symlinks=False)


def _lstat(name: str, fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
