"""How the host workspace reaches a session's container: one seam, a bind mount or a mirror.

A :class:`WorkspaceTransport` is asked at four moments of a session: once the container is up
(:meth:`~WorkspaceTransport.started`), before and after every command, and before the container goes
(:meth:`~WorkspaceTransport.closing`). Two implementations:

* :class:`BindWorkspace` (``"bind"``): the host directory is bind-mounted at its own path; there is
  nothing to copy. The start-up probe (:mod:`._probe`) checks with a nonce file that the engine mounted
  *this* machine's directory.
* :class:`MirrorWorkspace` (``"mirror"``): a size-capped tmpfs volume at the same absolute path, owned by the
  command user (the Kubernetes backend's: the Pod's memory-backed workspace ``emptyDir``, mounted at that
  path; :mod:`adk_sandbox.executor.backends._synced_workspace` drives it for both sessions). The host tree is
  pushed in at start; after each command the container's tree is listed (GNU ``find -printf``), diffed against
  what the host last gave it, and only the regular files that changed travel back (one GNU ``tar -c`` of
  them). Host-side changes (the file tools write the host copy, which stays the truth) are found by a
  host-side diff and pushed before the next command. All traffic goes over the session's own command channel,
  as the command user (``tar -x`` in the container, so what it creates is the user's); the image needs GNU
  ``find`` and
  ``tar`` (the base image has both).

Pull-back is hostile input (docs/DOCKER.md, "Workspace transport"): names are checked (relative, no
``..``/``.``/empty component, no NUL, UTF-8, no ``.git`` component at any depth), every write goes
through :class:`adk_sandbox.executor.workspace.beneath.RootDir` descriptors with the literal path checked
(no symlink on the host is followed by a write), special files are refused, a symlink is recreated only
when it resolves inside the workspace (and not into a ``.git``), set-id bits are dropped, ownership stays
the workspace owner's, and no more than the volume's cap is ever received.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import logging
import os
import posixpath
import re
import shutil
import stat
import tarfile
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from adk_sandbox.executor import _owner
from adk_sandbox.executor.errors import PolicyNotEnforceableError, SandboxFailedError
from adk_sandbox.executor.workspace.beneath import EscapeError, RootDir
from adk_sandbox.executor.workspace.racy import RACY_NS, racy, scan_clock_ns, window_ns

__all__ = [
    "AUTO_CHOICES",
    "DEFAULT_MIRROR_MB",
    "WORKSPACE_TRANSPORTS",
    "AutoChoices",
    "BindWorkspace",
    "MirrorWorkspace",
    "Run",
    "RunResult",
    "WorkspaceTransport",
    "copies_dir",
    "copy_prefix",
    "copy_tree",
    "mirror_mount_violations",
    "reap_copies",
]

log = logging.getLogger(__name__)

#: The choices of ``DockerBackend(workspace_transport=...)``.
WORKSPACE_TRANSPORTS = ("auto", "bind", "mirror")
#: The default size cap of a mirror volume, in MiB.
DEFAULT_MIRROR_MB = 1024
#: How long one sync step (a listing, a push, a fetch) may take.
SYNC_SECONDS = 300.0
#: Refusals said at the end of a command's stderr, at most.
MAX_REPORTED = 10


@dataclass(frozen=True)
class RunResult:
    """What a sync command in the container gave: exit status (None: timed out), stdout, stderr."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    truncated: bool
    """stdout was longer than the ``max_output`` asked for."""


#: Runs argv in the container as the command user: (argv, stdin, max_output bytes) -> result.
Run = Callable[[tuple[str, ...], bytes | None, int], RunResult]


class WorkspaceTransport(Protocol):
    """How the workspace reaches the container (see the module docstring)."""

    mode: Literal["bind", "mirror"]

    def started(self, run: Run) -> None:
        """The container is up and verified: make the workspace present in it."""

    def before_command(self, run: Run) -> None:
        """Bring host-side changes into the container (the host copy is the truth)."""

    def after_command(self, run: Run) -> list[str]:
        """Bring the container's changes back to the host; what was refused (for the model to read)."""

    def closing(self, run: Run) -> None:
        """The container is about to be removed: bring its last changes back."""


class BindWorkspace:
    """The host directory bind-mounted at its own path: both sides see the same files, nothing to copy."""

    mode: Literal["bind", "mirror"] = "bind"

    def started(self, run: Run) -> None:
        """Nothing to copy (the identity probe already proved the mount is this machine's directory)."""

    def before_command(self, run: Run) -> None:
        """Nothing to copy."""

    def after_command(self, run: Run) -> list[str]:
        """Nothing to copy, nothing refused."""
        return []

    def closing(self, run: Run) -> None:
        """Nothing to copy."""


#: The engine's socket (path, device, inode, ctime) and the workspace directory's (device, inode).
_ChoiceKey = tuple[str, int, int, int, int, int]


class AutoChoices:
    """What ``"auto"`` found for each workspace on each local engine, kept for this process.

    ``"bind"``: the identity check passed; ``"mirror"``: it failed. A failed check costs a whole container
    (created, started, probed, removed) before the mirror's own, so a second session of the workspace
    goes to the mirror at once. The key is the engine's socket (path, device, inode, ctime: a restarted or
    other daemon makes a new socket, which is checked again) and the workspace directory (device, inode: the
    same directory by any path; a directory has no stable time to add, so one made later under a reused
    inode number gets the remembered answer). A remembered ``"bind"`` changes nothing: every bound
    session is identity-checked at start anyway, and a check failing then is remembered as ``"mirror"``.
    A remembered ``"mirror"`` stays for the process: mirroring a directory the engine could see is
    slower, never wrong.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[_ChoiceKey, Literal["bind", "mirror"]] = {}

    @staticmethod
    def key(socket_path: str | None, workspace: str) -> _ChoiceKey | None:
        """The key of ``workspace`` on the local engine at ``socket_path`` (None: nothing to key by)."""
        if socket_path is None:
            return None  # not a local engine: "auto" mirrors without a check
        try:
            engine, directory = os.stat(socket_path), os.stat(workspace)
        except OSError:
            return None
        # The ctime too: a socket made anew may get the inode number of the one removed.
        return (
            socket_path,
            engine.st_dev,
            engine.st_ino,
            engine.st_ctime_ns,
            directory.st_dev,
            directory.st_ino,
        )

    def get(self, key: _ChoiceKey | None) -> Literal["bind", "mirror"] | None:
        """What was found for ``key`` (None: never checked)."""
        if key is None:
            return None
        with self._lock:
            return self._known.get(key)

    def put(self, key: _ChoiceKey | None, mode: Literal["bind", "mirror"]) -> None:
        """Remember ``mode`` for ``key`` (a ``"mirror"`` is never replaced by a later ``"bind"``)."""
        if key is None:
            return
        with self._lock:
            if self._known.get(key) != "mirror":
                self._known[key] = mode

    def clear(self) -> None:
        """Forget everything (the next ``"auto"`` session of each workspace checks again)."""
        with self._lock:
            self._known.clear()


#: The process's :class:`AutoChoices`, shared by every backend and session.
AUTO_CHOICES = AutoChoices()


# -- the mirror ----------------------------------------------------------------------------------------

Kind = Literal["f", "d", "l", "o"]
#: A host entry's lstat as a scan compares it: st_mode, size, mtime, ctime, inode, device.
_Key = tuple[int, int, int, int, int, int]


@dataclass(frozen=True)
class Entry:
    """One entry of a tree as a sync compares it: kind, permission bits, size, mtime, link target.

    ``size``, ``mtime_ns``, ``ctime_ns`` and ``inode`` count for files only, ``target`` for links only
    (see :meth:`same`).
    """

    kind: Kind
    mode: int
    size: int = 0
    mtime_ns: int = 0
    target: str = ""
    inode: int = 0
    """0: not known (what a push predicts for the container). A file replaced by a rename is a change even
    with the same size and mtime."""
    ctime_ns: int = 0
    """0: not known. Every write, chmod, rename or ``touch -d`` sets it to the current time, and nothing
    unprivileged can set it back: an edit that keeps size and mtime (forged or within the clock's
    granularity) still changes it."""

    def same(self, other: Entry | None) -> bool:
        """Whether ``other`` is this entry unchanged, as far as a sync cares (unknown fields match)."""
        if other is None or other.kind != self.kind:
            return False
        if self.kind == "l":
            return other.target == self.target
        if self.kind == "d":
            return other.mode == self.mode
        if (other.mode, other.size, other.mtime_ns) != (self.mode, self.size, self.mtime_ns):
            return False
        if self.inode and other.inode and self.inode != other.inode:
            return False
        return not (self.ctime_ns and other.ctime_ns and self.ctime_ns != other.ctime_ns)


# Lists the tree below $1 as records "<path>\0<type> <mode> <size> <mtime> <ctime> <inode>\0<link target>\0",
# every .git (at any depth) left out: pull-back never writes one, so there is nothing to list there. First
# comes one record for $2, a file made just before the walk: its ctime is the container's "now" (see
# MirrorWorkspace._racy). Its name is fresh each time and made with noclobber: nothing planted there is
# written through.
_LIST_SCRIPT = (
    'cd -- "$1" || exit 97\nset -C\nnow=\nif : > "$2"; then now="$2"; fi 2>/dev/null\n'
    "find $now . -path . -o -path \"$2\" -printf '\\0%y 0 0 %T@ %C@ 0\\0\\0' -o -name .git -prune -o "
    "-printf '%P\\0%y %m %s %T@ %C@ %i\\0%l\\0'\n"
    'status=$?\nrm -f -- "$2"\nexit $status'
)
# A tar of the NUL-separated names on stdin (relative to $1), each itself: no recursion into directories,
# hard links as full files, names taken verbatim (one starting with '-' is not an option).
_FETCH_SCRIPT = (
    'cd -- "$1" || exit 97\n'
    "exec tar -c -f - --format=gnu --no-recursion --hard-dereference --verbatim-files-from --null -T -"
)
# Unpacks the tar on stdin into $1 with its modes and mtimes, as the command user.
_PUSH_SCRIPT = 'cd -- "$1" || exit 97\nexec tar -x -p -f - --no-same-owner --delay-directory-restore'
# Removes the NUL-separated names on stdin (relative to $1).
_REMOVE_SCRIPT = 'cd -- "$1" || exit 97\nexec xargs -0 -r rm -rf --'
_TOOLS_MISSING = 127


class MirrorWorkspace:
    """The workspace as a copy in a tmpfs volume at the same path (see the module docstring).

    ``root`` is the host workspace (absolute, resolved), at the same path in the sandbox; ``cap_mb`` the
    size of the sandbox's copy (a Docker volume's, a Kubernetes ``emptyDir``'s ``sizeLimit``); ``owner``
    the ``(uid, gid)`` the host copy's new files get when this process runs as root (the workspace
    owner's); ``cap_setting`` the setting that raises the cap, named in the errors a full copy gives.
    """

    mode: Literal["bind", "mirror"] = "mirror"

    def __init__(
        self,
        root: str,
        cap_mb: int,
        owner: tuple[int, int],
        *,
        cap_setting: str = "DockerBackend(mirror_size_mb=...)",
    ) -> None:
        self.root = root
        self.cap_bytes = cap_mb * 1024 * 1024
        self.owner = owner
        self.cap_setting = cap_setting
        self._tree: RootDir = RootDir(root)
        self._host: dict[str, Entry] = {}
        """The host tree as of the last sync (what the container was given or gave back)."""
        self._inside: dict[str, Entry] = {}
        """The container's tree as of the last sync (no ``.git``: it is never listed)."""
        self._pulled_links: set[str] = set()
        """Links pull-back made on the host, checked again after every pull-back."""
        self.refused: list[str] = []
        """Why entries of the last pull-back were not brought to the host (empty when all came)."""
        # The fast paths (docs/DOCKER.md, "What a sync costs"): an entry whose stat is byte-for-byte what
        # it was last time is not looked at again. Both keep only entries known to be in sync.
        self._host_keys: dict[str, _Key] = {}
        """The host's lstat of each entry at the last scan (mode, size, mtime, ctime, inode)."""
        self._records: dict[bytes, bytes] = {}
        """The container's listing record of each entry at the last listing, while it is in sync."""
        # "Racy" entries: changed so recently that a later change could carry the same timestamps (a
        # clock's granularity; no kernel before 6.13 makes a stat'ed inode's next ctime differ).
        held = os.fstat(self._tree.fd)
        self._root_id = (held.st_dev, held.st_ino)
        """The workspace directory this copy syncs (a replaced one fails the next sync)."""
        self._racy_ns = window_ns(self._tree.fd)
        """How recent a host file's ctime makes it racy (see :mod:`._racy`): the root's file system's."""
        self._host_racy: set[str] = set()
        """Host files whose ctime was within the racy window of the last scan: content checked next time."""
        self._digests: dict[str, bytes] = {}
        """SHA-256 of what the container was given (or gave back) for the racy host files."""
        self._inside_racy: set[str] = set()
        """Container files whose ctime was not older than the last listing: fetched again next time."""

    # -- the four moments ----------------------------------------------------------------------------
    def started(self, run: Run) -> None:
        """Push the whole host tree into the fresh volume, then take the container's listing as the base."""
        scanned, keys = self._scan()
        host = {path: entry for path, key in keys.items() if (entry := _host_entry(self._tree, path, key))}
        check_fits(self.root, host, self.cap_bytes, self.cap_setting)
        self._host, self._inside, self._records, self._digests = {}, {}, {}, {}
        self._inside_racy = set()
        racy = self._racy(host, keys, scanned)
        skipped = self._push(run, host, sorted(host), removed=[], racy=racy)
        _forget(skipped, host, keys)
        records, now, complete = self._list(run)
        if not complete:
            raise SandboxFailedError(
                "could not list the workspace copy in the sandbox after copying it in; nothing ran"
            )
        listed: dict[bytes, Entry] = {}
        for key, record in records.items():
            parsed = _parse_record(key, record)
            if parsed is not None:
                self._inside[parsed[0]] = listed[key] = parsed[1]
        self._keep_records(records, listed, now)
        self._host, self._host_keys, self._host_racy = host, keys, racy

    def before_command(self, run: Run) -> None:
        """Push what changed on the host since the last sync (host-side diff: lstat of every entry)."""
        scanned, keys = self._scan()
        host: dict[str, Entry] = {}
        changed: list[str] = []
        for path, key in keys.items():
            known = self._host.get(path)
            if known is not None and self._host_keys.get(path) == key and path not in self._host_racy:
                host[path] = known  # not one stat field moved since the last scan (and it was in sync then)
                continue
            entry = _host_entry(self._tree, path, key)
            if entry is None:
                continue
            host[path] = entry
            if not entry.same(known) or (path in self._host_racy and not self._same_content(path)):
                changed.append(path)
        removed = [path for path in self._host if path not in host]
        # An entry that changed kind is removed first: tar does not replace a directory by a file.
        retyped = [p for p in changed if p in self._host and self._host[p].kind != host[p].kind]
        racy = self._racy(host, keys, scanned)
        if changed or removed:
            skipped = self._push(
                run, host, sorted(changed), removed=sorted(set(removed) | set(retyped)), racy=racy
            )
            _forget(skipped, host, keys)
        self._host, self._host_keys, self._host_racy = host, keys, racy
        for path in [p for p in self._digests if p not in racy]:
            del self._digests[path]

    def _scan(self) -> tuple[int, dict[str, _Key]]:
        """The scan's time (the file systems' clock) and the host tree's keys, walked from the held root.

        Refuses to go on when the workspace directory was replaced on the host (removed and made again,
        renamed over): the walk and every read go through the directory this session opened, and a sync
        of a directory no one sees any more would copy nothing, silently.
        """
        scanned = scan_clock_ns()
        try:
            now = os.stat(self.root, follow_symlinks=False)
            same = (now.st_dev, now.st_ino) == self._root_id
        except OSError:
            same = False
        if not same:
            raise SandboxFailedError(
                f"the workspace directory {self.root} was removed or replaced on the host while its "
                "session was open, so its copy in the sandbox can no longer be synced; nothing ran "
                "(open a new session)"
            )
        return scanned, host_keys(self._tree.fd)

    def _racy(self, host: dict[str, Entry], keys: dict[str, _Key], scanned: int) -> set[str]:
        """The racy host files of this scan: the root's window, or RACY_NS when a mount is inside."""
        device = self._root_id[0]
        window = self._racy_ns if all(key[5] == device for key in keys.values()) else RACY_NS
        return racy(((p, e.ctime_ns) for p, e in host.items() if e.kind == "f"), scanned, window)

    def _same_content(self, path: str) -> bool:
        """Whether the racy host file ``path`` still holds what the container was given (or gave back)."""
        content = _read_host_file(self._tree, path)
        digest = self._digests.get(path)
        return content is not None and digest is not None and hashlib.sha256(content).digest() == digest

    def after_command(self, run: Run) -> list[str]:
        """Pull back what changed in the container; the refusals, also kept in :attr:`refused`."""
        self.refused = []
        records, now, complete = self._list(run)
        refused: list[str] = []
        wanted: dict[str, Entry] = {}
        listed: dict[bytes, Entry] = {}
        known_records = self._records
        unmatched = 0
        for key, record in records.items():
            if known_records.get(key) == record:
                continue  # byte-for-byte the record of an entry in sync (never a racy one: not kept)
            unmatched += 1
            parsed = _parse_record(key, record)
            if parsed is None:
                continue
            path, entry = parsed
            listed[key] = entry
            known = self._inside.get(path)
            if entry.same(known) and not (entry.kind == "f" and path in self._inside_racy):
                if known is not None and known != entry:
                    self._inside[path] = entry  # what a push predicted, now with its inode and ctime
                continue
            wanted[path] = entry
        # Every record is a kept one and as many as there are kept entries: the listing is the last one, so
        # nothing is gone and nothing to keep anew (each kept path is in _inside, so they are the same set).
        unchanged = unmatched == 0 and len(records) == len(known_records) == len(self._inside)
        gone = []
        if complete and not unchanged:
            present = {key.decode("utf-8", "surrogateescape") for key in records}
            gone = [path for path in self._inside if path not in present]
        self._apply(run, wanted, gone, refused)
        if not unchanged:
            self._keep_records(records, listed, now)
        self.refused = refused
        for reason in refused:
            log.warning("mirror pull-back of %s refused: %s", self.root, reason)
        return refused

    def _keep_records(self, records: dict[bytes, bytes], listed: dict[bytes, Entry], now: int | None) -> None:
        """Keep the listing records of entries now in sync; note the racy ones (see :attr:`_inside_racy`).

        ``listed`` holds the parsed entries of the records that differed from the kept ones; a record not
        in it was kept before and is unchanged. A file whose ctime is not older than the container's "now"
        (or every changed file, when the listing brought no "now") is racy: neither kept nor trusted.
        """
        kept: dict[bytes, bytes] = {}
        racy: set[str] = set()
        for key, record in records.items():
            entry = listed.get(key)
            if entry is None:
                if self._records.get(key) == record:
                    kept[key] = record  # unchanged since it was kept
                continue  # else refused when parsed: never in sync
            path = key.decode("utf-8")
            if entry.kind == "f" and (now is None or entry.ctime_ns >= now):
                racy.add(path)
            elif self._inside.get(path) == entry:
                kept[key] = record
        self._records, self._inside_racy = kept, racy

    def closing(self, run: Run) -> None:
        """The last pull-back (refusals are logged)."""
        self.after_command(run)

    def close(self) -> None:
        """Release the workspace root's descriptor."""
        self._tree.close()

    # -- container side ------------------------------------------------------------------------------
    def _list(self, run: Run) -> tuple[dict[bytes, bytes], int | None, bool]:
        """The container's listing: records by path, its "now" (ns; None: unknown), whether complete."""
        now_file = f"/tmp/.adk-sandbox-now-{os.urandom(8).hex()}"
        argv = ("/bin/sh", "-c", _LIST_SCRIPT, "adk-sandbox-list", self.root, now_file)
        result = run(argv, None, 256 * 1024 * 1024)
        _check_tools(result, "find")
        fields = result.stdout.split(b"\0")
        count = (len(fields) - 1) // 3
        records = dict(zip(fields[0 : 3 * count : 3], fields[1 : 3 * count : 3], strict=True))
        now: int | None = None
        mark = records.pop(b"", None)
        if mark is not None:
            parts = mark.split(b" ")
            with contextlib.suppress(ValueError):  # the sandbox's output: unknown when it does not parse
                now = _ns(parts[4]) if len(parts) == 6 else None
        # A link's target is part of its record (the record is compared as a whole).
        for index in range(count):
            target = fields[3 * index + 2]
            if target:
                key = fields[3 * index]
                records[key] = records[key] + b"\0" + target
        # An unreadable directory (find exits 1) or a cut listing must not read as "everything in it is
        # gone": deletions are applied only from a complete listing.
        return records, now, result.exit_code == 0 and not result.truncated

    def _forget_records(self, paths: tuple[str, ...]) -> None:
        """Drop the kept listing records of ``paths``: they change, so the next listing compares them."""
        for path in paths:
            self._records.pop(path.encode("utf-8", "surrogateescape"), None)

    def _push(
        self, run: Run, host: dict[str, Entry], paths: list[str], removed: list[str], racy: set[str]
    ) -> list[str]:
        """Remove ``removed`` and send ``paths`` into the container; the files it could not read.

        A file skipped (gone, or not reachable as written since the scan) must not be recorded as in sync:
        the caller drops it from the scan, so the next sync sees it as new.
        """
        self._forget_records((*removed, *paths))
        skipped: list[str] = []
        if removed:
            result = run(
                ("/bin/sh", "-c", _REMOVE_SCRIPT, "adk-sandbox-remove", self.root),
                b"\0".join(p.encode("utf-8", "surrogateescape") for p in removed) + b"\0",
                64 * 1024,
            )
            _check_tools(result, "xargs and rm")
            for path in removed:
                for known in [p for p in self._inside if p == path or p.startswith(path + "/")]:
                    del self._inside[known]
        if not paths:
            return skipped
        uid, gid = self.owner
        data = io.BytesIO()
        with tarfile.open(fileobj=data, mode="w", format=tarfile.GNU_FORMAT) as archive:
            for path in paths:
                entry = host[path]
                info = tarfile.TarInfo(path)
                info.uid, info.gid, info.mode = uid, gid, entry.mode
                info.mtime = entry.mtime_ns // 1_000_000_000
                if entry.kind == "d":
                    info.type = tarfile.DIRTYPE
                    archive.addfile(info)
                elif entry.kind == "l":
                    info.type, info.linkname = tarfile.SYMTYPE, entry.target
                    archive.addfile(info)
                else:
                    content = _read_host_file(self._tree, path)
                    if content is None:
                        skipped.append(path)  # gone or no longer reachable as scanned: the next sync sees it
                        continue
                    info.size = len(content)
                    archive.addfile(info, io.BytesIO(content))
                    if path in racy:
                        self._digests[path] = hashlib.sha256(content).digest()
                    entry = Entry("f", entry.mode, len(content), info.mtime * 1_000_000_000)
                if safe_name(path):  # a .git is never listed, so never compared
                    # What the container will list for it (tar restores the mode and the whole-second mtime).
                    self._inside[path] = Entry(
                        entry.kind, entry.mode, entry.size, entry.mtime_ns, entry.target
                    )
        result = run(
            ("/bin/sh", "-c", _PUSH_SCRIPT, "adk-sandbox-push", self.root), data.getvalue(), 64 * 1024
        )
        _check_tools(result, "tar")
        if result.exit_code != 0:
            why = result.stderr.decode("utf-8", "replace").strip()[-400:]
            full = "No space left on device" in why
            self._inside, self._records = {}, {}  # unknown now: the next pull-back compares everything
            cap = self.cap_bytes // (1024 * 1024)
            raise SandboxFailedError(
                (
                    f"the workspace copy in the sandbox is full (its cap is {cap} MiB, {self.cap_setting}); "
                    if full
                    else ""
                )
                + f"copying host files into the sandbox failed ({why or f'exit status {result.exit_code}'}); "
                "nothing ran"
            )
        return skipped

    # -- host side -----------------------------------------------------------------------------------
    def _apply(  # noqa: PLR0912 - one pass over the kinds of change, in the order they must land
        self, run: Run, wanted: dict[str, Entry], gone: list[str], refused: list[str]
    ) -> None:
        """Write the container's changes to the host copy, every write contained (hostile input)."""
        tree = _HostTree(self._tree, self.owner)

        def host_moved(path: str) -> bool:
            # A host-side edit made while the command ran wins: the path is left for the next push.
            now, known = tree.entry(path), self._host.get(path)
            return not (now is None and known is None) and not (known is not None and known.same(now))

        for path in sorted(gone, key=lambda p: p.count("/"), reverse=True):
            self._inside.pop(path, None)
            if not host_moved(path):
                tree.remove(path)
                self._record(tree, path)
        files: dict[str, Entry] = {}
        budget = self.cap_bytes
        for path in sorted(wanted, key=lambda p: (p.count("/"), p)):
            entry = wanted[path]
            if host_moved(path):
                self._inside[path] = entry  # the push before the next command replaces it
                continue
            if entry.kind == "f":
                if entry.size > budget:
                    refused.append(f"{path}: {entry.size} bytes, more than the copy's cap lets come back")
                    self._inside[path] = entry
                else:
                    budget -= entry.size
                    files[path] = entry
                continue
            try:
                if entry.kind == "o":
                    raise _Refused(
                        "a special file (FIFO, socket or device): only files, directories and links"
                    )
                if entry.kind == "d":
                    tree.make_dir(path, entry.mode)
                else:
                    tree.make_link(path, entry.target)
                    self._pulled_links.add(path)
            except _Refused as exc:
                # What was there is gone in the sandbox: only the refused replacement does not come.
                tree.remove(path)
                refused.append(f"{path}: {exc}")
            except OSError as exc:
                refused.append(f"{path}: {exc.strerror or exc}")
            self._inside[path] = entry  # taken or refused: not asked again until it changes
            self._record(tree, path)
        if files:
            self._fetch(run, files, tree, refused)
        # A link is kept only while it resolves inside: a directory or link made later can change where an
        # older one leads, so every link pull-back made is checked again after each pull-back.
        for path in sorted(self._pulled_links):
            known = self._host.get(path)
            if known is None or known.kind != "l" or not known.same(tree.entry(path)):
                self._pulled_links.discard(path)  # replaced since (by the host or a later pull-back)
            elif not tree.link_stays_inside(path):
                tree.remove(path)
                self._record(tree, path)
                self._pulled_links.discard(path)
                refused.append(f"{path}: a symbolic link that now leads outside the workspace (or into .git)")

    def _record(self, tree: _HostTree, path: str) -> None:
        """Note the host entry at ``path`` as synced (absent: forgotten), so the next push leaves it."""
        now = tree.entry(path)
        if now is None:
            self._host.pop(path, None)
        else:
            self._host[path] = now

    def _fetch(self, run: Run, files: dict[str, Entry], tree: _HostTree, refused: list[str]) -> None:
        names = b"".join(path.encode("utf-8") + b"\0" for path in files)
        # The files asked for hold at most the cap; tar adds a header (long names: three) per file and an end.
        room = self.cap_bytes + 2048 * (len(files) + 1) + 20 * 512
        result = run(("/bin/sh", "-c", _FETCH_SCRIPT, "adk-sandbox-fetch", self.root), names, room)
        _check_tools(result, "tar")
        try:
            archive = tarfile.open(fileobj=io.BytesIO(result.stdout), mode="r:")  # noqa: SIM115 - with below
        except tarfile.TarError:
            refused.append("the changed files could not be read back from the sandbox (no archive)")
            return
        with archive:
            try:
                for member in archive:
                    path = member.name
                    entry = files.pop(path, None)
                    if entry is None:
                        continue  # not asked for
                    if not member.isreg():
                        refused.append(f"{path}: no longer a regular file when it was copied")
                        continue
                    source = archive.extractfile(member)
                    if source is None:
                        continue
                    data = source.read()
                    try:
                        # A racy file is fetched again: often what the host holds already.
                        if not tree.holds(path, data, entry.mode, member.mtime):
                            tree.write_file(path, data, entry.mode, member.mtime)
                        self._digests[path] = hashlib.sha256(data).digest()
                    except _Refused as exc:
                        refused.append(f"{path}: {exc}")
                    except OSError as exc:
                        refused.append(f"{path}: {exc.strerror or exc}")
                    else:
                        self._inside[path] = entry
                    self._record(tree, path)
            except tarfile.TarError:
                pass  # cut at the cap: what was not complete stays for the next pull-back
        if result.truncated:
            refused.append(
                f"the changed files exceed the copy's cap ({self.cap_bytes} bytes); the rest stayed"
            )


def _check_tools(result: RunResult, what: str) -> None:
    if result.exit_code == _TOOLS_MISSING:
        raise PolicyNotEnforceableError(
            f"the workspace mirror needs GNU {what} in the sandbox image, which it lacks "
            f"({result.stderr.decode('utf-8', 'replace').strip()[:200]}); use an image with GNU findutils "
            "and tar (or, on a local Docker engine, workspace_transport='bind')"
        )
    if result.exit_code is None:
        raise SandboxFailedError("syncing the workspace copy with the sandbox did not finish in time")


def _ns(text: bytes) -> int:
    """A ``find`` time (``%T@``: seconds, a dot, the fraction; negative: floor seconds) in ns."""
    seconds, _, fraction = text.partition(b".")
    if not fraction.isdigit() and fraction:
        raise ValueError(text)
    return int(seconds) * 1_000_000_000 + int((fraction[:9] or b"0").ljust(9, b"0"))


def _parse_record(raw: bytes, record: bytes) -> tuple[str, Entry] | None:
    """One listing record (path; type, mode, size, mtime, ctime, inode; link target) as (path, entry).

    None for what pull-back never takes (refused): a name that is not UTF-8 or not :func:`safe_name`,
    or a record that does not parse (the listing is the sandbox's output: it may say anything).
    """
    header, _, link = record.partition(b"\0")
    parts = header.split(b" ")
    if len(parts) != 6:
        return None
    kind, mode, size, mtime, ctime, inode = parts
    try:
        path = raw.decode("utf-8")
        target = link.decode("utf-8")
        numbers = (int(mode, 8) & 0o777, int(size), _ns(mtime), _ns(ctime), int(inode))
    except (UnicodeDecodeError, ValueError):
        return None
    if not safe_name(path):
        return None  # an unsafe name is never addressed on the host
    k: Kind = "f" if kind == b"f" else "d" if kind == b"d" else "l" if kind == b"l" else "o"
    if k != "f":
        return path, Entry(k, numbers[0], target=target)
    return path, Entry(k, numbers[0], numbers[1], numbers[2], target, numbers[4], numbers[3])


def safe_name(path: str) -> bool:
    """Whether pull-back may write ``path``: relative, plain components only, no ``.git`` anywhere."""
    if not path or path.startswith("/") or "\0" in path or len(path.encode("utf-8")) >= 4096:
        return False
    return all(part not in ("", ".", "..", ".git") for part in path.split("/"))


def host_keys(root: int) -> dict[str, _Key]:
    """The lstat of every entry below the open directory ``root`` (files, directories, links, special files).

    The one walk of a host scan: one ``lstat`` per entry (a change inside a file moves no directory's
    times, so no directory can be skipped), nothing read. Walked by descriptor: each directory is opened
    from its parent with ``O_NOFOLLOW`` and must be the one its ``lstat`` saw (device and inode), so a
    directory swapped for a link during the walk is left out (the next scan sees the link), and no name
    from outside the workspace is ever listed.
    """
    found: dict[str, _Key] = {}

    def walk(directory: int, prefix: str) -> None:
        try:
            with os.scandir(directory) as listing:
                entries = list(listing)
        except OSError:
            return
        for item in entries:
            try:
                info = item.stat(follow_symlinks=False)
            except OSError:
                continue
            rel = prefix + item.name
            found[rel] = (
                info.st_mode, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev,
            )  # fmt: skip
            if stat.S_ISDIR(info.st_mode):
                try:
                    below = os.open(item.name, _DIRECTORY_FLAGS, dir_fd=directory)
                except OSError:
                    continue  # unreadable, or no longer a directory: listed as it was seen, not entered
                try:
                    opened = os.fstat(below)
                    if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
                        del found[rel]  # replaced between the lstat and the open: the next scan sees it
                        continue
                    walk(below, rel + "/")
                finally:
                    os.close(below)

    walk(root, "")
    return found


_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _host_entry(tree: RootDir, rel: str, key: _Key) -> Entry | None:
    """The entry a host scan's ``key`` of ``rel`` is (None: a special file, or a link not read as such)."""
    mode, size, mtime_ns, ctime_ns, inode, _ = key
    if stat.S_ISDIR(mode):
        return Entry("d", stat.S_IMODE(mode) & 0o777, mtime_ns=mtime_ns)
    if stat.S_ISREG(mode):
        return Entry("f", mode & 0o777, size, mtime_ns, inode=inode, ctime_ns=ctime_ns)
    if stat.S_ISLNK(mode):
        target = _read_host_link(tree, rel)
        return Entry("l", 0o777, target=target) if target is not None else None
    return None


def scan_host(root: str) -> dict[str, Entry]:
    """The host tree below ``root`` (files, directories, links; special files left out), never following."""
    tree = RootDir(root)
    try:
        keys = host_keys(tree.fd)
        return {rel: entry for rel, key in keys.items() if (entry := _host_entry(tree, rel, key)) is not None}
    finally:
        tree.close()


def _forget(skipped: list[str], host: dict[str, Entry], keys: dict[str, _Key]) -> None:
    """Drop files a push skipped from a scan, so the next sync sees them as new rather than in sync."""
    for path in skipped:
        host.pop(path, None)
        keys.pop(path, None)


def check_fits(
    root: str, host: dict[str, Entry], cap_bytes: int, setting: str = "DockerBackend(mirror_size_mb=...)"
) -> None:
    """Refuse a tree (``host``, scanned from ``root``) whose files would not fit a copy of ``cap_bytes``.

    ``setting`` is what raises the cap (named in the error).
    """
    total = sum(entry.size for entry in host.values() if entry.kind == "f")
    if total > cap_bytes:
        raise PolicyNotEnforceableError(
            f"the workspace {root} holds {total // (1024 * 1024)} MiB of files, more than its copy "
            f"in the sandbox may hold ({cap_bytes // (1024 * 1024)} MiB); nothing ran. Create the "
            f"backend with a larger {setting}"
        )


def copies_dir() -> str:
    """Where workspace copies (``session(copy_of=...)``) are made: ``/dev/shm`` when it is a writable tmpfs.

    Creating files dominates a copy, and costs a disk filesystem's journal far more than memory (measured
    here: 2,000 files of 8 KiB, 2.2 s on ext4 against 0.05 s on tmpfs); else the temporary directory.
    """
    try:
        with open("/proc/self/mounts", encoding="utf-8") as mounts:
            shm = any(line.split()[1:3] == ["/dev/shm", "tmpfs"] for line in mounts)
    except OSError:
        shm = False
    if shm and os.access("/dev/shm", os.W_OK | os.X_OK):
        return "/dev/shm"
    return tempfile.gettempdir()


#: A copies directory's name: kind, then its owner (boot id, pid namespace, pid, start time), then random.
_COPY_NAME = re.compile(r"adk-sandbox-(?:pool|copy)-([0-9a-f]{8})-(\d+)-(\d+)-(\d+)-[^/]*")


def copy_prefix(kind: Literal["pool", "copy"]) -> str:
    """The ``mkdtemp`` prefix of a copies directory this process makes: it names the owner, for the reaper.

    The owner is told as the container labels tell it (:mod:`adk_sandbox.executor._owner`): boot, pid
    namespace, pid and the process's start time, so :func:`reap_copies` removes what a killed owner left and
    nothing else.
    """
    pid = os.getpid()
    return f"adk-sandbox-{kind}-{_boot_tag()}-{_owner.pid_namespace()}-{pid}-{_owner.start_time(pid)}-"


def reap_copies(directory: str | None = None) -> list[str]:
    """Remove the copies directories (in ``directory``, default :func:`copies_dir`) of owners now gone.

    Only directories of this process's user, named by :func:`copy_prefix`, made in this boot and pid
    namespace by a process that no longer runs (its pid gone or started at another time), or in an earlier
    boot. ``DockerBackend()`` calls this as it reaps leaked containers: a killed owner's copies live in
    memory (``/dev/shm``). Returns the paths removed.
    """
    where = directory or copies_dir()
    boot, namespace = _boot_tag(), str(_owner.pid_namespace())
    removed: list[str] = []
    try:
        names = os.listdir(where)
    except OSError:
        return removed
    for name in names:
        match = _COPY_NAME.fullmatch(name)
        if match is None:
            continue
        owner_boot, owner_ns, pid, start = match.groups()
        if owner_boot == boot and (owner_ns != namespace or _owner.start_time(int(pid)) == start):
            continue  # its owner runs (or is one this process cannot see)
        path = os.path.join(where, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            continue  # not one of ours (the directory is shared: anyone may make a name like it)
        shutil.rmtree(path, ignore_errors=True)  # descriptor-based: a link inside is removed, not followed
        removed.append(path)
    return removed


def _boot_tag() -> str:
    return (
        _owner.boot_id().replace("-", "")[:8].ljust(8, "0")
        if re.fullmatch(r"[0-9a-f-]{8,}", _owner.boot_id())
        else "0" * 8
    )


def copy_tree(source: str, dest: str, cap_bytes: int) -> list[str]:
    """Copy the host tree ``source`` into the empty host directory ``dest``; what was left out, and why.

    ``session(copy_of=...)`` fills its workspace copy with this (docs/DOCKER.md, "Warm pool"). What is
    copied is what the mirror's push would send (:func:`scan_host`: files, directories, links; special
    files left out; refused beyond ``cap_bytes`` as :func:`check_fits` says), and ``source`` is only read:

    * Every file and directory is opened by descriptor from its parent's, with ``O_NOFOLLOW``, on both
      sides: no link in ``source`` is followed (one swapped in after the scan fails to open and is left
      out), and no write in ``dest`` goes anywhere else. ``dest`` is this process's own fresh directory and
      links are made only once every file is written, so nothing in it can redirect a write meanwhile.
    * Links are made as pull-back makes them (:class:`_HostTree`): only one that resolves inside ``dest``
      and out of any ``.git`` is kept, checked again once all are made.

    Modes and file mtimes are kept (a directory gets its own mode after its contents are written); as root
    the copy is owned by ``dest``'s owner.
    """
    host = scan_host(source)
    check_fits(source, host, cap_bytes)
    info = os.stat(dest)
    copier = _Copier(host, (info.st_uid, info.st_gid), cap_bytes)
    src = os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        dst = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            copier.directory("", src, dst)
        finally:
            os.close(dst)
    finally:
        os.close(src)
    skipped = copier.skipped
    links = sorted(path for path, entry in host.items() if entry.kind == "l" and path in copier.reached)
    tree_dir = RootDir(dest)
    try:
        tree = _HostTree(tree_dir, (info.st_uid, info.st_gid))
        made = []
        for path in links:
            try:
                tree.make_link(path, host[path].target)
                made.append(path)
            except (_Refused, OSError) as exc:
                skipped.append(f"{path}: {exc}")
        for path in made:  # a link made later can change where an earlier one leads
            if not tree.link_stays_inside(path):
                tree.remove(path)
                skipped.append(f"{path}: a symbolic link that leads outside the workspace (or into .git)")
    finally:
        tree_dir.close()
    for reason in skipped:
        log.warning("copying %s into %s left out %s", source, dest, reason)
    return skipped


@dataclass
class _Copier:
    """The descriptor walk of :func:`copy_tree` over one scan (directories and files; links after)."""

    host: dict[str, Entry]
    owner: tuple[int, int]
    budget: int
    skipped: list[str] = field(default_factory=list)
    reached: set[str] = field(default_factory=set)
    """Paths whose directory was copied (a link is made only there)."""
    _as_root: bool = field(default_factory=lambda: os.geteuid() == 0)
    _children: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for path in sorted(self.host):
            self._children.setdefault(posixpath.dirname(path), []).append(path)

    def directory(self, rel: str, src: int, dst: int) -> None:
        """Copy what the scan found below ``rel`` (open on both sides), then give ``dst`` its mode."""
        for path in self._children.get(rel, []):
            self.reached.add(path)
            entry, name = self.host[path], posixpath.basename(path)
            try:
                if entry.kind == "d":
                    self._subdirectory(path, name, src, dst)
                elif entry.kind == "f":
                    self._file(path, name, entry, src, dst)
            except OSError as exc:
                self.skipped.append(f"{path}: {exc.strerror or exc}")
        if rel:
            os.fchmod(dst, self.host[rel].mode & 0o777)

    def _subdirectory(self, path: str, name: str, src: int, dst: int) -> None:
        sub_src = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=src)
        try:
            os.mkdir(name, 0o700, dir_fd=dst)
            sub_dst = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dst)
            try:
                if self._as_root:
                    os.fchown(sub_dst, *self.owner)
                self.directory(path, sub_src, sub_dst)
            finally:
                os.close(sub_dst)
        finally:
            os.close(sub_src)

    def _file(self, path: str, name: str, entry: Entry, src: int, dst: int) -> None:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd_in = os.open(name, flags, dir_fd=src)  # NONBLOCK: a FIFO swapped in does not hang the copy
        try:
            if not stat.S_ISREG(os.fstat(fd_in).st_mode):
                self.skipped.append(f"{path}: no longer a regular file when it was copied")
                return
            out_flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd_out = os.open(name, out_flags, 0o600, dir_fd=dst)
            try:
                copied = _copy_data(fd_in, fd_out, self.budget + 1)
                if copied > self.budget:  # grew since the scan past what the copy may hold
                    raise PolicyNotEnforceableError(
                        f"the files of the workspace grew past the cap of its copy while it was copied "
                        f"({path}); nothing ran. Create the backend with a larger "
                        "DockerBackend(mirror_size_mb=...)"
                    )
                self.budget -= copied
                if self._as_root:
                    os.fchown(fd_out, *self.owner)
                os.fchmod(fd_out, entry.mode & 0o777)  # after fchown, and never a set-id bit
                os.utime(fd_out, ns=(entry.mtime_ns, entry.mtime_ns))
            finally:
                os.close(fd_out)
        finally:
            os.close(fd_in)


def _copy_data(fd_in: int, fd_out: int, limit: int) -> int:
    """Copy ``fd_in`` to ``fd_out`` (in the kernel when it can) until EOF or ``limit`` bytes; how many."""
    copied = 0
    while copied < limit:
        try:
            n = os.copy_file_range(fd_in, fd_out, min(limit - copied, 1 << 30))
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            break
        if n == 0:
            return copied
        copied += n
    while copied < limit:  # the fallback (another filesystem without support), or to the limit's edge
        chunk = os.read(fd_in, min(limit - copied, 1 << 20))
        if not chunk:
            break
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd_out, view) :]
        copied += len(chunk)
    return copied


def _read_host_file(tree: RootDir, rel: str) -> bytes | None:
    """The content of the host file at ``rel``, reached as written: no link followed on the way or at it.

    Opened by descriptor beneath the root and then checked against its literal path, so a host process
    that swaps a directory for a link between the scan and this read cannot make the push send a file
    from elsewhere (outside, or another name inside) into the sandbox. None: gone, not a regular file, or
    not reachable as written; the next sync sees what it became.
    """
    try:
        fd = tree.open(rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except (OSError, EscapeError):
        return None
    try:
        if tree.real_path(fd) != os.path.join(tree.path, rel) or not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_host_link(tree: RootDir, rel: str) -> str | None:
    """The target of the host link at ``rel``, its directory reached as written (no link followed)."""
    directory = posixpath.dirname(rel)
    try:
        fd = tree.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except (OSError, EscapeError):
        return None
    try:
        if tree.real_path(fd) != os.path.join(tree.path, directory).rstrip("/"):
            return None
        return os.readlink(posixpath.basename(rel), dir_fd=fd)
    except OSError:
        return None
    finally:
        os.close(fd)


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


def mirror_mount_violations(inspect: dict[str, Any] | Any, workspace: str) -> list[str]:
    """What is wrong with the mirror volume of an inspected container (empty when it is as asked)."""
    mounts = [m for m in inspect.get("Mounts") or [] if m.get("Destination") == workspace]
    if len(mounts) != 1:
        return [f"the workspace copy is not mounted at {workspace}"]
    mount = mounts[0]
    problems = []
    if mount.get("Type") != "volume" or mount.get("Driver") != "local":
        problems.append(f"{workspace} is a {mount.get('Type')} mount, not the local tmpfs volume asked for")
    if not mount.get("RW"):
        problems.append(f"{workspace} is mounted read-only")
    return problems
