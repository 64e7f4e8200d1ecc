"""The snapshot's workspace copy (``copy_workspace``) against a hostile tree, host-only.

A snapshot copies a tree a sandbox wrote into, then copies that copy again into every session made from it:
each attack below is what a sandbox could leave in its workspace, and each test says which naive copy it
would defeat (docs/snapshots.md, "What a snapshot restores").
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path

import pytest

from adk_sandbox.executor import PolicyNotEnforceableError
from adk_sandbox.executor.snapshots import copy as snapshot_copy
from adk_sandbox.executor.snapshots.copy import copy_workspace

MIB = 1024 * 1024


@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("host secret\n")
    root = tmp_path / "ws"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("VALUE = 1\n")
    (root / "inside-link").symlink_to("pkg/mod.py")
    (root / "abs-link").symlink_to(outside / "secret")
    (root / "climb").symlink_to("../outside/secret")
    (root / "dir-link").symlink_to(outside)
    os.mkfifo(root / "fifo")
    setuid = root / "setuid"
    setuid.write_text("#!/bin/sh\nid\n")
    os.chmod(setuid, 0o6755)  # noqa: S103 - the attack: a set-id file
    return root


def test_links_are_copied_as_links_and_only_when_they_stay_inside(hostile: Path, tmp_path: Path) -> None:
    """Fails ``shutil.copytree(symlinks=False)``: it follows ``abs-link``/``climb``/``dir-link`` and copies
    the host's secret (and a whole outside directory) into the snapshot, where the next fork serves it."""
    dest = tmp_path / "dest"
    dest.mkdir()
    report = copy_workspace(str(hostile), str(dest), 64 * MIB, "max_mb")
    assert os.readlink(dest / "inside-link") == "pkg/mod.py"
    for name in ("abs-link", "climb", "dir-link"):
        assert not os.path.lexists(dest / name)
        assert any(line.startswith(name) for line in report.skipped)
    assert "host secret" not in "".join(
        p.read_text() for p in dest.rglob("*") if p.is_file() and not p.is_symlink()
    )


def test_special_files_are_skipped_and_nothing_hangs(hostile: Path, tmp_path: Path) -> None:
    """Fails a copy that opens every name it lists (``open(fifo)`` blocks forever; ``shutil.copytree``
    refuses a FIFO only after stat, and a device node would be recreated by ``cp -a`` as root)."""
    dest = tmp_path / "dest"
    dest.mkdir()
    copy_workspace(str(hostile), str(dest), 64 * MIB, "max_mb")
    assert not os.path.lexists(dest / "fifo")


def test_no_set_id_bit_reaches_the_host(hostile: Path, tmp_path: Path) -> None:
    """Fails ``shutil.copytree`` (``copy2`` keeps the mode: a set-uid root file made by the sandbox would be
    set-uid on the host, run by anyone)."""
    dest = tmp_path / "dest"
    dest.mkdir()
    copy_workspace(str(hostile), str(dest), 64 * MIB, "max_mb")
    mode = os.stat(dest / "setuid").st_mode
    assert not mode & (stat.S_ISUID | stat.S_ISGID) and mode & 0o777 == 0o755


def test_a_tree_over_the_cap_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """Fails a copy that checks as it goes: a tree with more data than the cap would fill the host's disk
    (or leave half a snapshot) before a running count stops. A sparse file counts its allocated blocks
    (docs/sparse.md): its 1 TiB of holes cost nothing, its data does."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "small").write_text("x")
    with open(root / "sparse", "wb") as handle:
        handle.truncate(1 << 40)
        handle.seek(1 << 30)
        handle.write(os.urandom(8 * MIB))  # 8 MiB of data in the holes: over the 7 MiB cap
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(PolicyNotEnforceableError, match="max_mb=7"):
        copy_workspace(str(root), str(dest), 7 * MIB, "max_mb=7")
    assert os.listdir(dest) == []


def test_the_method_says_copy_when_the_filesystem_cannot_clone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    for i in range(5):
        (root / f"f{i}").write_bytes(os.urandom(1000))
    calls: list[int] = []

    def refuse(fd: int, request: int, arg: int) -> int:
        calls.append(request)
        raise OSError(errno.EOPNOTSUPP, "no reflinks here")

    monkeypatch.setattr(fcntl, "ioctl", refuse)
    dest = tmp_path / "dest"
    dest.mkdir()
    report = copy_workspace(str(root), str(dest), MIB, "max_mb")
    assert report.method == "copy" and report.size_bytes == 5000
    assert calls == [snapshot_copy.FICLONE]  # asked once: one refusal says it for the whole tree
    assert all((dest / f"f{i}").read_bytes() == (root / f"f{i}").read_bytes() for i in range(5))


def test_the_method_says_reflink_when_every_file_was_cloned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a").write_bytes(b"a" * 100)

    def clone(fd_out: int, request: int, fd_in: int) -> int:  # what FICLONE does, for a filesystem here
        os.sendfile(fd_out, fd_in, 0, os.fstat(fd_in).st_size)
        return 0

    monkeypatch.setattr(fcntl, "ioctl", clone)
    dest = tmp_path / "dest"
    dest.mkdir()
    report = copy_workspace(str(root), str(dest), MIB, "max_mb")
    assert report.method == "reflink" and (dest / "a").read_bytes() == b"a" * 100


def test_the_source_is_only_read(hostile: Path, tmp_path: Path) -> None:
    before = sorted((str(p), os.lstat(p).st_mtime_ns) for p in hostile.rglob("*"))
    dest = tmp_path / "dest"
    dest.mkdir()
    copy_workspace(str(hostile), str(dest), 64 * MIB, "max_mb")
    assert sorted((str(p), os.lstat(p).st_mtime_ns) for p in hostile.rglob("*")) == before


def _entries(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every entry below ``root``: its mode, a file's mtime and content, a link's target (not followed)."""
    found: dict[str, tuple[int, int, bytes]] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        if path.is_symlink():  # made when the copy ends: its own time, not the source's
            found[str(path.relative_to(root))] = (info.st_mode, 0, os.readlink(path).encode())
            continue
        if path.is_dir():  # changed by the copy's own writes into it: not kept
            found[str(path.relative_to(root))] = (info.st_mode, 0, b"")
            continue
        found[str(path.relative_to(root))] = (info.st_mode, info.st_mtime_ns, path.read_bytes())
    return found


def test_a_twin_copy_gets_the_same_safe_tree_owned_by_its_own_root(hostile: Path, tmp_path: Path) -> None:
    """The one walk that fills a fork's host copy and its mirror volume (``twin``): fails a twin that
    skips the first copy's checks (the links out, the FIFO, the set-id bit would reach the volume), one
    that misses files, modes, mtimes or links, and one owned like the first copy instead of its own root
    (the volume's files must be the command user's)."""
    (hostile / "pkg" / "big").write_bytes(os.urandom(3 * MIB + 5))  # more than one copy_file_range call
    (hostile / "pkg" / "empty").write_bytes(b"")
    os.chmod(hostile / "pkg", 0o700)
    dest, twin = tmp_path / "dest", tmp_path / "twin"
    dest.mkdir()
    twin.mkdir()
    if os.geteuid() == 0:
        os.chown(twin, 1234, 4321)
    report = copy_workspace(str(hostile), str(dest), 64 * MIB, "max_mb", twin=str(twin))
    assert _entries(dest) == _entries(twin)
    assert report.size_bytes == 3 * MIB + 5 + len("VALUE = 1\n") + len("#!/bin/sh\nid\n")  # counted once
    for name in ("abs-link", "climb", "dir-link", "fifo"):
        assert not os.path.lexists(twin / name)
    assert os.readlink(twin / "inside-link") == "pkg/mod.py"
    assert not os.stat(twin / "setuid").st_mode & (stat.S_ISUID | stat.S_ISGID)
    assert os.stat(twin / "pkg").st_mode & 0o777 == 0o700
    if os.geteuid() == 0:
        owners = {(p.lstat().st_uid, p.lstat().st_gid) for p in twin.rglob("*")}
        assert owners == {(1234, 4321)}
        assert {(p.lstat().st_uid, p.lstat().st_gid) for p in dest.rglob("*")} == {(0, 0)}
