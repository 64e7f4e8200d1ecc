"""Pull-back's caps against a forged listing and a forged archive (the sandbox's output: hostile input).

The host side of :class:`MirrorWorkspace` is driven directly, on a real host workspace (``tmp_path``): the
sandbox is a ``run`` that answers the listing and the fetch with bytes made here, as a root process in the
sandbox can (it can replace ``find`` and ``tar``, or change a file between the listing and the fetch).
Depth: docs/docker/workspace-transport.md ("The cap") and docs/sparse.md.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from adk_sandbox.executor.workspace import pullback
from adk_sandbox.executor.workspace.mirror import MirrorWorkspace
from adk_sandbox.executor.workspace.protocol import RunResult

TIB = 1024**4
#: The container's "now" (seconds) in the forged listings: every entry below is older, so none is racy.
NOW = 1000


def listing(entries: list[tuple[str, str, int, str]], touched: tuple[str, ...] = ()) -> bytes:
    """A listing as ``_LIST_SCRIPT`` prints it: the "now" record, then (path, kind, size, link target).

    Every entry has the same times, but those named in ``touched`` (changed since the last listing).
    """
    out = [b"\0f 0 0 0.0 %d.0000000000 0\0\0" % NOW]
    for inode, (path, kind, size, target) in enumerate(entries, start=100):
        mode = b"755" if kind == "d" else b"777" if kind == "l" else b"644"
        mtime = 501 if path in touched else 500
        out.append(
            b"%s\0%s %s %d %d.0000000000 600.0000000000 %d\0%s\0"
            % (
                path.encode(),
                kind.encode(),
                mode,
                size,
                mtime,
                inode,
                target.encode(),
            )
        )
    return b"".join(out)


def plain_member(name: str, data: bytes) -> bytes:
    """A regular member as ``tarfile`` writes it (GNU format)."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 500
    return info.tobuf(tarfile.GNU_FORMAT) + data + bytes(-len(data) % 512)


def gnu_sparse_member(name: str, size: int, data: bytes) -> bytes:
    """An old GNU sparse member (what ``tar -c --format=gnu --sparse`` writes): ``data``, then a hole.

    ``tarfile`` writes no sparse member: its GNU header is patched with the sparse map (one extent, then the
    real size) and its checksum made again.
    """
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode, info.mtime = tarfile.GNUTYPE_SPARSE, len(data), 0o644, 500
    header = bytearray(info.tobuf(tarfile.GNU_FORMAT))
    header[386:398] = tarfile.itn(0, 12, tarfile.GNU_FORMAT)  # the one extent: its offset, its length
    header[398:410] = tarfile.itn(len(data), 12, tarfile.GNU_FORMAT)
    header[483:495] = tarfile.itn(size, 12, tarfile.GNU_FORMAT)  # the real (apparent) size
    header[148:156] = b" " * 8
    header[148:155] = b"%06o\0" % tarfile.calc_chksums(bytes(header))[0]
    return bytes(header) + data + bytes(-len(data) % 512)


def archive(*members: bytes) -> bytes:
    return b"".join(members) + bytes(1024)


class ForgedSandbox:
    """Answers the mirror's commands with what a test set: the listing and the archive of the fetch."""

    def __init__(self) -> None:
        self.listing = listing([])
        self.archive = archive()
        self.fetches: list[list[str]] = []
        self.pushes = 0

    def run(self, argv: tuple[str, ...], stdin: bytes | None, max_output: int) -> RunResult:
        what = argv[3]
        if what == "adk-sandbox-list":
            return RunResult(0, self.listing, b"", truncated=False)
        if what == "adk-sandbox-fetch":
            self.fetches.append([name.decode() for name in (stdin or b"").split(b"\0")[:-1]])
            return RunResult(0, self.archive[:max_output], b"", truncated=len(self.archive) > max_output)
        if what == "adk-sandbox-push":
            self.pushes += 1  # the start's: the listings here say what it made
            return RunResult(0, b"", b"", truncated=False)
        raise AssertionError(f"not expected in a pull-back: {what}")


def tree_of(root: Path) -> dict[str, tuple[int, int, bytes | str | None]]:
    """Every entry below ``root``: its mode, its size, a file's content or a link's target."""
    found: dict[str, tuple[int, int, bytes | str | None]] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        what: bytes | str | None = None
        if path.is_symlink():
            what = os.readlink(path)
        elif path.is_file():
            what = path.read_bytes()
        found[str(path.relative_to(root))] = (info.st_mode, info.st_size, what)
    return found


#: The host workspace's tree as the sandbox lists it after the start (path, kind, size, link target).
KEPT = [("f.txt", "f", 4, ""), ("keep", "d", 0, ""), ("keep/k.txt", "f", 5, "")]


@pytest.fixture
def host(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "f.txt").write_bytes(b"one\n")
    (root / "keep").mkdir()
    (root / "keep" / "k.txt").write_bytes(b"kept\n")
    return root


def started(host: Path, cap_mb: int) -> tuple[MirrorWorkspace, ForgedSandbox]:
    """A mirror of ``host`` with a copy of ``cap_mb`` MiB, started: the sandbox lists what the push made."""
    sandbox = ForgedSandbox()
    sandbox.listing = listing(KEPT)
    mirror = MirrorWorkspace(str(host), cap_mb, (os.getuid(), os.getgid()))
    mirror.started(sandbox.run)
    sandbox.pushes = 0
    return mirror, sandbox


@pytest.fixture
def nothing_made(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Fails the test at the first entry pull-back would make on the host (directory, link or file)."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"pull-back made an entry on the host: {args[1:2]}")

    for name in ("make_dir", "make_link", "write_file"):
        monkeypatch.setattr(pullback._HostTree, name, refuse)
    return monkeypatch.undo


# -- 1. a file's size in the archive is the size its listing counted -------------------------------------


@pytest.mark.parametrize(
    "member",
    [
        pytest.param(lambda name: gnu_sparse_member(name, 10 * TIB, b"x" * 4), id="sparse-10-TiB"),
        pytest.param(lambda name: plain_member(name, b"y" * 9000), id="larger"),
        pytest.param(lambda name: plain_member(name, b"z"), id="smaller"),
    ],
)
def test_a_member_whose_size_is_not_the_listed_one_is_refused_and_nothing_of_it_lands(
    host: Path, member: Callable[[str], bytes]
) -> None:
    """``truncate -s 10T`` between the listing and the fetch (or a forged tar): the host keeps what it had."""
    mirror, sandbox = started(host, 1)
    before = tree_of(host)
    sandbox.listing = listing([*KEPT, ("new.bin", "f", 4, "")], touched=("f.txt",))
    sandbox.archive = archive(member("f.txt"), member("new.bin"))
    refused = mirror.after_command(sandbox.run)
    assert sorted(sandbox.fetches[0]) == ["f.txt", "new.bin"]
    assert [reason.split(":")[0] for reason in refused] == ["f.txt", "new.bin"], refused
    assert all("bytes listed" in reason for reason in refused), refused
    assert tree_of(host) == before  # not written, not replaced, no temp file left
    assert not (host / "new.bin").exists()


def test_a_sparse_member_of_the_listed_size_still_comes_back_sparse(host: Path) -> None:
    """The check is equality with the listing, which the cap counted: a sparse file that fits still comes."""
    mirror, sandbox = started(host, 1)
    sandbox.listing = listing([*KEPT, ("holes", "f", 512 * 1024, "")])
    sandbox.archive = archive(gnu_sparse_member("holes", 512 * 1024, b"data"))
    assert mirror.after_command(sandbox.run) == []
    info = (host / "holes").stat()
    assert info.st_size == 512 * 1024 and info.st_blocks * 512 < 512 * 1024
    assert (host / "holes").read_bytes()[:4] == b"data"


# -- 2. every entry counts against the cap: the number of entries is bounded ----------------------------


@pytest.mark.parametrize(
    ("kind", "target"), [pytest.param("d", "", id="directories"), pytest.param("l", "f.txt", id="links")]
)
def test_two_hundred_thousand_entries_under_a_1_mib_cap_are_refused_before_any_is_made(
    host: Path, nothing_made: Callable[[], None], kind: str, target: str
) -> None:
    """A 5 MB listing (forged, or real empty directories: free on a tmpfs) makes nothing on the host."""
    mirror, sandbox = started(host, 1)
    before = tree_of(host)
    made = [(f"d{n // 1000}/e{n}" if kind == "l" else f"d{n}", kind, 0, target) for n in range(200_000)]
    sandbox.listing = listing([*KEPT, *made])
    refused = mirror.after_command(sandbox.run)
    assert len(refused) == 1 and "200000 changed entries" in refused[0], refused[:3]
    assert "more than the copy's cap lets come back" in refused[0]
    assert tree_of(host) == before and sandbox.fetches == []
    # Still refused after the next command: nothing of it was taken as in sync.
    assert len(mirror.after_command(sandbox.run)) == 1
    # Once the sandbox holds few enough, they come (and a removal waits for a pull-back that lands).
    nothing_made()
    sandbox.listing = listing([("f.txt", "f", 4, ""), *made[:100]])
    assert mirror.after_command(sandbox.run) == []
    assert not (host / "keep").exists()
    assert sum(1 for _ in host.rglob("*")) == 1 + 100 + (1 if kind == "l" else 0)


def test_two_hundred_thousand_empty_files_under_a_1_mib_cap_are_refused_and_never_fetched(
    host: Path, nothing_made: Callable[[], None]
) -> None:
    mirror, sandbox = started(host, 1)
    before = tree_of(host)
    sandbox.listing = listing([*KEPT, *[(f"e{n}", "f", 0, "") for n in range(200_000)]])
    refused = mirror.after_command(sandbox.run)
    assert len(refused) == 1 and "200000 changed entries" in refused[0]
    assert sandbox.fetches == [] and tree_of(host) == before


def test_the_limit_is_the_cap_in_4_kib_blocks(host: Path, nothing_made: Callable[[], None]) -> None:
    mirror, sandbox = started(host, 1)
    limit = 1024 * 1024 // 4096
    sandbox.listing = listing([*KEPT, *[(f"d{n}", "d", 0, "") for n in range(limit + 1)]])
    assert len(mirror.after_command(sandbox.run)) == 1
    nothing_made()
    sandbox.listing = listing([*KEPT, *[(f"d{n}", "d", 0, "") for n in range(limit)]])
    assert mirror.after_command(sandbox.run) == []
    assert sum(1 for p in host.iterdir() if p.name.startswith("d")) == limit


def test_directories_and_links_take_their_blocks_from_what_files_may_bring(host: Path) -> None:
    """One budget: 200 new directories (800 KiB) leave 224 KiB of a 1 MiB cap for the files."""
    mirror, sandbox = started(host, 1)
    data = b"w" * (300 * 1024)
    dirs = [(f"d{n:03}", "d", 0, "") for n in range(200)]
    sandbox.listing = listing([*KEPT, *dirs, ("big", "f", len(data), "")])
    sandbox.archive = archive(plain_member("big", data))
    refused = mirror.after_command(sandbox.run)
    assert [reason.split(":")[0] for reason in refused] == ["big"]
    assert not (host / "big").exists() and (host / "d199").is_dir()


# -- 3. an ordinary pull-back within the cap lands as before --------------------------------------------


def test_an_ordinary_pull_back_within_the_cap_lands(host: Path) -> None:
    mirror, sandbox = started(host, 1)
    entries: list[tuple[str, str, int, str]] = [("f.txt", "f", 4, ""), ("keep", "d", 0, "")]
    members = []
    for d in range(20):
        entries.append((f"src{d:02}", "d", 0, ""))
        entries.append((f"src{d:02}/up", "l", 0, "../f.txt"))
        for f in range(5):
            data = f"{d}-{f}\n".encode() * 100
            entries.append((f"src{d:02}/m{f}.py", "f", len(data), ""))
            members.append(plain_member(f"src{d:02}/m{f}.py", data))
    sandbox.listing = listing(entries)
    sandbox.archive = archive(*members)
    assert mirror.after_command(sandbox.run) == []
    assert (host / "src07" / "m3.py").read_bytes() == b"7-3\n" * 100
    assert os.readlink(host / "src19" / "up") == "../f.txt"
    assert not (host / "keep" / "k.txt").exists()  # removed in the sandbox: removed on the host
    assert sum(1 for _ in host.rglob("*")) == 2 + 20 * 7
