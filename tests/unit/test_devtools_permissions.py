"""The file tools honour a file's permission bits: as root (CI) and as an unprivileged user (real files).

The unprivileged cases switch this process's effective uid and gid (the tests run as root, like the rest
of the suite that chowns workspaces) so the kernel itself judges the opens, and switch back after.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adk_sandbox.devtools import DevToolset, FilePermissionError, ToolError, Workspace
from tests.conftest import require

USER = 1000


def run(ws: Workspace, name: str, **args: Any) -> dict[str, Any]:
    return asyncio.run(DevToolset(ws).run(name, args))


@pytest.fixture(autouse=True)
def _as_root() -> None:
    require(os.geteuid() == 0, "these tests switch users, which needs root (as the suite's chowns do)")


@contextlib.contextmanager
def acting_as(uid: int, gid: int, groups: tuple[int, ...] = ()) -> Iterator[None]:
    """Run the block with this effective uid/gid and supplementary groups, then back to root."""
    saved = os.getgroups()
    os.setgroups(list(groups))
    os.setegid(gid)
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(saved)


@pytest.fixture
def root_dir(tmp_path: Path) -> Path:
    """A workspace root any user can enter and write (the temp path above it too)."""
    root = tmp_path / "ws"
    root.mkdir()
    for path in (tmp_path, root):
        path.chmod(0o777)
    return root


def make(path: Path, content: str, mode: int, owner: tuple[int, int] = (0, 0)) -> Path:
    path.write_text(content)
    os.chown(path, *owner)
    path.chmod(mode)
    return path


def assert_unchanged(path: Path, content: str, mode: int) -> None:
    assert path.read_text() == content
    assert path.stat().st_mode & 0o7777 == mode
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


# -- as root -----------------------------------------------------------------------------------------


def test_root_never_replaces_a_file_that_nobody_may_write(root_dir: Path) -> None:
    target = make(root_dir / "frozen.txt", "old\n", 0o444)
    with Workspace(root_dir) as ws:
        with pytest.raises(FilePermissionError, match=r"'frozen.txt' is read-only \(mode 0444\)") as raised:
            run(ws, "write_file", path="frozen.txt", content="new\n")
        assert isinstance(raised.value, PermissionError) and isinstance(raised.value, ToolError)
        assert_unchanged(target, "old\n", 0o444)
        run(ws, "read_file", path="frozen.txt")  # readable, so edit_file gets as far as the mode
        with pytest.raises(FilePermissionError, match="left unchanged"):
            run(ws, "edit_file", path="frozen.txt", old_string="old", new_string="new")
        assert_unchanged(target, "old\n", 0o444)


def test_root_writes_a_file_someone_may_write_and_keeps_its_mode_and_owner(root_dir: Path) -> None:
    target = make(root_dir / "theirs.sh", "old\n", 0o704, owner=(USER, USER))
    with Workspace(root_dir) as ws:
        run(ws, "write_file", path="theirs.sh", content="new\n")
        run(ws, "edit_file", path="theirs.sh", old_string="new", new_string="newer")
    info = target.stat()
    assert target.read_text() == "newer\n"
    assert (info.st_mode & 0o7777, info.st_uid, info.st_gid) == (0o704, USER, USER)


def test_root_reads_no_file_that_nobody_may_read(root_dir: Path) -> None:
    make(root_dir / "secret.txt", "s\n", 0o200)
    with Workspace(root_dir) as ws, pytest.raises(FilePermissionError, match=r"not readable \(mode 0200\)"):
        run(ws, "read_file", path="secret.txt")


def test_root_creates_nothing_in_a_directory_that_nobody_may_write(root_dir: Path) -> None:
    (root_dir / "sealed").mkdir(mode=0o555)
    (root_dir / "sealed").chmod(0o555)
    with (
        Workspace(root_dir) as ws,
        pytest.raises(FilePermissionError, match=r"directory of 'sealed/new\.txt'"),
    ):
        run(ws, "write_file", path="sealed/new.txt", content="x")
    assert list((root_dir / "sealed").iterdir()) == []


# -- as an unprivileged user (the kernel's own checks, and the rename it would allow) -----------------


def test_a_user_cannot_replace_their_own_read_only_file_in_their_writable_directory(root_dir: Path) -> None:
    os.chown(root_dir, USER, USER)
    target = make(root_dir / "mine.txt", "old\n", 0o444, owner=(USER, USER))
    # The kernel would let this user rename over the file (the directory is theirs): the mode decides.
    with (
        Workspace(root_dir) as ws,
        acting_as(USER, USER),
        pytest.raises(FilePermissionError, match="read-only"),
    ):
        run(ws, "write_file", path="mine.txt", content="new\n")
    assert_unchanged(target, "old\n", 0o444)


@pytest.mark.parametrize(
    ("owner", "groups", "mode", "allowed"),
    [
        ((USER, USER), (), 0o644, True),  # owner bits
        ((USER, USER), (), 0o466, False),  # owner bits win over group/other, as in the kernel
        ((0, 4242), (4242,), 0o464, True),  # a supplementary group's bits
        ((0, 4242), (4242,), 0o446, False),
        ((0, 0), (), 0o646, True),  # other bits
        ((0, 0), (), 0o664, False),
    ],
)
def test_a_user_is_judged_by_owner_then_group_then_other_bits(
    root_dir: Path, owner: tuple[int, int], groups: tuple[int, ...], mode: int, allowed: bool
) -> None:
    target = make(root_dir / "f.txt", "old\n", mode, owner=owner)
    with Workspace(root_dir) as ws, acting_as(USER, USER, groups):
        if allowed:
            run(ws, "write_file", path="f.txt", content="new\n")
        else:
            with pytest.raises(FilePermissionError):
                run(ws, "write_file", path="f.txt", content="new\n")
    assert target.read_text() == ("new\n" if allowed else "old\n")
    assert target.stat().st_mode & 0o7777 == mode


def test_a_read_the_kernel_denies_is_a_permission_error(root_dir: Path) -> None:
    make(root_dir / "roots.txt", "r\n", 0o600)
    with Workspace(root_dir) as ws, acting_as(USER, USER):
        with pytest.raises(FilePermissionError, match=r"roots\.txt") as raised:
            run(ws, "read_file", path="roots.txt")
        assert isinstance(raised.value, PermissionError)
