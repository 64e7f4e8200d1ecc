"""Race: a thread swaps a workspace directory for a symlink to outside while the tools work in it.

This is the attack the descriptor-based resolution exists for: the sandbox container writes the same
bind-mounted directory while the host tools run, and a check-then-open-by-name implementation would
read the canary or write outside in some iteration. Here no byte may cross.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading
from pathlib import Path

import pytest

from adk_sandbox.devtools import ToolError
from adk_sandbox.devtools.tools.edit_file import EditFileArgs, edit_file
from adk_sandbox.devtools.tools.glob import glob_files
from adk_sandbox.devtools.tools.grep import grep_lines
from adk_sandbox.devtools.tools.read_file import ReadFileArgs, read_file
from adk_sandbox.devtools.tools.write_file import WriteFileArgs, write_file
from tests.unit.devtools_helpers import RESOLVERS, make_workspace

CANARY = "CANARY-race-0b7d4a"
ITERATIONS = 2000
_RENAME_EXCHANGE = 2
_SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276}.get(platform.machine())


def exchange(dir_fd: int, first: str, second: str) -> None:
    """Atomically swap two names (renameat2 RENAME_EXCHANGE), or fall back to a non-atomic rename dance."""
    if _SYS_RENAMEAT2 is not None:
        libc = ctypes.CDLL(None, use_errno=True)
        result = libc.syscall(
            _SYS_RENAMEAT2, dir_fd, first.encode(), dir_fd, second.encode(), _RENAME_EXCHANGE
        )
        if result == 0:
            return
    os.rename(first, "swap-tmp", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    os.rename(second, first, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    os.rename("swap-tmp", second, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


@pytest.mark.parametrize("resolver", RESOLVERS)
def test_swapping_a_directory_for_an_outside_symlink_never_crosses(tmp_path: Path, resolver: str) -> None:
    root, outside = tmp_path / "ws", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "f.txt").write_text(CANARY + "\n")
    (root / "d").mkdir()
    (root / "d" / "f.txt").write_text("inside\n")
    os.symlink(str(outside), root / "alt")  # absolute: also exercises the walk's absolute-link path
    outside_before = {p.name: p.read_bytes() for p in outside.iterdir()}

    stop = threading.Event()
    swaps = 0

    def swapper() -> None:
        nonlocal swaps
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            while not stop.is_set():
                exchange(root_fd, "d", "alt")
                swaps += 1
        finally:
            os.close(root_fd)

    seen_inside = 0
    refused = 0
    thread = threading.Thread(target=swapper, daemon=True)
    with make_workspace(root, resolver) as ws:
        thread.start()
        try:
            for i in range(ITERATIONS):
                for action in (
                    lambda: read_file(ws, ReadFileArgs(path="d/f.txt"))["content"],
                    lambda i=i: write_file(ws, WriteFileArgs(path=f"d/w{i % 7}.txt", content="written\n")),
                    lambda: write_file(ws, WriteFileArgs(path="d/sub/new.txt", content="deep\n")),
                    lambda: write_file(ws, WriteFileArgs(path="d/f.txt", content="inside\n")),
                    lambda: edit_file(ws, EditFileArgs(path="d/f.txt", old_string="inside", new_string="in")),
                    lambda: grep_lines(ws, "CANARY|inside", "d", limit=None)[0],
                    lambda: glob_files(ws, "**/*", "d", limit=None)[0],
                ):
                    try:
                        outcome = action()
                    except ToolError:
                        refused += 1  # escape, vanished file, not read yet: all fine
                        continue
                    assert CANARY not in repr(outcome)
                    seen_inside += 1
        finally:
            stop.set()
            thread.join()
    assert swaps > 100, "the swapper did not run concurrently"
    assert seen_inside > 0 and refused > 0, "the race never hit both states"
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == outside_before, "written outside"
