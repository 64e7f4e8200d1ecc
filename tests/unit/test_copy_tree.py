"""``copy_tree``: how ``session(copy_of=X)`` fills its workspace copy (docs/DOCKER.md, "Warm pool").

Host-only (no engine): the copy is what the mirror's push would send, ``X`` is only read, and nothing in
``X`` — a link out, a FIFO, an entry swapped for a link or a FIFO between the scan and the copy — makes it
read or write outside ``X`` and the copy, or hang.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from adk_sandbox.executor import PolicyNotEnforceableError, _owner
from adk_sandbox.executor.workspace import copies
from adk_sandbox.executor.workspace.copies import copy_prefix, copy_tree, reap_copies
from adk_sandbox.executor.workspace.scan import scan_host

MIB = 1024 * 1024


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A host file outside both trees that nothing may copy."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "key").write_text("host secret\n")
    return outside


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    (root / "pkg" / "deep").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("VALUE = 1\n")
    (root / "pkg" / "deep" / "data.bin").write_bytes(os.urandom(3000))
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o750)
    (root / "empty").mkdir()
    (root / "link").symlink_to("pkg/mod.py")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    os.utime(root / "pkg" / "mod.py", ns=(1_600_000_000_123_456_789, 1_600_000_000_123_456_789))
    return root


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    out.mkdir(mode=0o700)
    return out


def tree(root: Path) -> dict[str, tuple[str, int, int, bytes | str]]:
    """Kind, mode, mtime (files) and content or link target of everything below ``root``."""
    found: dict[str, tuple[str, int, int, bytes | str]] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        rel = str(path.relative_to(root))
        if stat.S_ISLNK(info.st_mode):
            found[rel] = ("l", 0, 0, os.readlink(path))
        elif stat.S_ISDIR(info.st_mode):
            found[rel] = ("d", stat.S_IMODE(info.st_mode), 0, b"")
        else:
            found[rel] = ("f", stat.S_IMODE(info.st_mode), info.st_mtime_ns, path.read_bytes())
    return found


def test_the_copy_is_the_tree_with_its_modes_and_times(source: Path, dest: Path) -> None:
    (source / "pkg" / "deep").chmod(0o555)  # read-only: its contents are written before its mode
    before = tree(source)
    assert copy_tree(str(source), str(dest), 64 * MIB) == []
    assert tree(dest) == before
    assert tree(source) == before
    assert set(scan_host(str(dest))) == set(scan_host(str(source)))
    (source / "pkg" / "deep").chmod(0o755)
    (dest / "pkg" / "deep").chmod(0o755)


def test_links_leading_out_are_left_out_and_said(source: Path, dest: Path, secret: Path) -> None:
    (source / "abs-out").symlink_to(secret / "key")
    (source / "climb").symlink_to("../outside/key")
    (source / "abs-in").symlink_to(source / "run.sh")  # absolute: leads out of the copy
    (source / "into-git").symlink_to(".git/HEAD")
    (source / "pkg" / "up").symlink_to("..")  # stays inside: kept
    before = tree(source)
    skipped = copy_tree(str(source), str(dest), 64 * MIB)
    for name in ("abs-out", "climb", "abs-in", "into-git"):
        assert not os.path.lexists(dest / name), name
        assert any(reason.startswith(f"{name}: ") for reason in skipped), (name, skipped)
    assert os.readlink(dest / "pkg" / "up") == ".."
    assert os.readlink(dest / "link") == "pkg/mod.py"
    assert tree(source) == before


def test_special_files_are_left_out_without_blocking(source: Path, dest: Path, tmp_path: Path) -> None:
    os.mkfifo(source / "fifo")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(source / "sock"))
    try:
        done = threading.Event()
        worker = threading.Thread(target=lambda: (copy_tree(str(source), str(dest), 64 * MIB), done.set()))
        worker.start()
        worker.join(30)
        assert done.is_set(), "the copy hung on a special file"
    finally:
        server.close()
    assert not os.path.lexists(dest / "fifo") and not os.path.lexists(dest / "sock")


def test_entries_swapped_after_the_scan_are_not_followed(
    source: Path, dest: Path, secret: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (secret / "data.bin").write_text("host secret\n")  # what a path-following copy of pkg/deep would read
    scanned = scan_host(str(source))
    # Between the scan and the copy: a directory becomes a link out, a file a link to the secret, another
    # a FIFO (opening it for reading would block).
    (source / "pkg" / "deep" / "data.bin").unlink()
    (source / "pkg" / "deep").rmdir()
    (source / "pkg" / "deep").symlink_to(secret)
    (source / "pkg" / "mod.py").unlink()
    (source / "pkg" / "mod.py").symlink_to(secret / "key")
    (source / "run.sh").unlink()
    os.mkfifo(source / "run.sh")
    monkeypatch.setattr(copies, "scan_host", lambda root: scanned)
    skipped = copy_tree(str(source), str(dest), 64 * MIB)
    copied = tree(dest)
    assert all(b"host secret" not in str(what).encode() for *_, what in copied.values())
    assert all(what != b"host secret\n" for *_, what in copied.values())
    assert not os.path.lexists(dest / "pkg" / "deep")
    assert not os.path.lexists(dest / "pkg" / "mod.py") and not os.path.lexists(dest / "run.sh")
    assert {reason.split(":")[0] for reason in skipped} >= {"pkg/deep", "pkg/mod.py", "run.sh"}


def test_a_tree_over_the_cap_is_refused_before_anything_is_written(source: Path, dest: Path) -> None:
    (source / "big").write_bytes(b"\0" * (2 * MIB))
    with pytest.raises(PolicyNotEnforceableError, match="more than its copy in the sandbox may hold"):
        copy_tree(str(source), str(dest), 1 * MIB)
    assert list(dest.iterdir()) == []


def test_a_file_that_grows_past_the_cap_meanwhile_is_refused(
    source: Path, dest: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scanned = scan_host(str(source))
    (source / "pkg" / "mod.py").write_bytes(b"x" * (2 * MIB))  # grew after the scan
    monkeypatch.setattr(copies, "scan_host", lambda root: scanned)
    with pytest.raises(PolicyNotEnforceableError, match="grew past the cap"):
        copy_tree(str(source), str(dest), 1 * MIB)


def test_the_copies_of_gone_owners_are_reaped_and_no_others(tmp_path: Path) -> None:
    child = subprocess.Popen(["sleep", "30"])
    start = _owner.start_time(child.pid)
    child.kill()
    child.wait()
    live = copy_prefix("copy")  # this process's own
    boot, namespace = live.split("-")[3:5]
    other_boot = "ffffffff" if boot != "ffffffff" else "00000000"
    names = {
        "dead": f"adk-sandbox-copy-{boot}-{namespace}-{child.pid}-{start}-a1",
        "dead-pool": f"adk-sandbox-pool-{boot}-{namespace}-{child.pid}-{start}-b2",
        "earlier-boot": f"adk-sandbox-copy-{other_boot}-{namespace}-{os.getpid()}-1-c3",
        "live": f"{live}d4",
        "other-namespace": f"adk-sandbox-copy-{boot}-1-{child.pid}-{start}-e5",
        "not-ours": "adk-sandbox-copy-x",
    }
    for name in names.values():
        (tmp_path / name / "sub").mkdir(parents=True)
        (tmp_path / name / "sub" / "file").write_text("copy\n")
    someone_else = tmp_path / f"adk-sandbox-copy-{boot}-{namespace}-{child.pid}-{start}-f6"
    someone_else.symlink_to(tmp_path / names["live"])  # a link named like a copy: never followed
    removed = reap_copies(str(tmp_path))
    assert sorted(removed) == sorted(str(tmp_path / names[k]) for k in ("dead", "dead-pool", "earlier-boot"))
    for key in ("live", "other-namespace", "not-ours"):
        assert (tmp_path / names[key] / "sub" / "file").exists(), key
    assert someone_else.is_symlink()
