"""Snapshots of Docker sessions: taking one from a running session, and giving a new session its state.

Carries the workspace (copied on the host), the tmpfs directories (archived inside, or read on the host)
and the task profile's root layer (``docker commit``, or an archive from inside under gVisor), taken while
no command runs (:meth:`DockerSession._quiesced`). Depth: docs/snapshots.md, "What a snapshot holds".
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import docker
import docker.errors

from adk_sandbox.executor import _owner
from adk_sandbox.executor._layout import HOME_DIR
from adk_sandbox.executor.backends.docker._daemon import idempotent
from adk_sandbox.executor.backends.docker._inside import run_in_sandbox, write_private
from adk_sandbox.executor.backends.docker._proc_root import open_tmpfs_dirs, readable_runtime
from adk_sandbox.executor.backends.docker._spec import GVISOR_RUNTIME, MIB, tmpfs_sizes
from adk_sandbox.executor.errors import (
    ExecutorError,
    InvalidRequestError,
    PolicyNotEnforceableError,
    SandboxFailedError,
)
from adk_sandbox.executor.snapshots.copy import CopyReport, copy_workspace
from adk_sandbox.executor.snapshots.model import (
    SNAPSHOT_LABEL,
    CopyMethod,
    Snapshot,
    SnapshotOptions,
    new_record,
)
from adk_sandbox.executor.snapshots.store import SnapshotStore, new_id
from adk_sandbox.executor.workspace.copies import copies_dir, copy_prefix
from adk_sandbox.executor.workspace.pullback import read_content
from adk_sandbox.executor.workspace.tarstream import (
    ARCHIVE_BYTES,
    MAX_FILE_DATA,
    archives,
    read_gnu_archive,
    tar_end,
    tar_file_member,
    tar_header,
)

if TYPE_CHECKING:
    from adk_sandbox.executor.backends.docker._container import OpenedContainer
    from adk_sandbox.executor.backends.docker.session import DockerSession

__all__ = [
    "IMAGE_REPOSITORY",
    "copy_as_source",
    "host_copy",
    "reap_snapshots",
    "remove_snapshot_image",
    "restore_tmpfs",
    "take_snapshot",
]

log = logging.getLogger(__name__)

#: The repository of snapshot root images (``adk-sandbox-snapshot:<snapshot id>``).
IMAGE_REPOSITORY = "adk-sandbox-snapshot"
#: Kept of a tar's complaints, for the snapshot's ``skipped``.
_MAX_NOTES = 20

# A tar of the directory $1 on stdout. The static agent's loader unlinks itself as it starts; one caught
# mid-start is left out. --sparse: a sparse file travels as its data, not its apparent size.
_ARCHIVE_SCRIPT = (
    'cd -- "$1" || exit 97\n'
    "exec tar -c -f - --format=gnu --sparse --numeric-owner --exclude='./.adk-sandbox-agent-*' ."
)
# Unpacks the tar on stdin into $1 as the command user: its modes (the sandbox's filter refuses set-id
# ones), never its owners, the existing directory $1 left as it is.
_RESTORE_SCRIPT = (
    'cd -- "$1" || exit 97\nexec tar -x -f - -p --no-same-owner --no-overwrite-dir --delay-directory-restore'
)


def take_snapshot(session: DockerSession, options: SnapshotOptions, store: SnapshotStore) -> Snapshot:
    """Snapshot ``session``'s files into ``store`` (see the module docstring); refused ones leave nothing."""
    config = session._config
    spec = config.spec
    if session.attached:
        raise InvalidRequestError(
            "an attached container (container=) is not this library's to snapshot: its mounts and root are "
            "someone else's; snapshot sessions the backend creates"
        )
    cap = options.max_mb * MIB
    setting = f"the snapshot's cap (max_mb={options.max_mb})"
    snapshot_id = new_id()
    created = time.time()
    with session._quiesced(options.wait_seconds):
        container = session._opened()
        client = session._client
        images: list[str] = []  # root images committed (a retry on the disk tier commits again)

        def build(partial: str) -> Snapshot:
            paths = ("/tmp", HOME_DIR, *sorted(spec.extra_tmpfs))
            hosted = bool(host.dirs)
            used, skipped, method = _take_files(session, partial, paths, host, budget=(cap, setting))
            if used > cap:
                raise _over_cap(used, options.max_mb, "its workspace and tmpfs directories")
            record = new_record(
                options,
                snapshot_id,
                created,
                image=spec.image,
                image_id=str(container.inspect.get("Image") or ""),
                profile=spec.profile,
                runtime=spec.runtime,
                workspace=spec.workspace,
                tmpfs=paths,
                tmpfs_format="tree" if hosted else "tar",
                method=method,
                size_bytes=used,
                skipped=tuple(skipped),
            )
            if spec.task and spec.runtime == GVISOR_RUNTIME:
                # gVisor keeps the root's writes in its own sandbox: read from inside (_root_archive).
                from adk_sandbox.executor.backends.docker._root_archive import archive_root  # noqa: PLC0415

                size, notes = archive_root(session, container, partial, cap - used, setting)
                update = {"root_archive": True, "size_bytes": used + size, "skipped": (*skipped, *notes)}
                record = record.model_copy(update=update)
            elif spec.task:
                layer = _root_layer_size(client, container.id)
                if used + layer > cap:
                    raise _over_cap(used + layer, options.max_mb, "its root filesystem's writes")
                images.append(_commit(client, container.id, record))
                record = record.model_copy(update={"root_image": images[-1], "size_bytes": used + layer})
            return record

        taken: Snapshot | None = None
        try:
            with contextlib.ExitStack() as opened:
                host = _host_side(session, container, opened)
                taken = store.take(
                    snapshot_id, build, durable=options.detached, remove_image=_image_remover(client)
                )
            return taken
        finally:
            for image in images:
                if taken is not None and image == taken.root_image:
                    continue
                try:
                    remove_snapshot_image(client, image)
                except ExecutorError as exc:  # the reaper removes it (labelled, owner and expiry)
                    log.warning("the root image of a refused snapshot could not be removed: %s", exc)


@dataclass(frozen=True)
class _HostSide:
    """Where the host reads a session's tmpfs directories, and whose the snapshot's copies are."""

    dirs: dict[str, str]
    """Path inside -> host path: a forkable session's tmpfs volumes, a layered member's mount points, or
    a runc container's own tmpfs mounts through ``/proc/<pid>/root`` (:mod:`._proc_root`); empty: none
    (the directories are archived inside)."""
    owner: tuple[int, int] | None
    """Whose the copies are: the command user's, so a fork by layer (whose lower shows through) can
    write them; None: this process's."""


def _host_side(session: DockerSession, container: OpenedContainer, opened: contextlib.ExitStack) -> _HostSide:
    """Where the host reads the session's tmpfs directories (``opened`` holds what must stay open)."""
    from adk_sandbox.executor.backends.docker._daemon import engine_of  # noqa: PLC0415

    if session.state_dirs:
        owner = session.layers.owner if session.layers is not None else None
        return _HostSide(dict(session.state_dirs), owner)
    pid = readable_runtime(container.inspect, local=engine_of(session._client).local)
    user = session.command_user_ids()
    if session._config.spec.task or pid is None or user is None:
        return _HostSide({}, None)  # the task profile's /tmp may hold several users' files: archived
    try:
        return _HostSide(opened.enter_context(open_tmpfs_dirs(pid, tmpfs_sizes(session._config.spec))), user)
    except OSError as exc:
        log.info("the tmpfs directories of %s are archived inside: %s", container.id[:12], exc)
        return _HostSide({}, None)


def _take_files(
    session: DockerSession,
    partial: str,
    paths: tuple[str, ...],
    host: _HostSide,
    *,
    budget: tuple[int, str],
) -> tuple[int, list[str], CopyMethod]:
    """The workspace and the tmpfs directories into the partial snapshot: bytes, what was left out, how.

    ``budget`` is (cap, the setting that raises it).
    """
    cap, setting = budget
    if host.dirs:
        return _copy_all_on_host(session, partial, paths, host, budget)
    report = _copy_host_workspace(session, partial, cap, setting)
    container = session._opened()
    used, notes = _take_tmpfs(
        session, container, partial, paths, budget=(report.size_bytes, cap), setting=setting
    )
    return used, [*report.skipped, *notes], report.method


def _copy_all_on_host(
    session: DockerSession, partial: str, paths: tuple[str, ...], host: _HostSide, budget: tuple[int, str]
) -> tuple[int, list[str], CopyMethod]:
    """Copy the workspace and every tmpfs directory (in ``paths``' order) on the host, all at once.

    Each is a walk of its own (a thread each: the copies wait on system calls, and the 2,000 small files of
    one overlap with the large file of another), each within the whole cap: the caller refuses a sum over
    it, and the partial snapshot (every copy) is removed then. Returns bytes in all, what was left out and
    how the workspace was copied.
    """
    cap, setting = budget
    owner = host.owner
    tmpfs = os.path.join(partial, "tmpfs")
    os.mkdir(tmpfs, 0o700)

    def tree(index: int, path: str) -> tuple[int, list[str]]:
        target = os.path.join(tmpfs, str(index))
        os.mkdir(target, 0o700)
        if owner is not None:
            os.chown(target, *owner)
        copied = copy_workspace(host.dirs[path], target, cap, setting)
        return copied.size_bytes, [f"{path}/{note}" for note in copied.skipped]

    with ThreadPoolExecutor(max_workers=1 + len(paths), thread_name_prefix="snapshot-copy") as pool:
        workspace = pool.submit(_copy_host_workspace, session, partial, cap, setting, owner)
        trees = [pool.submit(tree, index, path) for index, path in enumerate(paths)]
        report = workspace.result()  # the first failure raises once every copy has ended (the pool's exit)
        results = [(report.size_bytes, list(report.skipped)), *(future.result() for future in trees)]
    return sum(size for size, _ in results), [note for _, notes in results for note in notes], report.method


def _take_tmpfs(
    session: DockerSession,
    container: OpenedContainer,
    partial: str,
    paths: tuple[str, ...],
    *,
    budget: tuple[int, int],
    setting: str,
) -> tuple[int, list[str]]:
    """Archive the tmpfs directories inside the sandbox into the partial snapshot: bytes used, what was left.

    ``budget`` is (used so far, cap). A forkable session's are copied on the host instead
    (:func:`_copy_all_on_host`).
    """
    used, cap = budget
    skipped: list[str] = []
    os.mkdir(os.path.join(partial, "tmpfs"), 0o700)
    for index, path in enumerate(paths):
        data, notes = _archive(session, container, path, cap - used, setting)
        write_private(os.path.join(partial, "tmpfs", f"{index}.tar"), data)
        used += len(data)
        skipped += [f"{path}: {note}" for note in notes]
    return used, skipped


def _copy_host_workspace(
    session: DockerSession, partial: str, cap: int, setting: str, owner: tuple[int, int] | None = None
) -> CopyReport:
    """Copy the session's host workspace (the truth while no command runs) into the partial snapshot.

    ``owner``: whose the copy is (a fork by layer's lower: the command user's); None: this process's.
    """
    host = session.workspace
    if host is None:
        return CopyReport("none", 0, ())
    target = os.path.join(partial, "workspace")
    os.mkdir(target, 0o700)
    if owner is not None:
        os.chown(target, *owner)
    report = copy_workspace(host, target, cap, setting)
    if session._config.spec.git_placeholder is not None:
        # The empty .git made to be mounted read-only over a workspace without one: not one of its files.
        with contextlib.suppress(OSError):
            os.rmdir(os.path.join(target, ".git"))
    return report


def _over_cap(size: int, max_mb: int, what: str) -> PolicyNotEnforceableError:
    return PolicyNotEnforceableError(
        f"the snapshot would hold {size // MIB} MiB (with {what}), more than its cap of {max_mb} MiB; "
        "nothing was taken and nothing is left of it. Take it with a larger max_mb, or free space in the "
        "session first"
    )


def _archive(
    session: DockerSession, container: OpenedContainer, path: str, room: int, setting: str
) -> tuple[bytes, list[str]]:
    """The tar of the tmpfs directory ``path`` (at most ``room`` bytes), and what tar could not read."""
    argv = ("/bin/sh", "-c", _ARCHIVE_SCRIPT, "adk-sandbox-snapshot", path)
    code, data, err, truncated = run_in_sandbox(session, container, argv, None, max(room, 0) + 1)
    if truncated or len(data) > room:
        raise PolicyNotEnforceableError(
            f"the snapshot would not fit its cap: {path} alone brings it past {setting}; nothing was taken "
            "and nothing is left of it. Take it with a larger max_mb, or free space in the session first"
        )
    if code not in (0, 1, 2) or not data:  # 1: a file changed while read, 2: some could not be read
        raise SandboxFailedError(
            f"could not archive {path} in the sandbox (tar exit {code}: "
            f"{err.decode('utf-8', 'replace').strip()[:300]}); nothing was taken"
        )
    notes = [line for line in err.decode("utf-8", "replace").splitlines() if line.strip()][:_MAX_NOTES]
    return data, notes


def restore_tmpfs(session: DockerSession, snapshot: Snapshot) -> list[str]:
    """Unpack the snapshot's tmpfs archives into the started ``session``'s sandbox; tar's complaints.

    Each is unpacked inside the sandbox as its command user (the task profile's root), never on the host.
    What crosses the channel holds no holes (the archives were made with ``--sparse``; a tree is archived
    with sparse members, :func:`_tree_archives`), and goes in pieces of about 64 MiB cut between members
    (:func:`_archive_pieces`): the sandbox's agent ends a command's input past 256 MiB it holds, which tar
    reported as "Unexpected EOF in archive".
    """
    container = session._opened()
    if snapshot.tmpfs_format == "tree" and set(snapshot.tmpfs) <= set(session.state_dirs):
        return _copy_trees_in(session, snapshot)
    notes: list[str] = []
    for index, path in enumerate(snapshot.tmpfs):
        try:
            if snapshot.tmpfs_format == "tree":
                pieces = _tree_archives(snapshot.tree(index), path)
            else:
                fd = os.open(snapshot.archive(index), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                pieces = _archive_pieces(fd)
            argv = ("/bin/sh", "-c", _RESTORE_SCRIPT, "adk-sandbox-restore", path)
            for data in pieces:
                code, _, err, _ = run_in_sandbox(session, container, argv, data, 64 * 1024)
                lines = [line for line in err.decode("utf-8", "replace").splitlines() if line.strip()]
                if code not in (0, 2):
                    raise SandboxFailedError(
                        f"could not restore {path} from snapshot {snapshot.id} (tar exit {code}: "
                        f"{' '.join(lines)[:300]})"
                    )
                notes += [f"{path}: {line}" for line in lines[:_MAX_NOTES]]
        except FileNotFoundError:
            raise SandboxFailedError(
                f"snapshot {snapshot.id} lost its copy of {path} (removed meanwhile?); the session "
                "was not "
                "started from it"
            ) from None
    for note in notes:
        log.info("restoring snapshot %s: %s", snapshot.id, note)
    return notes


def _archive_pieces(fd: int) -> Iterator[bytes]:
    """The tar archive open at ``fd`` (closed at the end) as archives of whole members, each about 64 MiB.

    The archive is a sandbox's output: only its headers are read here (``tarfile``, nothing unpacked), for
    where each member starts; the bytes between go as they are. One that does not read as a tar goes
    whole, for the sandbox's tar to judge, as before.
    """
    try:
        size = os.fstat(fd).st_size
        starts: list[int] = []
        end = 0
        with os.fdopen(os.dup(fd), "rb") as handle:
            try:
                with read_gnu_archive(handle) as archive:
                    starts = [member.offset for member in archive]
                    end = archive.offset  # past the last member's data: the end blocks follow
            except tarfile.TarError:
                starts = []
        if not starts or end > size:
            yield _read_range(fd, 0, size)
            return
        bounds = [*starts, end]
        first = 0
        for index in range(1, len(bounds)):
            last = index == len(bounds) - 1
            if last or bounds[index + 1] - bounds[first] > ARCHIVE_BYTES:
                yield tar_end([_read_range(fd, bounds[first], bounds[index])])
                first = index
    finally:
        os.close(fd)


def _read_range(fd: int, start: int, end: int) -> bytes:
    """Bytes ``start..end`` of ``fd`` (fewer at its end)."""
    chunks = []
    while start < end:
        chunk = os.pread(fd, min(end - start, 16 * MIB), start)
        if not chunk:
            break
        chunks.append(chunk)
        start += len(chunk)
    return b"".join(chunks)


def _copy_trees_in(session: DockerSession, snapshot: Snapshot) -> list[str]:
    """Copy the snapshot's tmpfs trees into the session's tmpfs volumes on the host; what was left out.

    Nothing crosses the session's channel. The same safe walk as a workspace copy (no link followed on
    either side, special files and set-id bits left out); the files are the command user's (the volume
    root's owner), and each volume's own ``size=`` still bounds what lands in it.
    """
    sizes = tmpfs_sizes(session._config.spec)
    notes: list[str] = []
    for index, path in enumerate(snapshot.tmpfs):
        setting = f"the size of {path} (ResourceLimits(tmpfs_mb=...) or the backend's tmpfs=)"
        try:
            copied = copy_workspace(
                snapshot.tree(index), session.state_dirs[path], sizes[path] * MIB, setting
            )
        except FileNotFoundError:
            raise SandboxFailedError(
                f"snapshot {snapshot.id} lost its copy of {path} (removed meanwhile?); the session was not "
                "started from it"
            ) from None
        notes += [f"{path}/{note}" for note in copied.skipped]
    return notes


def _tree_archives(tree: str, path: str) -> Iterator[bytes]:
    """A snapshot's tmpfs tree (its own safe copy: no link leads out) as tars for a sandbox to unpack.

    Links are kept as links, never followed; a sparse file goes as a sparse member (its data and its map:
    :func:`tar_file_member`), never its holes. Cut between files into archives of about 64 MiB, each whole,
    so neither this process nor the sandbox's agent holds more at once; a file whose data alone passes what
    one command's input carries is refused with its name (``path`` is where the tree goes inside).
    """
    if not os.path.isdir(tree):
        raise FileNotFoundError(tree)
    with tarfile.open(fileobj=io.BytesIO(), mode="w", format=tarfile.GNU_FORMAT) as builder:  # headers only
        yield from archives(_tree_members(builder, tree, "", path), ARCHIVE_BYTES)


def _tree_members(
    builder: tarfile.TarFile, tree: str, rel: str, path: str
) -> Iterator[list[bytes | memoryview]]:
    """The members of everything below ``tree``/``rel`` in order (a directory before what it holds)."""
    for name in sorted(os.listdir(os.path.join(tree, rel) if rel else tree)):
        arcname = f"{rel}/{name}" if rel else name
        full = os.path.join(tree, arcname)
        info = builder.gettarinfo(full, arcname)  # lstat: a link is a link, never followed
        if info is None:
            continue  # a special file the safe copy would not have made
        if info.isreg():
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                content = read_content(fd)
            finally:
                os.close(fd)
            if content.data_bytes > MAX_FILE_DATA:
                raise SandboxFailedError(
                    f"{path}/{arcname} of the snapshot holds {content.data_bytes // MIB} MiB of data, more "
                    f"than one copy into the sandbox carries ({MAX_FILE_DATA // MIB} MiB); the session was "
                    "not started from it. Start it from a forkable pool (PoolConfig(forkable=True)), whose "
                    "copy stays on the host"
                )
            owner = (info.uid, info.gid)
            yield tar_file_member(arcname, content, mode=info.mode, owner=owner, mtime=int(info.mtime))
            continue
        yield [tar_header(info)]
        if info.isdir():
            yield from _tree_members(builder, tree, arcname, path)


def fork_workspace(snapshot: Snapshot, cap_bytes: int) -> str | None:
    """A fresh host directory of this process holding a copy of the snapshot's workspace (None: none).

    Made where workspace copies are (a killed owner's are reaped as theirs are), mode 0700.
    """
    if snapshot.workspace is None:
        return None
    return host_copy(snapshot.workspace_dir, cap_bytes)


def host_copy(source: str, cap_bytes: int, *, owned_as_source: bool = False) -> str:
    """A fresh host directory of this process holding a safe copy of ``source`` (see :func:`fork_workspace`).

    ``owned_as_source``: the copy (every file in it) is owned by ``source``'s owner, with its mode: the
    workspace a restored process goes on using as that user (a fork with processes). Else 0700, ours.
    """
    host = tempfile.mkdtemp(prefix=copy_prefix("copy"), dir=copies_dir())
    try:
        if owned_as_source:
            copy_as_source(source, host, cap_bytes, "DockerBackend(mirror_size_mb=...)")
        else:
            copy_workspace(source, host, cap_bytes, "DockerBackend(mirror_size_mb=...)")
    except BaseException:
        shutil.rmtree(host, ignore_errors=True)
        raise
    return host


def copy_as_source(source: str, dest: str, cap_bytes: int, setting: str) -> CopyReport:
    """:func:`copy_workspace` into the fresh directory ``dest``, every file owned by ``source``'s owner.

    ``dest`` takes ``source``'s owner and mode too: the workspace restored processes go on using as that
    user (a fork or snapshot with processes).
    """
    info = os.stat(source)
    os.chown(dest, info.st_uid, info.st_gid)
    os.chmod(dest, info.st_mode & 0o777)
    return copy_workspace(source, dest, cap_bytes, setting)


# -- the root layer ------------------------------------------------------------------------------------
def _root_layer_size(client: docker.DockerClient, container_id: str) -> int:
    listed: list[dict[str, Any]] = idempotent(
        lambda: client.api.containers(all=True, filters={"id": container_id}, size=True)
    )
    return int(listed[0].get("SizeRw") or 0) if listed else 0


def _commit(client: docker.DockerClient, container_id: str, snapshot: Snapshot) -> str:
    """``docker commit`` of the container (paused meanwhile) into a labelled image; its id."""
    from adk_sandbox.executor.backends.docker._daemon import daemon_errors  # noqa: PLC0415

    with daemon_errors():
        made = client.api.commit(
            container_id,
            repository=IMAGE_REPOSITORY,
            tag=snapshot.id,
            conf={"Labels": snapshot.engine_labels()},
            pause=True,
        )
    return str(made["Id"])


def _image_remover(client: docker.DockerClient) -> Callable[[str], None]:
    """What removes a root image of ``client``'s engine (for an owned snapshot removed at exit)."""
    return lambda image: remove_snapshot_image(client, image)


def remove_snapshot_image(client: docker.DockerClient, image: str) -> None:
    """Remove a snapshot's root image (gone already is fine); refused while a session's container runs it."""

    def remove() -> None:
        try:
            client.api.remove_image(image, force=True, noprune=False)
        except docker.errors.ImageNotFound:
            return
        except docker.errors.APIError as exc:
            if exc.status_code == 404:
                return
            if exc.status_code == 409:
                raise InvalidRequestError(
                    f"the snapshot's root image {image[:19]} is used by a running session; close "
                    "the sessions "
                    "started from it first"
                ) from exc
            raise

    idempotent(remove)


def reap_snapshots(client: docker.DockerClient | None, store: SnapshotStore) -> list[str]:
    """Remove leaked snapshots (expired, owner gone) with their images, and snapshot images left alone.

    An image labelled as a snapshot's whose snapshot is not in ``store`` is removed when its own labels say
    it is leaked (a snapshot removed without its engine, or a process killed between the commit and the
    record). Without a client only snapshots without a root image are reaped.
    """

    def remover(image: str) -> None:
        assert client is not None  # noqa: S101 - only passed with a client
        remove_snapshot_image(client, image)

    removed = store.reap(remover if client is not None else None)
    if client is None:
        return removed
    known = {snapshot.id for snapshot in store.list()}
    listed: list[dict[str, Any]] = idempotent(
        lambda: client.api.images(filters={"label": [_owner.PROJECT_LABEL, SNAPSHOT_LABEL]})
    )
    now = time.time()
    for entry in listed:
        labels = entry.get("Labels") or {}
        snapshot_id = labels.get(SNAPSHOT_LABEL, "")
        reason = _owner.leak_reason(labels, now)
        if snapshot_id in known or reason is None:
            continue
        try:
            remove_snapshot_image(client, str(entry["Id"]))
        except ExecutorError as exc:
            log.warning("could not remove the image of snapshot %s: %s", snapshot_id, exc)
            continue
        removed.append(f"image of {snapshot_id}: {reason}")
    return removed
