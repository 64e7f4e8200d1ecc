"""A snapshot store whose memory tier (or both tiers) runs out of space: real tiny tmpfs mounts (root).

The memory tier is a tmpfs of 1 MiB mounted for the test; a snapshot of 2 MiB does not fit it. Decided
(docs/snapshots.md, "Lifecycle"): an owned snapshot is then taken again, once, on the disk tier; where the
disk is full too it is refused with ``PolicyNotEnforceableError``; never a raw ``OSError``, never a snapshot
with the files that did not fit silently left out, and nothing left behind in either tier.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from adk_sandbox.executor.errors import PolicyNotEnforceableError
from adk_sandbox.executor.snapshots import Snapshot, SnapshotStore
from adk_sandbox.executor.snapshots.copy import copy_workspace
from adk_sandbox.executor.snapshots.store import new_id
from adk_sandbox.executor.workspace.copies import HostCopyFullError
from tests.conftest import require
from tests.unit.test_snapshot_store import record


def _mount_tiny(where: Path) -> bool:
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


@pytest.fixture
def tiny(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Makes 1 MiB tmpfs mounts below the test's directory (root only); unmounted after the test."""
    require(os.geteuid() == 0, "a tiny tmpfs is mounted for this test, which needs root")
    made: list[Path] = []

    def mount(name: str) -> Path:
        where = tmp_path / name
        require(_mount_tiny(where), f"mounting a tmpfs at {where} failed")
        made.append(where)
        return where

    yield mount
    for where in made:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A 2 MiB workspace: more than a tiny tier holds."""
    root = tmp_path / "workspace-source"
    root.mkdir()
    for index in range(8):
        (root / f"blob{index}").write_bytes(os.urandom(256 * 1024))
    return root


def builder(source: Path) -> tuple[str, Callable[[str], Snapshot]]:
    """A snapshot id, and what a session's snapshot does: its workspace copied in, then the record."""
    snapshot = record(id=new_id())

    def build(partial: str) -> Snapshot:
        os.mkdir(os.path.join(partial, "workspace"), 0o700)
        copy_workspace(str(source), os.path.join(partial, "workspace"), 64 << 20, "max_mb")
        return snapshot

    return snapshot.id, build


def leftovers(*roots: Path) -> list[str]:
    return [f"{root}/{name}" for root in roots if root.exists() for name in os.listdir(root)]


def test_a_full_memory_tier_takes_the_snapshot_on_disk(
    tiny: Callable[[str], Path], workspace: Path, tmp_path: Path
) -> None:
    """Catches a copy that skips the files that did not fit (the snapshot would be "taken" in memory with
    files missing) and a store that lets the raw ENOSPC through."""
    memory, disk = tiny("memory") / "snapshots", tmp_path / "disk"
    store = SnapshotStore(disk, memory_root=memory)
    snapshot_id, build = builder(workspace)
    taken = store.take(snapshot_id, build, durable=False)
    assert Path(taken.path).parent == disk
    assert sorted(os.listdir(taken.workspace_dir)) == [f"blob{i}" for i in range(8)]
    assert leftovers(memory) == []  # the partial snapshot of the memory tier is gone
    assert [s.id for s in store.list()] == [taken.id]


def test_a_full_disk_too_refuses_the_snapshot_and_leaves_nothing(
    tiny: Callable[[str], Path], workspace: Path, tmp_path: Path
) -> None:
    """Catches a raw OSError, and a half-written snapshot left in either tier."""
    memory, disk = tiny("memory") / "snapshots", tiny("disk") / "snapshots"
    store = SnapshotStore(disk, memory_root=memory)
    snapshot_id, build = builder(workspace)
    with pytest.raises(PolicyNotEnforceableError, match=r"ran out of space in .*memory.* and then in"):
        store.take(snapshot_id, build, durable=False)
    with pytest.raises(PolicyNotEnforceableError, match="ran out of space"):
        store.take(snapshot_id, build, durable=True)  # detached: the disk only, no retry
    assert leftovers(memory, disk) == [] and store.list() == []


def test_a_copy_into_a_full_file_system_is_refused_not_left_with_gaps(
    tiny: Callable[[str], Path], workspace: Path
) -> None:
    """Catches the walk's per-file skip swallowing ENOSPC: the copy would return as if complete, with the
    files that did not fit listed as merely "left out" (a fork's /tmp or workspace silently missing files)."""
    with pytest.raises(HostCopyFullError, match="ran out of space"):
        copy_workspace(str(workspace), str(tiny("full")), 64 << 20, "max_mb")
