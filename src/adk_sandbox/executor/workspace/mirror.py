"""The mirror: the workspace as a size-capped copy in the sandbox at the same path, synced both ways.

:class:`MirrorWorkspace` (``"mirror"``) pushes the host tree in at start, lists the sandbox's tree after
each command and pulls back only the changed files (:mod:`.scan`, :mod:`.pullback`, :mod:`.racy`), over
the session's own command channel, as the command user. See docs/docker/workspace-transport.md,
section "Workspace transport", and docs/KUBERNETES.md, "Host workspace".
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import stat
import tarfile
from collections.abc import Iterator
from typing import Literal

from adk_sandbox.executor.errors import PolicyNotEnforceableError, SandboxFailedError
from adk_sandbox.executor.workspace.beneath import EscapeError, RootDir
from adk_sandbox.executor.workspace.protocol import Run, RunResult
from adk_sandbox.executor.workspace.pullback import Content, _HostTree, _Refused, read_content, safe_name
from adk_sandbox.executor.workspace.racy import RACY_NS, racy, scan_clock_ns, window_ns
from adk_sandbox.executor.workspace.scan import Entry, Kind, _host_entry, _Key, check_fits, host_keys
from adk_sandbox.executor.workspace.tarstream import (
    MAX_FILE_DATA,
    archives,
    member_content,
    read_gnu_archive,
    tar_file_member,
    tar_header,
)

__all__ = ["DEFAULT_MIRROR_MB", "ENTRY_BYTES", "MirrorWorkspace"]

log = logging.getLogger(__name__)


#: The default size cap of a mirror volume, in MiB.
DEFAULT_MIRROR_MB = 1024
#: What each entry one pull-back brings counts against the copy's cap at least: one 4 KiB block, what a
#: directory, a link or a file takes on a host file system with its inode and its name (at most 255 bytes
#: there, in its directory's blocks). The sandbox's tmpfs counts no page for a directory, an empty file or a
#: short link, so millions of them fit any cap there; here a pull-back brings at most the cap's worth of
#: blocks of entries (docs/docker/workspace-transport.md, "The cap").
ENTRY_BYTES = 4096

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
# hard links as full files, names taken verbatim (one starting with '-' is not an option), a sparse file as
# its data and its map (--sparse: its holes never travel).
_FETCH_SCRIPT = (
    'cd -- "$1" || exit 97\n'
    "exec tar -c -f - --format=gnu --sparse --no-recursion --hard-dereference --verbatim-files-from --null "
    "-T -"
)
# Unpacks the tar on stdin into $1 with its modes and mtimes, as the command user.
_PUSH_SCRIPT = 'cd -- "$1" || exit 97\nexec tar -x -p -f - --no-same-owner --delay-directory-restore'
# Removes the NUL-separated names on stdin (relative to $1).
_REMOVE_SCRIPT = 'cd -- "$1" || exit 97\nexec xargs -0 -r rm -rf --'
_TOOLS_MISSING = 127


class MirrorWorkspace:
    """The workspace as a copy in a tmpfs volume at the same path (docs/docker/workspace-transport.md).

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
        inside: str | None = None,
    ) -> None:
        self.root = root
        self.inside = inside or root
        """The copy's path in the sandbox: ``root`` unless given (a session from a snapshot mirrors a
        directory of its own at the snapshot's workspace path)."""
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
        """How recent a host file's ctime makes it racy (see :mod:`.racy`): the root's file system's."""
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

    def adopt(self, volume: str) -> list[str]:
        """Take the sandbox's copy, just filled on the host, as in sync: what a push of the whole tree leaves.

        ``volume`` is the host side of the sandbox's copy, filled by the same safe host copy as the host tree.
        Both sides are scanned on the host; an entry is known as in sync only where they agree (kind, mode,
        size, mtime), so the next sync pushes or pulls back the rest, and racy files are handled as a push
        does. Returns the paths left for the next sync. Depth: docs/snapshots.md, "The workspace of a fork, on
        the host side too" (step 2).
        """
        scanned, keys = self._scan()
        host = {path: entry for path, key in keys.items() if (entry := _host_entry(self._tree, path, key))}
        check_fits(self.root, host, self.cap_bytes, self.cap_setting)
        copy = RootDir(volume)
        try:
            now = _now_on(copy.fd)  # the copy's file system's clock, stamped after every write of the copy
            copy_keys = host_keys(copy.fd)
            inside = {
                path: entry
                for path, key in copy_keys.items()
                if (entry := _host_entry(copy, path, key)) is not None
            }
        finally:
            copy.close()
        self._host, self._host_keys, self._inside, self._records, self._digests = {}, {}, {}, {}, {}
        left: list[str] = []
        for path, entry in host.items():
            held = inside.get(path)  # compared without inode and ctime: another file system's
            bare = held and Entry(held.kind, held.mode, held.size, held.mtime_ns, held.target)
            if not entry.same(bare):
                left.append(path)
        _forget(left, host, keys)
        racy = self._racy(host, keys, scanned)
        for path in sorted(racy):
            content = _read_host_file(self._tree, path)
            if content is None:
                _forget([path], host, keys)
                left.append(path)
                continue
            self._digests[path] = content.digest()
        self._inside = {path: entry for path, entry in inside.items() if path in host and safe_name(path)}
        self._inside_racy = {p for p, e in self._inside.items() if e.kind == "f" and e.ctime_ns >= now}
        self._records = _predicted_records(copy_keys, self._inside, self._inside_racy)
        self._host, self._host_keys, self._host_racy = host, keys, racy & set(host)
        self._pulled_links, self.refused = set(), []
        return sorted(left)

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
        return content is not None and digest is not None and content.digest() == digest

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
        argv = ("/bin/sh", "-c", _LIST_SCRIPT, "adk-sandbox-list", self.inside, now_file)
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
                ("/bin/sh", "-c", _REMOVE_SCRIPT, "adk-sandbox-remove", self.inside),
                b"\0".join(p.encode("utf-8", "surrogateescape") for p in removed) + b"\0",
                64 * 1024,
            )
            _check_tools(result, "xargs and rm")
            for path in removed:
                for known in [p for p in self._inside if p == path or p.startswith(path + "/")]:
                    del self._inside[known]
        if not paths:
            return skipped

        def members() -> Iterator[list[bytes | memoryview]]:
            for path in paths:
                member = self._member(path, host[path], racy, skipped)
                if member is None:
                    continue
                parts, entry = member
                if safe_name(path):  # a .git is never listed, so never compared
                    # What the container will list for it (tar restores the mode and the whole-second mtime).
                    self._inside[path] = Entry(
                        entry.kind, entry.mode, entry.size, entry.mtime_ns, entry.target
                    )
                yield parts

        for archive in archives(members()):  # cut between files: what a push holds at once stays bounded
            self._send(run, archive)
        return skipped

    def _member(
        self, path: str, entry: Entry, racy: set[str], skipped: list[str]
    ) -> tuple[list[bytes | memoryview], Entry] | None:
        """The tar member of the host entry ``path`` and the entry it makes inside (None: skipped).

        A file's holes never travel (:func:`tar_file_member`); one whose data alone passes what a push
        can carry is refused with its name, before anything of it is sent.
        """
        uid, gid = self.owner
        info = tarfile.TarInfo(path)
        info.uid, info.gid, info.mode = uid, gid, entry.mode
        info.mtime = entry.mtime_ns // 1_000_000_000
        if entry.kind == "d":
            info.type = tarfile.DIRTYPE
            return [tar_header(info)], entry
        if entry.kind == "l":
            info.type, info.linkname = tarfile.SYMTYPE, entry.target
            return [tar_header(info)], entry
        content = _read_host_file(self._tree, path)
        if content is None:
            skipped.append(path)  # gone or no longer reachable as scanned: the next sync sees it
            return None
        if content.data_bytes > MAX_FILE_DATA:
            self._inside, self._records = {}, {}  # what was pushed before is unknown: compared next time
            raise SandboxFailedError(
                f"the workspace file {path} holds {content.data_bytes // (1024 * 1024)} MiB of data, more "
                f"than one copy into the sandbox carries ({MAX_FILE_DATA // (1024 * 1024)} MiB); nothing "
                "ran. Keep files that large out of a mirrored workspace (or snapshot), or use "
                "workspace_transport='bind' on a local engine"
            )
        parts = tar_file_member(path, content, mode=entry.mode, owner=(uid, gid), mtime=info.mtime)
        if path in racy:
            self._digests[path] = content.digest()
        return parts, Entry("f", entry.mode, content.size, info.mtime * 1_000_000_000)

    def _send(self, run: Run, archive: bytes) -> None:
        """Unpack ``archive`` in the sandbox's copy, as the user."""
        result = run(("/bin/sh", "-c", _PUSH_SCRIPT, "adk-sandbox-push", self.inside), archive, 64 * 1024)
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

    # -- host side -----------------------------------------------------------------------------------
    def _apply(  # noqa: PLR0912 - one pass over the kinds of change, in the order they must land
        self, run: Run, wanted: dict[str, Entry], gone: list[str], refused: list[str]
    ) -> None:
        """Write the container's changes to the host copy, every write contained (hostile input).

        Bounded by the copy's cap before anything lands: more changed entries than the cap holds blocks
        (:data:`ENTRY_BYTES`) and nothing of this pull-back is applied (:meth:`_over_the_cap`); else each
        new directory or link takes its block from what the files may bring, and a file whose apparent
        size passes what is left is refused, file by file.
        """
        if self._over_the_cap(wanted, refused):
            return
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
        # One budget: a directory or link the host does not hold as listed takes a block of it.
        budget = self.cap_bytes - ENTRY_BYTES * sum(
            1 for path, entry in wanted.items() if entry.kind != "f" and not entry.same(self._host.get(path))
        )
        for path in sorted(wanted, key=lambda p: (p.count("/"), p)):
            entry = wanted[path]
            if host_moved(path):
                self._inside[path] = entry  # the push before the next command replaces it
                continue
            if entry.kind == "f":
                # The listing gives no allocation: the apparent size is what is known here, so a file
                # whose apparent size passes the cap is refused as before (docs/sparse.md); what comes
                # is then counted by its data (_fetch).
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

    def _over_the_cap(self, wanted: dict[str, Entry], refused: list[str]) -> bool:
        """Whether the changed entries pass the cap by their number alone: then refused as a whole.

        Each counts one block (:data:`ENTRY_BYTES`), whatever its kind (a directory or link the host holds
        as listed: none, it makes nothing). The listing is the sandbox's output: a forged one, or millions of
        real empty directories (free on its tmpfs), would make as many entries on the host. Refused as a
        whole, before anything lands: nothing made, replaced or removed, and nothing of it taken as in sync,
        so the next pull-back asks again (and lands once the sandbox holds few enough).
        """
        limit = self.cap_bytes // ENTRY_BYTES
        count = sum(
            1 for path, entry in wanted.items() if entry.kind == "f" or not entry.same(self._host.get(path))
        )
        if count <= limit:
            return False
        cap = self.cap_bytes // (1024 * 1024)
        refused.append(
            f"{count} changed entries (files, directories, links) in one pull-back, more than the copy's cap "
            f"lets come back ({limit}: each counts at least {ENTRY_BYTES // 1024} KiB of its {cap} MiB, "
            f"{self.cap_setting}); nothing of this pull-back came back and nothing was removed"
        )
        return True

    def _record(self, tree: _HostTree, path: str) -> None:
        """Note the host entry at ``path`` as synced (absent: forgotten), so the next push leaves it."""
        now = tree.entry(path)
        if now is None:
            self._host.pop(path, None)
        else:
            self._host[path] = now

    def _fetch(self, run: Run, files: dict[str, Entry], tree: _HostTree, refused: list[str]) -> None:
        """Bring ``files`` back from the sandbox (one ``tar -c --sparse``) and write them on the host.

        At most the copy's cap of data comes: the archive is cut there (plus its headers and sparse maps),
        and a file whose data passes what is left of the cap is refused. A sparse file's holes neither
        travel nor are written: only its extents land, at their offsets, and its size is set. That size must
        be the listed one, which :meth:`_apply` counted against the cap: a file that changed between the
        listing and the fetch (``truncate -s 10T``), or a forged archive, is refused and nothing of it is
        written (asked again once its listing changes).
        """
        names = b"".join(path.encode("utf-8") + b"\0" for path in files)
        # The files asked for hold at most the cap; tar adds a header (long names: three) per file and an
        # end, and a sparse file's map (extension headers, 21 extents each).
        room = self.cap_bytes + 2048 * (len(files) + 1) + 20 * 512 + self.cap_bytes // 64
        result = run(("/bin/sh", "-c", _FETCH_SCRIPT, "adk-sandbox-fetch", self.inside), names, room)
        _check_tools(result, "tar")
        budget = self.cap_bytes
        try:
            archive = read_gnu_archive(io.BytesIO(result.stdout))
        except tarfile.TarError:
            refused.append("the changed files could not be read back from the sandbox (no GNU tar archive)")
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
                    if member.size != entry.size:
                        why = f"{member.size} bytes when copied, not the {entry.size} bytes listed"
                        refused.append(
                            f"{path}: {why} and counted against the copy's cap (changed meanwhile)"
                        )
                        self._inside[path] = entry
                        continue
                    content = member_content(result.stdout, member)
                    if content.data_bytes > budget:
                        why = f"{content.data_bytes} bytes of data, more than the copy's cap lets come back"
                        refused.append(f"{path}: {why}")
                        self._inside[path] = entry
                        continue
                    budget -= content.data_bytes
                    try:
                        # A racy file is fetched again: often what the host holds already.
                        if not tree.holds(path, content, entry.mode, member.mtime):
                            tree.write_file(path, content, entry.mode, member.mtime)
                        self._digests[path] = content.digest()
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


def _find_time(ns: int) -> str:
    """A time as GNU ``find -printf %T@`` prints it: seconds, a dot, nine digits of nanoseconds and a 0."""
    return f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}0"


def _predicted_records(keys: dict[str, _Key], inside: dict[str, Entry], racy: set[str]) -> dict[bytes, bytes]:
    """The listing records the container will print for the entries of ``inside`` (in sync, not ``racy``).

    Made from the host's ``lstat`` of the sandbox's copy (``keys``: a volume this process reads, the same
    inodes the container lists), byte for byte as :data:`_LIST_SCRIPT`'s ``find`` prints them, so the first
    pull-back after :meth:`MirrorWorkspace.adopt` parses nothing that did not change. Only what a pull-back
    would keep itself is predicted (an entry in sync, a file whose ctime is below the copy's "now"); a
    prediction only ever skips the parse of a record equal to it byte for byte: every stat field the same,
    ctime and inode included, so the entry has not changed since it was read here. A runtime that shows
    other inodes or times matches none of them, and the records are parsed as before.
    """
    records: dict[bytes, bytes] = {}
    for path, entry in inside.items():
        key = keys.get(path)
        if key is None or path in racy:
            continue
        mode, size, mtime_ns, ctime_ns, inode, _, _ = key
        kind = "f" if stat.S_ISREG(mode) else "d" if stat.S_ISDIR(mode) else "l" if stat.S_ISLNK(mode) else ""
        if not kind or kind != entry.kind or mtime_ns < 0 or ctime_ns < 0:
            continue
        times = f"{_find_time(mtime_ns)} {_find_time(ctime_ns)}"
        record = f"{kind} {stat.S_IMODE(mode):o} {size} {times} {inode}".encode()
        if kind == "l" and entry.target:
            record += b"\0" + entry.target.encode("utf-8", "surrogateescape")
        records[path.encode("utf-8", "surrogateescape")] = record
    return records


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


def _now_on(directory: int) -> int:
    """Now, as the file system of the open ``directory`` stamps a ctime (ns): a file made and removed there.

    What the container's listing does with its "now" file, on the host: a file whose ctime is below this
    was last changed before it, so any later change gives it another ctime. The scan's clock when no file
    can be made (a later ctime can then only be larger still).
    """
    name = f".adk-sandbox-now-{os.urandom(8).hex()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, 0o600, dir_fd=directory)
    except OSError:
        return scan_clock_ns()
    try:
        return os.fstat(fd).st_ctime_ns
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=directory)


def _forget(skipped: list[str], host: dict[str, Entry], keys: dict[str, _Key]) -> None:
    """Drop files a push skipped from a scan, so the next sync sees them as new rather than in sync."""
    for path in skipped:
        host.pop(path, None)
        keys.pop(path, None)


def _read_host_file(tree: RootDir, rel: str) -> Content | None:
    """The content of the host file at ``rel``, reached as written: no link followed on the way or at it.

    Opened by descriptor beneath the root and then checked against its literal path, so a host process
    that swaps a directory for a link between the scan and this read cannot make the push send a file
    from elsewhere (outside, or another name inside) into the sandbox. Its data extents only: a hole is
    never read (:func:`read_content`). None: gone, not a regular file, or not reachable as written; the
    next sync sees what it became.
    """
    try:
        fd = tree.open(rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except (OSError, EscapeError):
        return None
    try:
        if tree.real_path(fd) != os.path.join(tree.path, rel) or not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return read_content(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
