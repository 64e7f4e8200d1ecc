"""Containment corpus: every case has an expected outcome, run through both resolver paths.

The layout holds a workspace ``ws`` and, next to it, ``outside`` (with a canary) and ``ws-evil`` (a sibling
whose name shares the root's prefix). Reads go through read_file, writes through write_file; after every
case the outside directories must be byte-for-byte unchanged.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from adk_sandbox.devtools import (
    InvalidPathError,
    NotRegularFileError,
    PathEscapeError,
    PathNotFoundError,
    ToolError,
    Workspace,
)
from adk_sandbox.devtools.tools.read_file import ReadFileArgs, read_file
from adk_sandbox.devtools.tools.write_file import WriteFileArgs, write_file
from adk_sandbox.executor.workspace import beneath
from tests.unit.devtools_helpers import RESOLVERS, make_workspace

CANARY = "CANARY-outside-9f1c2e"


@dataclass
class Layout:
    base: Path
    root: Path
    outside: Path
    evil: Path


def build_layout() -> Layout:
    # Short base path: a unix socket's path must fit in 108 bytes.
    base = Path(tempfile.mkdtemp(prefix="cc"))
    root, outside, evil = base / "ws", base / "outside", base / "ws-evil"
    for directory in (root, outside, evil, root / "sub", root / "deep/a/b", root / "~"):
        directory.mkdir(parents=True, exist_ok=True)
    (outside / "secret.txt").write_text(CANARY)
    (outside / "hard.txt").write_text("outside hard\n")
    (evil / "secret.txt").write_text(CANARY)
    (root / "file.txt").write_text("inside\n")
    (root / "sub/inner.txt").write_text("inner\n")
    (root / "deep/a/b/c.txt").write_text("deep\n")
    (root / "~/home.txt").write_text("tilde\n")
    links = {
        "link_in": "file.txt",
        "link_in_abs": f"{root}/file.txt",
        "chain": "link_in",
        "dirlink": "sub",
        "dirlink_abs": f"{root}/sub",
        "dirlink_to_root": ".",
        "up_link": "sub/../file.txt",
        "esc_file": "../outside/secret.txt",
        "esc_abs": f"{outside}/secret.txt",
        "esc_dir": "../outside",
        "esc_dir_abs": str(outside),
        "esc_via_dotdot": "sub/../../outside/secret.txt",
        "esc_evil": f"{evil}/secret.txt",
        "dangling": "nothing_here",
        "dangling_out": "../outside/missing",
        "loop_a": "loop_b",
        "loop_b": "loop_a",
        "self_loop": "self_loop",
        "proc_root": "/proc/self/root",
        "dev_zero": "/dev/zero",
    }
    for name, target in links.items():
        os.symlink(target, root / name)
    os.link(outside / "hard.txt", root / "hard_out")
    os.mkfifo(root / "fifo")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(root / "sock"))
    listener.close()  # the socket file stays
    return Layout(base, root, outside, evil)


@pytest.fixture
def layout() -> Iterator[Layout]:
    made = build_layout()
    yield made
    shutil.rmtree(made.base)


def snapshot(*dirs: Path) -> dict[str, bytes | str]:
    """Everything under ``dirs`` without following links: contents, link targets, kinds of other entries."""
    seen: dict[str, bytes | str] = {}
    for top in dirs:
        for parent, dirnames, filenames in os.walk(top):
            for name in dirnames + filenames:
                path = os.path.join(parent, name)
                info = os.lstat(path)
                if stat.S_ISLNK(info.st_mode):
                    seen[path] = "link:" + os.readlink(path)
                elif stat.S_ISREG(info.st_mode):
                    seen[path] = Path(path).read_bytes()
                else:
                    seen[path] = f"mode:{stat.S_IFMT(info.st_mode)}"
    return seen


OK = "ok"

# (path template, expected): expected is file content for a successful read, or the error class.
READ_CASES: list[tuple[str, object]] = [
    ("file.txt", "inside\n"),
    ("sub/inner.txt", "inner\n"),
    ("./file.txt", "inside\n"),
    ("sub/../file.txt", "inside\n"),
    ("deep/a/b/c.txt", "deep\n"),
    ("{root}/file.txt", "inside\n"),
    ("{root}//sub/./inner.txt", "inner\n"),
    ("../outside/secret.txt", PathEscapeError),
    ("sub/../../outside/secret.txt", PathEscapeError),
    ("../../../../../../etc/passwd", PathEscapeError),
    ("/etc/passwd", PathEscapeError),
    ("{root}-evil/secret.txt", PathEscapeError),
    ("{root}/../outside/secret.txt", PathEscapeError),
    ("../ws/file.txt", PathEscapeError),  # leaves the root and comes back: refused like RESOLVE_BENEATH
    ("link_in", "inside\n"),
    ("link_in_abs", "inside\n"),  # an absolute link that stays inside keeps working
    ("chain", "inside\n"),
    ("up_link", "inside\n"),
    ("dirlink/inner.txt", "inner\n"),
    ("dirlink_abs/inner.txt", "inner\n"),
    ("dirlink/../file.txt", "inside\n"),  # .. of the link's target (sub), not lexical
    ("dirlink_to_root/dirlink_to_root/file.txt", "inside\n"),
    ("esc_file", PathEscapeError),
    ("esc_abs", PathEscapeError),
    ("esc_dir/secret.txt", PathEscapeError),
    ("esc_dir_abs/secret.txt", PathEscapeError),
    ("esc_via_dotdot", PathEscapeError),
    ("esc_evil", PathEscapeError),
    ("dirlink/../esc_file", PathEscapeError),
    ("dangling", InvalidPathError),
    ("dangling_out", PathEscapeError),
    ("loop_a", InvalidPathError),
    ("self_loop", InvalidPathError),
    ("loop_a/x", InvalidPathError),
    ("proc_root/etc/passwd", PathEscapeError),
    ("dev_zero", PathEscapeError),
    ("fifo", NotRegularFileError),
    ("sock", NotRegularFileError),
    ("sub", NotRegularFileError),
    (".", NotRegularFileError),
    ("file\0.txt", InvalidPathError),
    ("a" * 256, InvalidPathError),
    ("a/" * 2100, InvalidPathError),
    ("", InvalidPathError),
    ("bad\ud800name", InvalidPathError),
    ("~/home.txt", "tilde\n"),  # ~ is a literal name
    ("~/missing.txt", PathNotFoundError),
    ("missing.txt", PathNotFoundError),
    ("file.txt/x", PathNotFoundError),
    # Documented: a hard link is an ordinary entry of the workspace; its content is readable.
    ("hard_out", "outside hard\n"),
]

# (path template, expected): where the write must land (relative to the root) or the error class.
WRITE_CASES: list[tuple[str, object]] = [
    ("new.txt", "new.txt"),
    ("newdir/deeper/new.txt", "newdir/deeper/new.txt"),
    ("{root}/abs_new.txt", "abs_new.txt"),
    ("link_in", "file.txt"),  # an inside link is followed; it stays a link
    ("link_in_abs", "file.txt"),
    ("dirlink/new.txt", "sub/new.txt"),
    ("dirlink_abs/new.txt", "sub/new.txt"),
    ("~/new.txt", "~/new.txt"),
    ("esc_file", PathEscapeError),
    ("esc_abs", PathEscapeError),
    ("esc_dir/new.txt", PathEscapeError),
    ("esc_dir_abs/new.txt", PathEscapeError),
    ("esc_dir/newsub/new.txt", PathEscapeError),
    ("../outside/new.txt", PathEscapeError),
    ("{root}-evil/new.txt", PathEscapeError),
    ("proc_root/tmp/x.txt", PathEscapeError),
    ("dev_zero", PathEscapeError),
    ("dangling_out", PathEscapeError),
    ("dangling", InvalidPathError),  # would create the dangling link's target
    ("dangling/new.txt", InvalidPathError),
    ("loop_a", InvalidPathError),
    ("fifo", NotRegularFileError),
    ("sock", NotRegularFileError),
    ("sub", NotRegularFileError),
    ("file\0.txt", InvalidPathError),
    ("b" * 256, InvalidPathError),
    # Documented: writes replace the directory entry (temp file + rename), so the outside inode a hard
    # link shares is never written.
    ("hard_out", "hard_out"),
]


def run_guarded(action: object) -> object:
    """Run ``action`` in a thread: a FIFO or device that blocked would fail the test instead of hanging."""
    outcome: list[object] = []

    def target() -> None:
        try:
            outcome.append(action())  # type: ignore[operator]
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(1.0)
    assert not thread.is_alive(), "the tool blocked for more than a second"
    return outcome[0]


def expand(template: str, layout: Layout) -> str:
    return template.replace("{root}", str(layout.root))


@pytest.mark.parametrize("resolver", RESOLVERS)
@pytest.mark.parametrize(("template", "expected"), READ_CASES, ids=[c[0][:40] for c in READ_CASES])
def test_read_corpus(layout: Layout, resolver: str, template: str, expected: object) -> None:
    before = snapshot(layout.outside, layout.evil)
    with make_workspace(layout.root, resolver) as ws:
        outcome = run_guarded(lambda: read_file(ws, ReadFileArgs(path=expand(template, layout))))
    if isinstance(expected, str):
        assert isinstance(outcome, dict), outcome
        assert outcome["content"] == "".join(
            f"{n:>6}\t{line}\n" for n, line in enumerate(expected.splitlines(), 1)
        )
    else:
        assert isinstance(outcome, expected), outcome  # type: ignore[arg-type]
        assert isinstance(outcome, ToolError)
        assert CANARY not in str(outcome)
    assert snapshot(layout.outside, layout.evil) == before


@pytest.mark.parametrize("resolver", RESOLVERS)
@pytest.mark.parametrize(("template", "expected"), WRITE_CASES, ids=[c[0][:40] for c in WRITE_CASES])
def test_write_corpus(layout: Layout, resolver: str, template: str, expected: object) -> None:
    outside_before = snapshot(layout.outside, layout.evil)
    root_before = snapshot(layout.root)
    with make_workspace(layout.root, resolver) as ws:
        args = WriteFileArgs(path=expand(template, layout), content="NEW\n")
        outcome = run_guarded(lambda: write_file(ws, args))
    assert snapshot(layout.outside, layout.evil) == outside_before, "something outside changed"
    if isinstance(expected, str):
        assert isinstance(outcome, dict), outcome
        assert (layout.root / expected).read_text() == "NEW\n"
        changed = {k for k, v in snapshot(layout.root).items() if root_before.get(k) != v}
        assert changed <= {
            str(layout.root / expected),
            *(str(p) for p in (layout.root / expected).parents if p != layout.root),
        }
    else:
        assert isinstance(outcome, expected), outcome  # type: ignore[arg-type]
        # A refused write leaves everything as it was: no created target, parent or temp file.
        assert snapshot(layout.root) == root_before


def test_corpus_is_large_enough() -> None:
    assert len(READ_CASES) + len(WRITE_CASES) >= 40


@pytest.mark.parametrize("resolver", RESOLVERS)
def test_hard_link_write_leaves_the_outside_inode_alone(layout: Layout, resolver: str) -> None:
    with make_workspace(layout.root, resolver) as ws:
        write_file(ws, WriteFileArgs(path="hard_out", content="replaced\n"))
    assert (layout.outside / "hard.txt").read_text() == "outside hard\n"
    assert (layout.root / "hard_out").read_text() == "replaced\n"
    assert os.stat(layout.root / "hard_out").st_nlink == 1


@pytest.mark.parametrize("resolver", RESOLVERS)
def test_resolve_cases(layout: Layout, resolver: str) -> None:
    with make_workspace(layout.root, resolver) as ws:
        assert ws.resolve("link_in_abs") == layout.root / "file.txt"
        assert ws.resolve("dirlink/../file.txt") == layout.root / "file.txt"
        assert ws.resolve("new/dir/x.txt") == layout.root / "new/dir/x.txt"
        assert ws.resolve(".") == layout.root
        for escaping in ("esc_dir/x", "../x", "{root}-evil", "proc_root"):
            with pytest.raises(PathEscapeError, match="escapes the workspace root"):
                ws.resolve(expand(escaping, layout))
        with pytest.raises(InvalidPathError):
            ws.resolve("dangling")


def test_walk_is_used_when_openat2_is_refused(layout: Layout, monkeypatch: pytest.MonkeyPatch) -> None:
    # Simulate a kernel or seccomp filter without openat2: the workspace falls back to the walk.
    def refused(*args: object) -> int:
        raise OSError(38, "Function not implemented")  # ENOSYS

    monkeypatch.setattr(beneath, "_syscall_openat2", refused)
    with Workspace(layout.root) as ws:
        ws._root.use_openat2 = True
        assert read_file(ws, ReadFileArgs(path="link_in_abs"))["content"] == "     1\tinside\n"
        assert ws._root.use_openat2 is False
        with pytest.raises(PathEscapeError):
            read_file(ws, ReadFileArgs(path="esc_file"))
