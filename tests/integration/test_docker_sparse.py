"""Sparse files stay sparse in every copy a session's files go through (docs/sparse.md).

A sparse file's holes cost nothing where it lives; a copy that writes them out (a host copy into
``/dev/shm``, a tar of its apparent size held in memory, a push through the channel) makes one truncate in
the sandbox cost the host its full apparent size, once per snapshot and again per fork: a way to exhaust
the host. Each test watches what the host really spends (memory, ``/dev/shm``, the store's disk) and checks
the file is still sparse (``stat -c %b``) wherever it lands, at its apparent size (``stat -c %s``).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from adk_sandbox.executor import ExecRequest, ExecResult, Language
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from adk_sandbox.executor.snapshots import SnapshotStore
from adk_sandbox.executor.workspace.copies import copy_tree
from tests.conftest import require

pytestmark = pytest.mark.docker

MIB = 1024 * 1024
WORKSPACE_FILE = 768 * MIB
INSIDE_FILE = 900 * MIB
#: What snapshot + fork may cost the host in all (the parent's and the fork's own sandboxes aside).
GROWTH_LIMIT = 64 * MIB


def run(session: DockerSession, code: str) -> ExecResult:
    result = session.execute(ExecRequest(language=Language.COMMAND, code=code, timeout=60))
    assert result.exit_code == 0, result
    return result


def sizes_inside(session: DockerSession, *paths: str) -> dict[str, tuple[int, int]]:
    """Apparent size and allocated bytes (``%b`` blocks of ``%B`` bytes) of each path, read inside."""
    quoted = " ".join(f'"{path}"' for path in paths)
    lines = run(session, f"stat -c '%n|%s|%b|%B' {quoted}").stdout.splitlines()
    found = {}
    for line in lines:
        name, size, blocks, unit = line.rsplit("|", 3)
        found[name] = (int(size), int(blocks) * int(unit))
    return found


def allocated(path: str | Path) -> int:
    return os.stat(path).st_blocks * 512


class HostCost:
    """The host's spending while it runs: MemAvailable's lowest, /dev/shm's and the store disk's highest.

    Sampled every 10 ms in a thread, so memory held for a moment (an archive in memory) counts, not only
    what is left at the end.
    """

    def __init__(self, store: str) -> None:
        self.store = store
        self._stop = threading.Event()
        self._base = self._sample()
        self._worst = self._base
        self._thread = threading.Thread(target=self._watch, daemon=True)

    @staticmethod
    def _available() -> int:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no MemAvailable")

    @staticmethod
    def _used(path: str) -> int:
        info = os.statvfs(path)
        return (info.f_blocks - info.f_bfree) * info.f_frsize

    def _sample(self) -> tuple[int, int, int]:
        return (-self._available(), self._used("/dev/shm"), self._used(self.store))

    def _watch(self) -> None:
        while not self._stop.wait(0.01):
            now = self._sample()
            self._worst = tuple(max(a, b) for a, b in zip(self._worst, now, strict=True))  # type: ignore[assignment]

    def __enter__(self) -> HostCost:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        now = self._sample()
        self._worst = tuple(max(a, b) for a, b in zip(self._worst, now, strict=True))  # type: ignore[assignment]

    @property
    def growth(self) -> dict[str, int]:
        """Bytes each measure grew by at its worst."""
        names = ("memory", "/dev/shm", "store disk")
        return {name: worst - base for name, worst, base in zip(names, self._worst, self._base, strict=True)}


@pytest.fixture(scope="module")
def backend() -> Iterator[DockerBackend]:
    try:
        made = DockerBackend()
    except Exception as exc:
        require(False, f"the Docker engine is not usable here: {exc}")
        raise
    yield made
    made.close()


@pytest.fixture(scope="module")
def mirror_backend() -> Iterator[DockerBackend]:
    with DockerBackend(workspace_transport="mirror") as made:
        yield made


@pytest.fixture
def sparse_workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    os.chown(root, 1000, 1000)
    big = root / "big"
    with open(big, "wb") as handle:
        handle.truncate(WORKSPACE_FILE)
    os.chown(big, 1000, 1000)
    (root / "small.txt").write_text("hello\n")
    os.chown(root / "small.txt", 1000, 1000)
    return root


def test_snapshot_and_fork_of_sparse_files_cost_the_host_almost_nothing(
    backend: DockerBackend, sparse_workspace: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The naive copies: /dev/shm and the store get the holes written out, and the push holds them."""
    # The default store's tiers: owned snapshots (a fork's) in /dev/shm, detached ones on disk.
    memory = f"/dev/shm/adk-sandbox-sparse-test-{os.getpid()}"
    store = SnapshotStore(str(tmp_path / "store"), memory_root=memory)
    os.makedirs(store.root, exist_ok=True)
    request.addfinalizer(lambda: shutil.rmtree(memory, ignore_errors=True))
    with backend.session(sparse_workspace) as parent:
        parent.snapshot_store = store
        run(parent, f'truncate -s {INSIDE_FILE} /tmp/big && truncate -s {INSIDE_FILE} "$HOME/big"')
        home = run(parent, 'printf %s "$HOME"').stdout
        paths = ("/tmp/big", f"{home}/big", f"{sparse_workspace}/big")
        with HostCost(str(store.root)) as cost:
            snap = parent.snapshot(name="sparse")
            with parent.fork() as child:
                seen = sizes_inside(child, *paths)
        growth = cost.growth
        print(f"host growth across snapshot + fork: {growth}")
        assert seen[paths[0]][0] == INSIDE_FILE and seen[paths[1]][0] == INSIDE_FILE
        assert seen[paths[2]][0] == WORKSPACE_FILE
        assert all(cost_ < MIB for _, cost_ in seen.values()), seen  # still sparse inside the fork
        assert all(value < GROWTH_LIMIT for value in growth.values()), growth
        assert snap.size_bytes < MIB
        assert allocated(os.path.join(snap.workspace_dir, "big")) == 0
        store.remove(snap.id)


def test_the_mirror_keeps_sparse_files_sparse_both_ways(
    mirror_backend: DockerBackend, sparse_workspace: Path
) -> None:
    """The naive push: Python's tarfile sends the holes; the naive pull-back writes them out."""
    with mirror_backend.session(sparse_workspace) as session:
        assert session.workspace_transport == "mirror"
        inside = sizes_inside(session, f"{sparse_workspace}/big")[f"{sparse_workspace}/big"]
        assert inside[0] == WORKSPACE_FILE and inside[1] < MIB
        # Back: a new sparse file with data at its start, middle and end, and a trailing hole.
        run(
            session,
            "truncate -s 600M made && printf head | dd of=made conv=notrunc status=none && "
            "printf middle | dd of=made bs=1M seek=300 conv=notrunc status=none && "
            "printf tail | dd of=made bs=1M seek=599 conv=notrunc status=none && "
            "truncate -s 400M big",
        )
    made = sparse_workspace / "made"
    assert made.stat().st_size == 600 * MIB and allocated(made) < MIB
    with open(made, "rb") as handle:
        assert handle.read(4) == b"head"
        handle.seek(300 * MIB)
        assert handle.read(6) == b"middle"
        handle.seek(599 * MIB)
        assert handle.read(4) == b"tail"
        handle.seek(100 * MIB)
        assert handle.read(4096) == bytes(4096)
    big = sparse_workspace / "big"
    assert big.stat().st_size == 400 * MIB and allocated(big) == 0


def test_copy_of_a_tree_with_a_sparse_file_keeps_it_sparse(
    mirror_backend: DockerBackend, sparse_workspace: Path, tmp_path: Path
) -> None:
    """The naive host copy (copy_file_range over the whole file): tmpfs writes every hole out."""
    dest = tmp_path / "copy"
    dest.mkdir()
    before = time.monotonic()
    assert copy_tree(str(sparse_workspace), str(dest), 64 * MIB) == []
    assert time.monotonic() - before < 5
    assert (dest / "big").stat().st_size == WORKSPACE_FILE and allocated(dest / "big") == 0
    with mirror_backend.session(copy_of=sparse_workspace) as session:
        assert session.workspace is not None
        assert allocated(os.path.join(session.workspace, "big")) == 0
        inside = sizes_inside(session, f"{session.workspace}/big")[f"{session.workspace}/big"]
        assert inside[0] == WORKSPACE_FILE and inside[1] < MIB
