"""Pull-back's writes of the host copy: what the sandbox gives back is hostile input.

Every name is checked (:func:`safe_name`) and every write goes through ``RootDir`` descriptors; file
content travels as :class:`Content` (data extents, never holes: :func:`read_content`,
:func:`write_content`). See docs/docker/workspace-transport.md (the hostile-input table) and docs/sparse.md.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import posixpath
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field

from adk_sandbox.executor.workspace.beneath import EscapeError, RootDir
from adk_sandbox.executor.workspace.scan import Entry, data_extents

__all__ = ["Content", "read_content", "safe_name"]

#: The block a :meth:`Content.digest` looks at: an all-zero one counts as a hole, wherever it is stored.
_DIGEST_BLOCK = 64 * 1024
_ZEROS = bytes(_DIGEST_BLOCK)
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Content:
    """A regular file's content without its holes: its apparent size and its data extents.

    ``extents`` are (offset, data) pairs in ascending order, not overlapping, within ``size``; every byte
    outside them reads as zero. A file with no hole is one extent at 0 (or none when empty).
    """

    size: int
    extents: tuple[tuple[int, bytes | memoryview], ...]

    @property
    def data_bytes(self) -> int:
        """The bytes of data held (what a copy that keeps holes spends)."""
        return sum(len(data) for _, data in self.extents)

    @property
    def sparse(self) -> bool:
        """Whether anything of the file is a hole (its data does not cover it from 0 to its size)."""
        return self.data_bytes != self.size

    def digest(self) -> bytes:
        """SHA-256 of the content, whatever its holes: the same bytes give the same digest.

        Made of the size and each non-zero block of 64 KiB with its index, so a hole and written zeros
        count alike (the host's file system and the sandbox's tar may split the same file into other
        extents) and a hole is never read or hashed.
        """
        hasher = hashlib.sha256(self.size.to_bytes(8, "big"))
        index, block = -1, bytearray()

        def flush() -> None:
            if index >= 0 and block != _ZEROS:
                hasher.update(index.to_bytes(8, "big"))
                hasher.update(block)

        for offset, data in self.extents:
            view, done = memoryview(data), 0
            while done < len(view):
                at = offset + done
                here, start = divmod(at, _DIGEST_BLOCK)
                n = min(_DIGEST_BLOCK - start, len(view) - done)
                if here != index:
                    flush()
                    index, block = here, bytearray(_DIGEST_BLOCK)
                block[start : start + n] = view[done : done + n]
                done += n
        flush()
        return hasher.digest()


def read_content(fd: int) -> Content:
    """The content of the open regular file ``fd``: its data extents read, its holes never read."""
    size = os.fstat(fd).st_size
    extents: list[tuple[int, bytes]] = []
    for offset, length in data_extents(fd, 0, size):
        chunks = []
        done = 0
        while done < length:
            chunk = os.pread(fd, min(length - done, 64 * _CHUNK), offset + done)
            if not chunk:
                break  # shrank meanwhile
            chunks.append(chunk)
            done += len(chunk)
        if done:
            extents.append((offset, b"".join(chunks) if len(chunks) != 1 else chunks[0]))
    return Content(size, tuple(extents))


def write_content(fd: int, content: Content) -> None:
    """Write ``content`` into the empty file ``fd``: each extent at its offset, then the size (holes kept)."""
    for offset, data in content.extents:
        view, at = memoryview(data), offset
        while view:
            written = os.pwrite(fd, view, at)
            view, at = view[written:], at + written
    os.ftruncate(fd, content.size)


def _holds_content(fd: int, content: Content) -> bool:
    """Whether the open file ``fd`` (of ``content.size`` bytes) reads as ``content``, its holes not read.

    Its bytes where ``content`` has data are compared; where ``content`` has a hole, the file's own data
    extents (if any) must read as zeros.
    """
    covered: list[tuple[int, int]] = []
    for offset, data in content.extents:
        view = memoryview(data)
        for done in range(0, len(view), _CHUNK):
            part = view[done : done + _CHUNK]
            if os.pread(fd, len(part), offset + done) != part:
                return False
        covered.append((offset, offset + len(view)))
    for start, length in data_extents(fd, 0, content.size):
        at, end = start, start + length
        for low, high in covered:
            if high <= at or low >= end:
                continue
            if low > at and not _zeros(fd, at, low):
                return False
            at = max(at, high)
        if at < end and not _zeros(fd, at, end):
            return False
    return True


def _zeros(fd: int, start: int, end: int) -> bool:
    """Whether bytes ``start..end`` of ``fd`` are all zero (read in chunks)."""
    for at in range(start, end, _CHUNK):
        want = min(_CHUNK, end - at)
        if os.pread(fd, want, at) != bytes(want):
            return False
    return True


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

    def holds(self, rel: str, content: Content, mode: int, mtime: float) -> bool:
        """Whether the host file ``rel`` (reached as written, no link) is ``content``, ``mode``, ``mtime``.

        Compared without reading its holes or ``content``'s (:func:`_holds_content`).
        """
        try:
            with self.parent(rel, create=False) as fd:
                out = os.open(posixpath.basename(rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
        except (OSError, _Refused):
            return False
        try:
            info = os.fstat(out)
            if not stat.S_ISREG(info.st_mode) or (info.st_size, info.st_mode & 0o777, int(info.st_mtime)) != (
                content.size,
                mode,
                int(mtime),
            ):
                return False
            return _holds_content(out, content)
        except OSError:
            return False
        finally:
            os.close(out)

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

    def write_file(self, rel: str, content: Content, mode: int, mtime: float) -> None:
        """``content`` as the file ``rel``: a temp file in its directory, renamed over whatever was there.

        Only its data is written, each extent at its offset, then the size is set: its holes stay holes.
        """
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
                    write_content(out, content)
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
