"""Sparse files through the host's copies and archives (docs/sparse.md): holes stay holes, data is kept.

Each naive version writes the holes out: ``copy_file_range`` or read/write over a whole file materialises
them on a tmpfs, Python's ``tarfile`` writes a sparse file at its apparent size, a cap counted by apparent
size refuses a file that costs nothing. Run on ``/dev/shm`` when it is a tmpfs (where a hole shows most),
else in the test's temporary directory.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from adk_sandbox.executor.backends.docker._snapshot import _archive_pieces, _tree_archives
from adk_sandbox.executor.errors import PolicyNotEnforceableError
from adk_sandbox.executor.snapshots.copy import copy_workspace
from adk_sandbox.executor.workspace import copies
from adk_sandbox.executor.workspace.beneath import RootDir
from adk_sandbox.executor.workspace.copies import _Copier, copy_tree, walk_copy
from adk_sandbox.executor.workspace.pullback import Content, _HostTree, read_content
from adk_sandbox.executor.workspace.scan import data_extents, scan_host
from adk_sandbox.executor.workspace.tarstream import member_content, tar_end, tar_file_member

MIB = 1024 * 1024
#: Data at the start, the middle and the end of a 64 MiB file, then a trailing hole of 8 MiB.
PIECES = ((0, b"head" * 1024), (30 * MIB + 5, b"middle" * 5000), (56 * MIB - 3, b"tail" * 4096))
SIZE = 64 * MIB


@pytest.fixture
def room(tmp_path: Path) -> Iterator[Path]:
    """A fresh directory on /dev/shm when it is a tmpfs (holes are pages there), else in tmp_path."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        made = Path(tempfile.mkdtemp(prefix="sparse-test-", dir="/dev/shm"))
        yield made
        shutil.rmtree(made, ignore_errors=True)
    else:
        yield tmp_path


def allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def make_sparse(path: Path) -> None:
    with open(path, "wb") as handle:
        for offset, data in PIECES:
            handle.seek(offset)
            handle.write(data)
        handle.truncate(SIZE)


def expected_bytes() -> bytearray:
    whole = bytearray(SIZE)
    for offset, data in PIECES:
        whole[offset : offset + len(data)] = data
    return whole


def assert_same_sparse(copy: Path) -> None:
    assert copy.stat().st_size == SIZE
    assert allocated(copy) < 2 * MIB, allocated(copy)  # the data, a few pages of it, no holes
    assert copy.read_bytes() == expected_bytes()


@pytest.fixture
def tree(room: Path) -> Path:
    root = room / "src"
    root.mkdir()
    make_sparse(root / "sparse")
    with open(root / "empty-sparse", "wb") as handle:
        handle.truncate(SIZE)
    (root / "dense").write_bytes(os.urandom(100_000))
    (root / "sub").mkdir()
    (root / "sub" / "link").symlink_to("../dense")
    return root


def test_data_extents_list_only_where_data_is(room: Path) -> None:
    make_sparse(room / "f")
    fd = os.open(room / "f", os.O_RDONLY)
    try:
        extents = data_extents(fd)
    finally:
        os.close(fd)
    assert sum(length for _, length in extents) < 2 * MIB
    for offset, data in PIECES:  # every byte of data lies in an extent
        assert any(start <= offset and offset + len(data) <= start + length for start, length in extents)
    assert extents[-1][0] + extents[-1][1] <= 56 * MIB + 16384 + 4096  # the trailing hole is not data


def test_copy_tree_keeps_holes_and_data(tree: Path, room: Path) -> None:
    """The naive copy_file_range over the whole file allocates all 64 MiB of the copy on a tmpfs."""
    dest = room / "dest"
    dest.mkdir()
    assert copy_tree(str(tree), str(dest), 4 * MIB) == []
    assert_same_sparse(dest / "sparse")
    assert (dest / "empty-sparse").stat().st_size == SIZE and allocated(dest / "empty-sparse") == 0
    assert (dest / "dense").read_bytes() == (tree / "dense").read_bytes()
    assert os.readlink(dest / "sub" / "link") == "../dense"


def test_the_snapshot_copy_and_its_twin_keep_holes(tree: Path, room: Path) -> None:
    """The snapshot's copy (FICLONE, else a copy) and the twin a forkable member's volume gets."""
    dest, twin = room / "dest", room / "twin"
    dest.mkdir()
    twin.mkdir()
    report = copy_workspace(str(tree), str(dest), 4 * MIB, "max_mb=4", twin=str(twin))
    assert report.size_bytes < 2 * MIB  # data, not apparent sizes (128 MiB of them)
    for copy in (dest, twin):
        assert_same_sparse(copy / "sparse")
        assert allocated(copy / "empty-sparse") == 0 and (copy / "empty-sparse").stat().st_size == SIZE


def test_caps_count_allocated_blocks_and_say_so(tree: Path, room: Path) -> None:
    """Over the cap by data, refused before anything is written; 128 MiB of holes fit a 4 MiB cap above."""
    (tree / "real").write_bytes(os.urandom(3 * MIB))
    scanned = scan_host(str(tree))
    assert scanned["sparse"].cost < 2 * MIB and scanned["sparse"].size == SIZE
    assert scanned["dense"].cost == 100_000  # a partial last block counts no more than the size
    dest = room / "dest"
    dest.mkdir()
    counted = "sparse files count their allocated blocks"
    with pytest.raises(PolicyNotEnforceableError, match=counted) as raised:
        copy_workspace(str(tree), str(dest), 3 * MIB, "max_mb=3")
    assert "max_mb=3" in str(raised.value)
    assert os.listdir(dest) == []
    with pytest.raises(PolicyNotEnforceableError, match="allocated blocks"):
        walk_copy(str(tree), str(dest), 3 * MIB, _Copier)
    assert os.listdir(dest) == []


def test_a_file_that_grows_past_the_cap_while_copied_is_still_refused(
    tree: Path, room: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The running count of a copy counts data: a sparse file filled in after the scan stops it."""
    scanned = scan_host(str(tree))
    with open(tree / "empty-sparse", "r+b") as handle:
        handle.write(os.urandom(5 * MIB))
    monkeypatch.setattr(copies, "scan_host", lambda root: scanned)
    dest = room / "dest"
    dest.mkdir()
    with pytest.raises(PolicyNotEnforceableError, match="grew past the cap"):
        copy_tree(str(tree), str(dest), 4 * MIB)


def test_a_sparse_member_is_unpacked_sparse_by_gnu_tar_and_read_by_tarfile(room: Path) -> None:
    """Python's tarfile writes the holes; the PAX 1.0 sparse member carries only the data and its map."""
    make_sparse(room / "f")
    fd = os.open(room / "f", os.O_RDONLY)
    try:
        content = read_content(fd)
    finally:
        os.close(fd)
    assert content.sparse and content.data_bytes < 2 * MIB and content.size == SIZE
    archive = tar_end(
        [
            *tar_file_member("dir/f", content, mode=0o640, owner=(0, 0), mtime=1_000_000),
            *tar_file_member("hole", Content(SIZE, ()), mode=0o600, owner=(0, 0), mtime=1_000_000),
            *tar_file_member("small", Content(3, ((0, b"abc"),)), mode=0o644, owner=(0, 0), mtime=5),
        ]
    )
    assert len(archive) < 2 * MIB
    with tarfile.open(fileobj=io.BytesIO(archive)) as opened:
        members = {member.name: member for member in opened}
        assert set(members) == {"dir/f", "hole", "small"}
        read = member_content(archive, members["dir/f"])
        assert read.size == SIZE and read.digest() == content.digest()
        assert member_content(archive, members["hole"]).digest() == Content(SIZE, ()).digest()
    if shutil.which("tar") is None:
        return
    out = room / "out"
    out.mkdir()
    (out / "dir").mkdir()
    subprocess.run(["tar", "-x", "-f", "-", "-C", str(out)], input=archive, check=True)
    assert_same_sparse(out / "dir" / "f")
    assert (out / "hole").stat().st_size == SIZE and allocated(out / "hole") == 0
    assert (out / "small").read_bytes() == b"abc"
    assert (out / "dir" / "f").stat().st_mode & 0o777 == 0o640


def test_the_digest_ignores_how_zeros_are_stored() -> None:
    """A racy file's digest: the host's extents and the sandbox tar's map may split the same bytes apart."""
    holes = Content(200_000, ((70_000, b"x" * 10),))
    written = Content(200_000, ((0, bytes(70_000) + b"x" * 10 + bytes(129_990)),))
    split = Content(200_000, ((65_536, bytes(4464)), (70_000, b"x" * 5), (70_005, b"x" * 5)))
    assert holes.digest() == written.digest() == split.digest()
    assert holes.digest() != Content(200_001, ((70_000, b"x" * 10),)).digest()
    assert holes.digest() != Content(200_000, ((70_000, b"y" * 10),)).digest()


def test_pull_back_writes_and_compares_without_the_holes(room: Path) -> None:
    root = room / "ws"
    root.mkdir()
    tree = _HostTree(RootDir(str(root)), (os.getuid(), os.getgid()))
    try:
        content = Content(SIZE, tuple((offset, data) for offset, data in PIECES))
        tree.write_file("d/f", content, 0o644, 1_000_000)
        assert_same_sparse(root / "d" / "f")
        assert tree.holds("d/f", content, 0o644, 1_000_000)
        assert tree.holds("d/f", Content(SIZE, ((0, bytes(MIB)), *PIECES[1:])), 0o644, 1_000_000) is False
        assert not tree.holds("d/f", Content(SIZE, (*PIECES[:2], (56 * MIB - 3, b"TAIL"))), 0o644, 1_000_000)
        with open(root / "d" / "f", "r+b") as handle:  # a byte of data where the content has a hole
            handle.seek(40 * MIB)
            handle.write(b"!")
        assert not tree.holds("d/f", content, 0o644, 1_000_000)
    finally:
        tree.tree.close()


def test_tree_archives_are_sparse_and_cut_between_members(tree: Path, room: Path) -> None:
    """A snapshot's tmpfs tree for a sandbox to unpack: the naive tarfile.add holds 128 MiB of holes."""
    pieces = list(_tree_archives(str(tree), "/tmp"))
    assert sum(len(piece) for piece in pieces) < 2 * MIB
    if shutil.which("tar") is None:
        return
    out = room / "out"
    out.mkdir()
    for piece in pieces:
        subprocess.run(["tar", "-x", "-f", "-", "-C", str(out)], input=piece, check=True)
    assert_same_sparse(out / "sparse")
    assert os.readlink(out / "sub" / "link") == "../dense"


def test_a_large_archive_is_restored_in_pieces_of_whole_members(room: Path) -> None:
    """One input past 256 MiB was cut by the sandbox's agent: tar said "Unexpected EOF in archive"."""
    source = room / "src"
    source.mkdir()
    for index in range(5):
        (source / f"f{index}").write_bytes(os.urandom(30 * MIB))
    (source / ("long-" + "n" * 150)).write_bytes(b"a long name")  # a GNU long-name member (two headers)
    make_sparse(source / "sparse")
    archive = room / "a.tar"
    subprocess.run(
        ["tar", "-c", "-f", str(archive), "--format=gnu", "--sparse", "-C", str(source), "."], check=True
    )
    pieces = list(_archive_pieces(os.open(archive, os.O_RDONLY)))
    assert len(pieces) >= 3 and all(len(piece) <= 70 * MIB for piece in pieces)
    out = room / "out"
    out.mkdir()
    for piece in pieces:
        subprocess.run(["tar", "-x", "-f", "-", "-C", str(out)], input=piece, check=True)
    for index in range(5):
        assert (out / f"f{index}").read_bytes() == (source / f"f{index}").read_bytes()
    assert (out / ("long-" + "n" * 150)).read_bytes() == b"a long name"
    assert_same_sparse(out / "sparse")
