"""Where snapshots live on disk, and how they are listed, read, removed and reaped.

:class:`SnapshotStore` keeps owned snapshots in memory (:func:`default_memory_root`, ``/dev/shm``) and
detached ones on disk (:func:`default_root`), one directory per id, built under a ``.partial-`` name and
renamed once complete; :func:`new_id`, :func:`layered_on`. See docs/snapshots.md, section "Lifecycle".
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import logging
import os
import re
import shutil
import stat
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import ValidationError

from adk_sandbox.executor import _owner
from adk_sandbox.executor._mountinfo import read_mountinfo
from adk_sandbox.executor.channel.static_agent import cache_root
from adk_sandbox.executor.errors import InvalidRequestError, PolicyNotEnforceableError, SandboxFailedError
from adk_sandbox.executor.snapshots import owned
from adk_sandbox.executor.snapshots.model import MAX_TTL_SECONDS, SNAPSHOT_ID, Snapshot
from adk_sandbox.executor.workspace.copies import NO_SPACE, HostCopyFullError, _boot_tag, copies_dir

__all__ = ["RECORD", "SnapshotStore", "default_memory_root", "default_root", "layered_on", "new_id"]

log = logging.getLogger(__name__)

#: The record of a snapshot in its directory.
RECORD = "snapshot.json"
#: The most of a record the store reads: a record is a few KiB (its notes are capped, ``cap_notes``); one
#: longer is unreadable (and reaped by its age, :meth:`SnapshotStore.reap`).
_RECORD_BYTES = 1 << 20
_PARTIAL = re.compile(r"\.partial-([0-9a-f]{8})-(\d+)-(\d+)-(\d+)-(snap-[0-9a-f]{16})")
_REMOVING = re.compile(r"\.removing-(snap-[0-9a-f]{16})-[0-9a-f]{8}")

#: Removes an engine image by id (gone already is not an error).
ImageRemover = Callable[[str], None]


def default_root() -> Path:
    """The default store: ``snapshots`` in the project's cache directory."""
    return cache_root() / "snapshots"


def default_memory_root() -> Path | None:
    """The default store's memory tier: ``adk-sandbox-snapshots-<uid>`` in ``/dev/shm`` (None: no tmpfs)."""
    where = copies_dir()
    if where != "/dev/shm":
        return None
    return Path(where) / f"adk-sandbox-snapshots-{os.geteuid()}"


def _syncfs(fd: int) -> None:
    """Write the filesystem holding ``fd`` to its disk (``syncfs``; ``sync`` where libc has none)."""
    libc = ctypes.CDLL(None, use_errno=True)
    call = getattr(libc, "syncfs", None)
    if call is None or call(fd) != 0:
        os.sync()


def new_id() -> str:
    """A fresh snapshot id (``snap-`` and 16 random hex digits)."""
    return "snap-" + uuid.uuid4().hex[:16]


class SnapshotStore:
    """Snapshots on disk below ``root`` (docs/snapshots.md, "Lifecycle"); thread- and process-safe."""

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        memory_root: str | os.PathLike[str] | None = None,
    ) -> None:
        self.root = Path(root) if root is not None else default_root()
        """The store's directory (on disk by default): detached snapshots, and all of them without a
        :attr:`memory_root`."""
        if memory_root is None and root is None:
            self.memory_root = default_memory_root()
        else:
            self.memory_root = Path(memory_root) if memory_root is not None else None
        """Where owned snapshots go (the default store: ``/dev/shm/adk-sandbox-snapshots-<uid>``), or None:
        everything in :attr:`root` (a store given a ``root`` alone)."""

    def _roots(self) -> builtins.list[str]:
        """The tiers' directories, the disk's first."""
        return [str(self.root)] + ([str(self.memory_root)] if self.memory_root is not None else [])

    def _ids(self) -> Iterator[tuple[str, str]]:
        """``(tier, name)`` of every entry of the tiers named like a snapshot id (read or not)."""
        for root in self._roots():
            try:
                names = os.listdir(root)
            except FileNotFoundError:
                continue
            for name in names:
                if SNAPSHOT_ID.fullmatch(name):
                    yield root, name

    def _ensure_root(self, path: str | None = None) -> str:
        """A tier's directory, made 0700 if missing; refused unless it is a directory of this user."""
        path = path or str(self.root)
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise SandboxFailedError(
                f"the snapshot store {path} is not a directory of this user (a link, or someone else's); "
                "remove it or give another store"
            )
        if info.st_mode & 0o077:
            os.chmod(path, 0o700)  # snapshots hold what sessions wrote: nobody else reads them
        return path

    # -- taking one ------------------------------------------------------------------------------------
    def begin(self, snapshot_id: str, *, durable: bool = True) -> str:
        """A fresh, empty directory to build the snapshot ``snapshot_id`` in (see :meth:`commit`).

        ``durable=False`` (an owned snapshot) builds it in the memory tier when the store has one.
        """
        _check_id(snapshot_id)
        memory = not durable and self.memory_root is not None
        root = self._ensure_root(str(self.memory_root) if memory else None)
        pid = os.getpid()
        name = f".partial-{_boot_tag()}-{_owner.pid_namespace()}-{pid}-{_owner.start_time(pid)}-{snapshot_id}"
        path = os.path.join(root, name)
        os.mkdir(path, 0o700)
        return path

    def commit(self, partial: str, snapshot: Snapshot, remove_image: ImageRemover | None = None) -> Snapshot:
        """Write the record into ``partial`` and make it the snapshot (renamed to its id); the record.

        An owned snapshot is removed when this process exits (:mod:`.owned`), its root image by
        ``remove_image``.
        """
        # Validated again: a model_copy(update=...) of the record (the engines' last fields) skips the
        # model's checks, the cap on its notes among them, and a record too long to read back would leak.
        snapshot = Snapshot.model_validate({**snapshot.model_dump(), "path": ""})
        record = os.path.join(partial, RECORD)
        fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(snapshot.model_dump_json(indent=1))
        root = os.path.dirname(partial)
        if root == str(self.root) and self.memory_root is not None:
            # A detached snapshot on disk: written out before it is named, so a crash never leaves a
            # complete-looking snapshot with files the disk lost. One syncfs, not an fsync per file.
            directory = os.open(partial, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                _syncfs(directory)
            finally:
                os.close(directory)
        final = os.path.join(root, snapshot.id)
        os.rename(partial, final)
        if snapshot.owner.get(_owner.OWNER_PID) == str(os.getpid()):
            # This process's: removed when it exits, not left to a reaper.
            owned.register(final, lambda: self._remove_at_exit(final, remove_image))
        return snapshot.model_copy(update={"path": final})

    def take(
        self,
        snapshot_id: str,
        build: Callable[[str], Snapshot],
        *,
        durable: bool = True,
        remove_image: ImageRemover | None = None,
    ) -> Snapshot:
        """Build the snapshot ``snapshot_id`` with ``build(partial)`` and :meth:`commit` it; the record.

        ``build`` fills the fresh directory ``partial`` and returns the record; a failure leaves nothing of
        the directory. An owned snapshot is removed at this process's exit (:mod:`.owned`). A full memory tier
        makes it try once more on the disk tier; a full disk tier raises :class:`PolicyNotEnforceableError`,
        never a raw ``OSError``. Depth: docs/snapshots.md, "Lifecycle" ("Out of space").
        """
        memory = not durable and self.memory_root is not None
        try:
            return self._take_once(snapshot_id, build, durable=durable, remove_image=remove_image)
        except (OSError, HostCopyFullError) as exc:
            if not _out_of_space(exc):
                raise
            where = self.memory_root if memory else self.root
            if not memory:
                raise self._full(where, exc) from exc
            log.warning("memory tier %s full (%s): snapshot %s is taken on disk", where, exc, snapshot_id)
        try:
            return self._take_once(snapshot_id, build, durable=True, remove_image=remove_image)
        except (OSError, HostCopyFullError) as exc:
            if not _out_of_space(exc):
                raise
            raise self._full(self.root, exc, also=self.memory_root) from exc

    def _take_once(
        self,
        snapshot_id: str,
        build: Callable[[str], Snapshot],
        *,
        durable: bool,
        remove_image: ImageRemover | None,
    ) -> Snapshot:
        partial = self.begin(snapshot_id, durable=durable)
        try:
            return self.commit(partial, build(partial), remove_image)
        except BaseException:
            self.abort(partial)
            raise

    @staticmethod
    def _full(where: Path | None, exc: BaseException, also: Path | None = None) -> PolicyNotEnforceableError:
        tiers = f"{also} (memory) and then in {where} (disk)" if also is not None else str(where)
        return PolicyNotEnforceableError(
            f"the snapshot ran out of space in {tiers} ({exc}); it was refused and nothing of it is left. "
            "Free space there, remove snapshots no longer needed (`adk-sandbox snapshots rm`), or keep "
            "snapshots on a larger file system (SnapshotStore(path))"
        )

    @staticmethod
    def abort(partial: str) -> None:
        """Remove a partial snapshot (a refused or failed one leaves nothing)."""
        shutil.rmtree(partial, ignore_errors=True)

    # -- reading ---------------------------------------------------------------------------------------
    def list(self) -> list[Snapshot]:
        """The complete snapshots of the store, oldest first (an unreadable record is logged and skipped)."""
        found = []
        for root, name in self._ids():
            snapshot = self._read(name, root)
            if snapshot is not None:
                found.append(snapshot)
        return sorted(found, key=lambda s: (s.created, s.id))

    def get(self, key: str) -> Snapshot:
        """The snapshot of this id, else the newest of this name; :class:`InvalidRequestError` if none."""
        if not isinstance(key, str) or not key:
            raise InvalidRequestError("a snapshot is named by its id (snap-...) or its name")
        if SNAPSHOT_ID.fullmatch(key):
            for root in self._roots():
                snapshot = self._read(key, root)
                if snapshot is not None:
                    return snapshot
        named = [s for s in self.list() if s.name == key]
        if not named:
            raise InvalidRequestError(
                f"no snapshot {key!r} in {' or '.join(self._roots())} "
                "(list them with `adk-sandbox snapshots ls`)"
            )
        return named[-1]

    def _read(self, snapshot_id: str, root: str) -> Snapshot | None:
        path = os.path.join(root, snapshot_id)
        try:
            fd = os.open(os.path.join(path, RECORD), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            with os.fdopen(fd, "rb") as handle:
                data = handle.read(_RECORD_BYTES + 1)
            if len(data) > _RECORD_BYTES:
                raise ValueError(f"longer than {_RECORD_BYTES} bytes")
            snapshot = Snapshot.model_validate_json(data)
        except (OSError, ValidationError, ValueError) as exc:
            log.warning("snapshot record %s is unreadable: %s", path, exc)
            return None
        if snapshot.id != snapshot_id:
            log.warning("snapshot record %s names another snapshot (%s): ignored", path, snapshot.id)
            return None
        return snapshot.model_copy(update={"path": path})

    # -- removing --------------------------------------------------------------------------------------
    def remove(self, key: str | Snapshot, remove_image: ImageRemover | None = None) -> Snapshot:
        """Remove a snapshot (by id, name or record): its root image first, then its directory.

        The directory is renamed away first (so no session starts from half of it), then removed; a link
        inside is removed, never followed. Without ``remove_image`` a snapshot with a root image is refused
        (:class:`InvalidRequestError`): its image would be left behind.
        """
        snapshot = self.get(key.id if isinstance(key, Snapshot) else key)
        if layered_on(snapshot.path):
            raise InvalidRequestError(
                f"snapshot {snapshot.id} is the lower layer of a running fork (PoolConfig(fork_by='layer')): "
                "close the sessions forked from it first; it was kept as it was"
            )
        if snapshot.root_image is not None:
            if remove_image is None:
                raise InvalidRequestError(
                    f"snapshot {snapshot.id} has a root image ({snapshot.root_image[:19]}): "
                    "remove it through "
                    "its engine (DockerBackend.remove_snapshot, `adk-sandbox snapshots rm`)"
                )
            remove_image(snapshot.root_image)
        self.discard(snapshot.id, os.path.dirname(snapshot.path))
        return snapshot

    def _remove_at_exit(self, path: str, remove_image: ImageRemover | None) -> None:
        """Remove the owned snapshot at ``path`` as its owner exits (see :mod:`.owned`).

        What :meth:`remove` refuses is still removed, but for a live fork's lower layer (its mounts outlive
        this process until the reaper detaches them): a root image still in use stays for the reaper
        (its labels say it is leaked once this process is gone), its directory goes.
        """
        snapshot_id, root = os.path.basename(path), os.path.dirname(path)
        try:
            self.remove(snapshot_id, remove_image)
        except Exception as exc:
            if not os.path.isdir(path):
                return
            if layered_on(path):
                log.warning("owned snapshot %s is a live fork's lower layer: left to the reaper", snapshot_id)
                return
            log.warning(
                "owned snapshot %s: %s; its directory is removed, its image left to the reaper", path, exc
            )
            self.discard(snapshot_id, root)

    @staticmethod
    def discard(snapshot_id: str, root: str) -> None:
        """Remove the directory of ``snapshot_id`` in the tier ``root`` (renamed away first), nothing else."""
        owned.forget(os.path.join(root, snapshot_id))
        gone = os.path.join(root, f".removing-{snapshot_id}-{uuid.uuid4().hex[:8]}")
        try:
            os.rename(os.path.join(root, snapshot_id), gone)
        except FileNotFoundError:
            return
        shutil.rmtree(gone, ignore_errors=True)

    def reap(self, remove_image: ImageRemover | None = None, now: float | None = None) -> builtins.list[str]:
        """Remove the snapshots a reaper may (expired, or owner gone) and what killed owners left half-made.

        A snapshot with a root image is removed only with ``remove_image`` (else left for a reaper that has
        an engine). Returns what was removed, each with why.
        """
        moment = time.time() if now is None else now
        removed = []
        for snapshot in self.list():
            reason = snapshot.leak_reason(moment)
            if reason is None or (snapshot.root_image is not None and remove_image is None):
                continue
            try:
                self.remove(snapshot, remove_image)
            except Exception as exc:
                log.warning("could not remove snapshot %s: %s", snapshot.id, exc)
                continue
            removed.append(f"{snapshot.id} ({snapshot.name}): {reason}")
        removed += self._reap_unreadable(moment)
        removed += self._reap_partials()
        return removed

    def _reap_unreadable(self, now: float) -> builtins.list[str]:
        """Snapshot directories whose record does not read (or names another id), once surely expired.

        :meth:`list` skips them, so nothing else would ever remove them. Without a record there is no owner
        or expiry to go by, only age: a snapshot expires at most :data:`MAX_TTL_SECONDS` after it was taken,
        and its record is written after that, so one whose directory and record last changed longer ago
        than that (``mtime`` and ``ctime``, the latest) is past any expiry. Only real directories named like
        an id in a tier are removed (:meth:`discard`: renamed away, no link followed); a live fork's lower
        layer is kept; a root image it may have is the engine reaper's (its labels say when it is leaked).
        """
        removed = []
        for root, name in self._ids():
            if self._read(name, root) is not None:
                continue
            path = os.path.join(root, name)
            try:
                info = os.lstat(path)
                if not stat.S_ISDIR(info.st_mode):
                    continue
                written = max(info.st_mtime, info.st_ctime)
                with contextlib.suppress(FileNotFoundError):
                    record = os.lstat(os.path.join(path, RECORD))
                    written = max(written, record.st_mtime, record.st_ctime)
            except OSError:
                continue
            if now < written + MAX_TTL_SECONDS or layered_on(path):
                continue
            self.discard(name, root)
            removed.append(f"{name}: a snapshot whose record is unreadable, older than any expiry")
        return removed

    def _reap_partials(self) -> builtins.list[str]:
        """Partial snapshots of owners gone, and removals a killed process left half-done."""
        boot, namespace = _boot_tag(), str(_owner.pid_namespace())
        removed = []
        for root in self._roots():
            removed += self._reap_partials_in(root, boot, namespace)
        return removed

    @staticmethod
    def _reap_partials_in(root: str, boot: str, namespace: str) -> builtins.list[str]:
        try:
            names = os.listdir(root)
        except FileNotFoundError:
            return []
        removed = []
        for name in names:
            path = os.path.join(root, name)
            partial = _PARTIAL.fullmatch(name)
            if partial is not None:
                owner_boot, owner_ns, pid, start, _ = partial.groups()
                alive = owner_boot == boot and (owner_ns != namespace or _owner.start_time(int(pid)) == start)
                if alive:
                    continue
                reason = "a partial snapshot whose owner is gone"
            elif _REMOVING.fullmatch(name):
                reason = "a removal left half-done"
            else:
                continue
            with contextlib.suppress(OSError):
                if stat.S_ISDIR(os.lstat(path).st_mode):
                    shutil.rmtree(path, ignore_errors=True)
                    removed.append(f"{name}: {reason}")
        return removed


def _out_of_space(exc: BaseException) -> bool:
    """Whether ``exc`` says a file system (or a quota) was full."""
    return isinstance(exc, HostCopyFullError) or (isinstance(exc, OSError) and exc.errno in NO_SPACE)


def _check_id(snapshot_id: str) -> None:
    if not SNAPSHOT_ID.fullmatch(snapshot_id):
        raise InvalidRequestError(f"{snapshot_id!r} is not a snapshot id (snap- and 16 hex digits)")


def layered_on(path: str) -> bool:
    """Whether an overlay mounted on this host has a lower directory in ``path`` (a layered fork's).

    Read from the kernel's mount table: forks of other processes count too. A reaper then defers the
    snapshot (its removal is refused and logged) until its forks are closed or reaped.
    """
    try:
        mounts = read_mountinfo()
    except OSError:
        return False
    for mount in mounts:
        if mount.fstype != "overlay":
            continue
        for option in mount.super_options:
            if option.startswith("lowerdir="):
                lowers = option.removeprefix("lowerdir=").split(":")
                if any(lower == path or lower.startswith(path + "/") for lower in lowers):
                    return True
    return False
