"""The mirror's sync logic against a tiny in-memory container (pure logic: the real one is in
tests/integration/test_docker_mirror.py).

What a real engine cannot be made to show on demand: a "racy" entry, changed again within the same tick of
a coarse file-system clock (no kernel before 6.13 makes a stat'ed inode's next ctime differ), so that
every field of its stat stays as it was. The container here has such a clock: it only moves when told.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from adk_sandbox.executor.errors import SandboxFailedError
from adk_sandbox.executor.workspace import mirror as mirror_module
from adk_sandbox.executor.workspace import racy, scan
from adk_sandbox.executor.workspace.auto import AutoChoices
from adk_sandbox.executor.workspace.mirror import MirrorWorkspace
from adk_sandbox.executor.workspace.protocol import RunResult
from tests.conftest import require


@dataclass
class FakeContainer:
    """Files by path (content, mtime, ctime, inode) and a clock that moves only when told to."""

    clock: int = 100 * 10**9
    files: dict[str, tuple[bytes, int, int, int]] = field(default_factory=dict)
    fetched: list[str] = field(default_factory=list)
    inodes: int = 1000
    modes: dict[str, int] = field(default_factory=dict)
    """Permission bits a file has in the container (0o644 unless set here)."""

    def write(self, path: str, content: bytes, mtime: int | None = None) -> None:
        """A write in the container: the ctime is the clock's (an old inode stays)."""
        inode = self.files[path][3] if path in self.files else self._inode()
        self.files[path] = (content, self.clock if mtime is None else mtime, self.clock, inode)

    def _inode(self) -> int:
        self.inodes += 1
        return self.inodes

    def run(self, argv: tuple[str, ...], stdin: bytes | None, max_output: int) -> RunResult:
        what = argv[3]
        out = b""
        if what == "adk-sandbox-push":
            with tarfile.open(fileobj=io.BytesIO(stdin or b""), mode="r:") as archive:
                for member in archive:
                    source = archive.extractfile(member) if member.isfile() else None
                    if source is not None:
                        self.write(member.name, source.read(), int(member.mtime) * 10**9)
        elif what == "adk-sandbox-list":
            out = b"\0f 0 0 0.0 %d.%09d 0\0\0" % divmod(self.clock, 10**9)
            for path, (content, mtime, ctime, inode) in sorted(self.files.items()):
                times = b"%d.%09d %d.%09d" % (*divmod(mtime, 10**9), *divmod(ctime, 10**9))
                mode = b"%o" % self.modes.get(path, 0o644)
                out += path.encode() + b"\0f %s %d %s %d\0\0" % (mode, len(content), times, inode)
        elif what == "adk-sandbox-fetch":
            data = io.BytesIO()
            with tarfile.open(fileobj=data, mode="w", format=tarfile.GNU_FORMAT) as archive:
                for name in (stdin or b"").split(b"\0")[:-1]:
                    path = name.decode()
                    self.fetched.append(path)
                    content, mtime, _, _ = self.files[path]
                    info = tarfile.TarInfo(path)
                    info.size, info.mode, info.mtime = (
                        len(content),
                        self.modes.get(path, 0o644),
                        mtime // 10**9,
                    )
                    archive.addfile(info, io.BytesIO(content))
            out = data.getvalue()
        return RunResult(0, out, b"", truncated=False)


@pytest.fixture
def host(tmp_path: Path) -> Path:
    (tmp_path / "f.txt").write_bytes(b"one\n")
    (tmp_path / "f.txt").chmod(0o644)
    return tmp_path


def keys_of(root: Path) -> dict[str, tuple[int, ...]]:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return dict(scan.host_keys(fd))
    finally:
        os.close(fd)


def mirror_of(host: Path) -> MirrorWorkspace:
    return MirrorWorkspace(str(host), 16, (os.getuid(), os.getgid()))


def test_set_id_bits_never_come_back_to_the_host(host: Path) -> None:
    """A task sandbox (root, set-id modes allowed) lists and sends a set-uid root shell: it lands plain."""
    container = FakeContainer()
    mirror = mirror_of(host)
    mirror.started(container.run)
    container.clock += 10**9
    container.write("rootshell", b"#!/bin/sh\n")
    container.modes["rootshell"] = 0o6755
    container.write("sticky", b"x")
    container.modes["sticky"] = 0o1777
    assert mirror.after_command(container.run) == []
    assert (host / "rootshell").stat().st_mode & 0o7777 == 0o755
    assert (host / "sticky").stat().st_mode & 0o7777 == 0o777
    assert os.listxattr(host / "rootshell") == []  # a fresh file: no capability or other attribute


def test_a_container_file_changed_again_in_the_same_tick_is_fetched_again(host: Path) -> None:
    container = FakeContainer()
    mirror = mirror_of(host)
    mirror.started(container.run)
    container.clock += 10**9
    container.write("f.txt", b"two\n")
    assert mirror.after_command(container.run) == []
    assert (host / "f.txt").read_bytes() == b"two\n" and container.fetched == ["f.txt"]
    # The listing saw it in the tick it was written: a rewrite in that tick leaves its stat as it was.
    _, mtime, ctime, inode = container.files["f.txt"]
    container.files["f.txt"] = (b"2wo\n", mtime, ctime, inode)
    assert mirror.after_command(container.run) == []
    assert (host / "f.txt").read_bytes() == b"2wo\n"  # fetched although the record did not move
    container.clock += 10**9  # now the listing is a tick later than the file's ctime: trusted
    mirror.after_command(container.run)
    fetched = len(container.fetched)
    mirror.after_command(container.run)
    assert len(container.fetched) == fetched  # settled: no more fetches of an unchanged file


def test_a_host_file_changed_again_with_the_same_stat_is_pushed_again(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A file system with a coarse (or another machine's) clock: f.txt, written just now, is racy.
    monkeypatch.setattr(mirror_module, "window_ns", lambda root: racy.RACY_NS)
    container = FakeContainer()
    mirror = mirror_of(host)
    mirror.started(container.run)  # f.txt is racy: its pushed content is remembered
    stale = keys_of(host)
    (host / "f.txt").write_bytes(b"ONE\n")  # the same size...
    monkeypatch.setattr(mirror_module, "host_keys", lambda root: dict(stale))  # ...and a coarse clock's stat
    mirror.before_command(container.run)
    assert container.files["f.txt"][0] == b"ONE\n"
    pushed = container.files["f.txt"]
    mirror.before_command(container.run)
    assert container.files["f.txt"] == pushed  # the same content is not pushed again


@pytest.mark.parametrize("link_to", ["outside", "inside"])
def test_a_directory_swapped_for_a_link_after_the_scan_sends_nothing_through_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, link_to: str
) -> None:
    """A host process swaps ``sub`` for a link between the scan and the read: the push reads no file
    through it (outside: a secret; inside: another name's content under this one)."""
    host = tmp_path / "ws"
    (host / "sub").mkdir(parents=True)
    (host / "other").mkdir()
    outside = tmp_path / "secrets"
    outside.mkdir()
    (outside / "f.txt").write_bytes(b"SECRET\n")
    (host / "other" / "f.txt").write_bytes(b"OTHER\n")
    container = FakeContainer()
    mirror = mirror_of(host)
    mirror.started(container.run)
    (host / "sub" / "f.txt").write_bytes(b"new\n")
    real_keys = scan.host_keys

    def scan_then_swap(root: int) -> dict[str, tuple[int, ...]]:
        keys = real_keys(root)  # the scan sees sub/f.txt as a new regular file...
        (host / "sub" / "f.txt").unlink()
        (host / "sub").rmdir()  # ...then sub becomes a link before the push reads it
        (host / "sub").symlink_to(outside if link_to == "outside" else host / "other")
        return keys

    monkeypatch.setattr(mirror_module, "host_keys", scan_then_swap)
    mirror.before_command(container.run)
    sent = [content for content, *_ in container.files.values()]
    assert b"SECRET\n" not in sent
    assert container.files.get("sub/f.txt", (None,))[0] is None
    monkeypatch.setattr(mirror_module, "host_keys", real_keys)
    mirror.before_command(container.run)  # the next sync sees the link for what it is
    assert b"SECRET\n" not in [content for content, *_ in container.files.values()]


def test_the_racy_window_is_a_tick_on_a_local_file_system_and_two_seconds_elsewhere(tmp_path: Path) -> None:
    now = 1_000 * 10**9 + 123_456_789
    files = {
        "10ms": now - 10_000_000,
        "100ms": now - 100_000_000,
        "1s": now - 10**9,
        "whole-second": (now // 10**9 - 1) * 10**9,  # a file system that counts whole seconds
        "future": now + 10**9,  # a clock ahead
        "3s": now - 3 * 10**9,
    }
    assert racy.racy(files.items(), now, racy.LOCAL_RACY_NS) == {"10ms", "whole-second", "future"}
    remote = {"10ms", "100ms", "1s", "whole-second", "future"}
    assert racy.racy(files.items(), now, racy.RACY_NS) == remote
    for path, window in ((tmp_path, racy.LOCAL_RACY_NS), (Path("/dev/shm"), racy.LOCAL_RACY_NS),
                         (Path("/proc"), racy.RACY_NS)):  # fmt: skip
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            assert racy.window_ns(fd) == window, path  # fstatfs of the open directory itself
        finally:
            os.close(fd)


def test_the_scan_clock_is_the_file_systems_own() -> None:
    """A file's ctime comes from the coarse clock: a scan on it never reads later than a later edit."""
    before = racy.scan_clock_ns()
    with tempfile.NamedTemporaryFile() as handle:
        assert os.fstat(handle.fileno()).st_ctime_ns >= before


def test_a_mount_inside_the_workspace_gets_the_wide_window(tmp_path: Path) -> None:
    """Another file system mounted inside the tree (NFS, FUSE...) may stamp with another clock."""
    require(os.geteuid() == 0, "mounting a tmpfs inside the workspace needs root")
    (tmp_path / "mnt").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(tmp_path / "mnt")], check=True)
    try:
        (tmp_path / "top.txt").write_bytes(b"a")
        (tmp_path / "mnt" / "in.txt").write_bytes(b"b")
        mirror = mirror_of(tmp_path)
        scanned, keys = mirror._scan()
        host = {p: e for p, k in keys.items() if (e := scan._host_entry(mirror._tree, p, k))}
        assert mirror._racy_ns == racy.LOCAL_RACY_NS  # the root's own file system is local...
        time.sleep(0.2)
        scanned, keys = mirror._scan()
        assert mirror._racy(host, keys, scanned) == {"top.txt", "mnt/in.txt"}  # ...but not all the tree is
        mirror.close()
    finally:
        subprocess.run(["umount", str(tmp_path / "mnt")], check=True)


def test_a_fresh_local_tree_is_not_read_again_once_a_tick_has_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy just made (the warm pool's copy_of) used to be re-read in full by every command for 2 s."""
    for index in range(50):
        (tmp_path / f"f{index}.txt").write_bytes(b"x" * index)
    container = FakeContainer()
    mirror = mirror_of(tmp_path)
    mirror.started(container.run)
    time.sleep(0.2)  # four times LOCAL_RACY_NS, a tenth of the old 2 s window
    reads: list[str] = []
    real_read = mirror_module._read_host_file

    def counted(tree: object, rel: str) -> bytes | None:
        reads.append(rel)
        return real_read(tree, rel)  # type: ignore[arg-type]

    monkeypatch.setattr(mirror_module, "_read_host_file", counted)
    mirror.before_command(container.run)  # settles what was racy at the start
    mirror.before_command(container.run)
    assert len(reads) <= 50  # at most the one check of what the start's scan found racy
    reads.clear()
    mirror.before_command(container.run)
    assert reads == []


def test_a_file_the_push_could_not_read_is_pushed_once_it_can_be(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Swapped for a link during the push, then swapped back: not recorded as in sync, pushed next time."""
    host = tmp_path / "ws"
    (host / "sub").mkdir(parents=True)
    container = FakeContainer()
    mirror = mirror_of(host)
    mirror.started(container.run)
    (host / "sub" / "f.txt").write_bytes(b"new\n")
    time.sleep(0.2)  # past the racy window: only the scan's record says whether it is in sync
    real_read = mirror_module._read_host_file

    def read_while_swapped(tree: object, rel: str) -> bytes | None:
        (host / "sub").rename(host / "kept")  # a rename keeps every stat of what is inside
        (host / "sub").symlink_to(host / "kept")
        try:
            return real_read(tree, rel)  # type: ignore[arg-type]
        finally:
            (host / "sub").unlink()
            (host / "kept").rename(host / "sub")

    monkeypatch.setattr(mirror_module, "_read_host_file", read_while_swapped)
    mirror.before_command(container.run)
    assert "sub/f.txt" not in container.files  # not reachable as written: not sent
    monkeypatch.setattr(mirror_module, "_read_host_file", real_read)
    mirror.before_command(container.run)
    assert container.files["sub/f.txt"][0] == b"new\n"


def test_a_directory_swapped_for_a_link_during_the_scan_lists_nothing_through_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the walk's lstat of ``sub`` and its open, ``sub`` becomes a link out: no name from there."""
    host = tmp_path / "ws"
    (host / "sub").mkdir(parents=True)
    outside = tmp_path / "private"
    outside.mkdir()
    (outside / "private-project-name").mkdir()
    (outside / "token-link").symlink_to("/root/.ssh/id_ed25519")
    real_open = os.open

    def open_after_a_swap(path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if (
            path == "sub"
            and dir_fd is not None
            and (host / "sub").is_dir()
            and not (host / "sub").is_symlink()
        ):
            (host / "sub").rmdir()
            (host / "sub").symlink_to(outside)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    fd = real_open(host, os.O_RDONLY | os.O_DIRECTORY)
    try:
        monkeypatch.setattr(scan.os, "open", open_after_a_swap)
        keys = scan.host_keys(fd)
    finally:
        monkeypatch.undo()
        os.close(fd)
    assert (host / "sub").is_symlink()  # the swap happened, between the lstat and the open
    assert not [path for path in keys if path.startswith("sub/")]


def test_a_replaced_workspace_directory_fails_the_sync_clearly(tmp_path: Path) -> None:
    host = tmp_path / "ws"
    host.mkdir()
    (host / "f.txt").write_bytes(b"one\n")
    container = FakeContainer()
    mirror = mirror_of(host)
    mirror.started(container.run)
    shutil.rmtree(host)
    host.mkdir()
    (host / "f.txt").write_bytes(b"two\n")
    with pytest.raises(SandboxFailedError, match="removed or replaced on the host"):
        mirror.before_command(container.run)
    assert container.files["f.txt"][0] == b"one\n"


def test_auto_choices_remember_a_failed_check_and_key_by_engine_and_directory(tmp_path: Path) -> None:
    choices = AutoChoices()
    socket, workspace = tmp_path / "engine.sock", tmp_path / "ws"
    socket.touch()
    workspace.mkdir()
    key = choices.key(str(socket), str(workspace))
    assert key is not None and choices.get(key) is None
    assert choices.key(None, str(workspace)) is None  # not a local engine: nothing is checked
    choices.put(key, "mirror")
    choices.put(key, "bind")  # a failed check is not undone by a later claim
    assert choices.get(key) == "mirror"
    assert choices.get(choices.key(str(socket), str(tmp_path / "ws" / "."))) == "mirror"  # same directory
    socket.unlink()
    socket.touch()  # a new daemon makes a new socket: asked again
    assert choices.get(choices.key(str(socket), str(workspace))) is None
    choices.clear()
    assert choices.get(key) is None


def test_a_copy_filled_on_the_host_is_in_sync_only_where_both_sides_agree(
    host: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """``adopt`` (a forkable member's copy filled on the host, docs/snapshots.md): what the copy holds as
    the host does is not pushed again, even though every host file is racy (just written: its digest is
    taken); a host file the copy holds otherwise is pushed by the next sync. Catches an adopt that marks the
    whole host tree as in sync (the differing file would never reach the sandbox) or none of it (the whole
    tree would travel through the channel after all)."""
    (host / "d").mkdir()
    (host / "d" / "same.txt").write_bytes(b"same\n")
    volume = tmp_path_factory.mktemp("volume") / "copy"
    shutil.copytree(host, volume, copy_function=shutil.copy2)
    (volume / "f.txt").write_bytes(b"other, longer\n")  # the copy does not hold what the host does
    (volume / "extra").write_bytes(b"only in the copy\n")
    mirror = mirror_of(host)
    assert mirror.adopt(str(volume)) == ["f.txt"]
    container = FakeContainer()
    mirror.before_command(container.run)
    assert set(container.files) == {"f.txt"} and container.files["f.txt"][0] == b"one\n"
