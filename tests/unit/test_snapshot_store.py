"""Snapshots on disk, host-only (no engine): the record, the store, the reaper's rule and the command line.

A snapshot must outlive the object and the process that took it, be found by id or name, be removed with
nothing left (and never half-read), and be reaped exactly when a leaked container would be: its expiry
passed, or its owner process is gone (docs/snapshots.md, "Lifecycle").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adk_sandbox.executor import InvalidRequestError, _owner
from adk_sandbox.executor.cli import main
from adk_sandbox.executor.errors import SandboxFailedError
from adk_sandbox.executor.snapshots import Snapshot, SnapshotStore
from adk_sandbox.executor.snapshots.model import SNAPSHOT_LABEL, options_from
from adk_sandbox.executor.snapshots.store import new_id


def record(**changes: object) -> Snapshot:
    """A snapshot record as a session would make it, owned by this process unless changed."""
    snapshot_id = str(changes.pop("id", new_id()))
    now = time.time()
    owner_keys = (
        _owner.OWNER_PID,
        _owner.OWNER_START,
        _owner.OWNER_BOOT,
        _owner.OWNER_HOST,
        _owner.OWNER_PIDNS,
    )
    owner = {key: value for key, value in _owner.owner_labels("x", 0).items() if key in owner_keys}
    values: dict[str, object] = {
        "id": snapshot_id,
        "name": snapshot_id,
        "created": now,
        "expires": int(now) + 3600,
        "owner": owner,
        "image": "adk-sandbox/base:latest",
        "image_id": "sha256:" + "0" * 64,
        "profile": "hardened",
        "workspace": "/work/repo",
        "tmpfs": ("/tmp",),
        **changes,
    }
    return Snapshot.model_validate(values)


def put(store: SnapshotStore, snapshot: Snapshot) -> Snapshot:
    """Write ``snapshot`` into ``store`` as a session does: a partial directory, then committed."""
    partial = store.begin(snapshot.id)
    os.mkdir(os.path.join(partial, "workspace"))
    Path(partial, "workspace", "f.txt").write_text("data\n")
    os.mkdir(os.path.join(partial, "tmpfs"))
    Path(partial, "tmpfs", "0.tar").write_bytes(b"\0" * 1024)
    return store.commit(partial, snapshot)


@pytest.fixture
def store(tmp_path: Path) -> SnapshotStore:
    return SnapshotStore(tmp_path / "snapshots")


def test_options_are_checked_before_anything() -> None:
    assert options_from(name="best-1", ttl_seconds=60).name == "best-1"
    for bad in (
        {"name": "../up"},
        {"name": "a" * 65},
        {"ttl_seconds": 0},
        {"ttl_seconds": 10**9},
        {"max_mb": 0},
        {"labels": {"io.adk-sandbox.owner-pid": "1"}},  # the reaper trusts these
        {"labels": {"IO.ADK-SANDBOX.expires": "1"}},
        {"labels": {"bad key": "x"}},
        {"unknown": True},
    ):
        with pytest.raises(InvalidRequestError, match="invalid snapshot options"):
            options_from(**bad)


def test_a_committed_snapshot_is_found_by_id_and_name_and_readable(store: SnapshotStore) -> None:
    taken = put(store, record(name="prepared"))
    assert store.get(taken.id) == taken
    assert store.get("prepared") == taken
    assert [s.id for s in store.list()] == [taken.id]
    assert Path(taken.workspace_dir, "f.txt").read_text() == "data\n"
    assert os.stat(store.root).st_mode & 0o777 == 0o700
    assert oct(os.stat(taken.path).st_mode & 0o777) == oct(0o700)
    with pytest.raises(InvalidRequestError, match="no snapshot"):
        store.get("missing")


def test_a_partial_snapshot_is_never_listed_and_abort_leaves_nothing(store: SnapshotStore) -> None:
    partial = store.begin(new_id())
    Path(partial, "half").write_text("x")
    assert store.list() == []
    store.abort(partial)
    assert os.listdir(store.root) == []


def test_remove_leaves_nothing_and_removes_the_root_image_first(store: SnapshotStore) -> None:
    plain = put(store, record())
    store.remove(plain.id)
    assert os.listdir(store.root) == []
    with_image = put(store, record(root_image="sha256:" + "1" * 64))
    with pytest.raises(InvalidRequestError, match="root image"):
        store.remove(with_image.id)  # its image would be left behind
    assert store.get(with_image.id) == with_image
    removed: list[str] = []
    store.remove(with_image.id, removed.append)
    assert removed == [with_image.root_image]
    assert os.listdir(store.root) == []


def test_a_failed_image_removal_keeps_the_snapshot(store: SnapshotStore) -> None:
    taken = put(store, record(root_image="sha256:" + "2" * 64))

    def refuse(image: str) -> None:
        raise InvalidRequestError("in use")

    with pytest.raises(InvalidRequestError):
        store.remove(taken.id, refuse)
    assert store.get(taken.id) == taken


def test_reap_removes_expired_and_orphaned_snapshots_only(store: SnapshotStore) -> None:
    mine = put(store, record())
    detached = put(store, record(owner={}))
    expired = put(store, record(expires=int(time.time()) - 1))
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    dead_pid = dead.stdout.strip()
    orphaned = put(store, record(owner={**mine.owner, _owner.OWNER_PID: dead_pid}))
    elsewhere = put(
        store, record(owner={**mine.owner, _owner.OWNER_HOST: "another-host", _owner.OWNER_PID: "1"})
    )
    removed = store.reap()
    assert sorted(line.split()[0] for line in removed) == sorted([expired.id, orphaned.id])
    assert {s.id for s in store.list()} == {mine.id, detached.id, elsewhere.id}
    # A detached one only expires; an owned one also when its owner is gone.
    assert detached.leak_reason(time.time() + 7200) == "its expiry time has passed"
    assert "owner process" in (orphaned.leak_reason() or "")


def test_reap_leaves_a_snapshot_with_a_root_image_to_a_reaper_with_an_engine(store: SnapshotStore) -> None:
    taken = put(store, record(root_image="sha256:" + "3" * 64, expires=int(time.time()) - 1))
    assert store.reap() == []
    removed: list[str] = []
    assert len(store.reap(removed.append)) == 1
    assert removed == [taken.root_image]


def test_partials_of_a_killed_owner_are_reaped_and_live_ones_kept(store: SnapshotStore) -> None:
    """A process killed while it wrote a snapshot leaves a partial directory named by its owner."""
    script = (
        "import sys; from adk_sandbox.executor.snapshots.store import SnapshotStore, new_id;"
        f"print(SnapshotStore({str(store.root)!r}).begin(new_id()))"
    )
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    left = child.stdout.strip()
    live = store.begin(new_id())
    assert os.path.isdir(left)
    removed = store.reap()
    assert removed == [f"{os.path.basename(left)}: a partial snapshot whose owner is gone"]
    assert not os.path.exists(left)
    assert os.path.isdir(live)


def test_an_unreadable_or_forged_record_is_skipped(store: SnapshotStore) -> None:
    good = put(store, record())
    bad = store.begin(new_id())
    Path(bad, "snapshot.json").write_text("{not json")
    os.rename(bad, store.root / new_id())
    other = record()
    forged = put(store, other)
    os.rename(forged.path, store.root / new_id())  # a record naming another id than its directory
    assert [s.id for s in store.list()] == [good.id]


def test_a_store_that_is_a_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(SandboxFailedError, match="not a directory of this user"):
        SnapshotStore(tmp_path / "link").begin(new_id())


def test_engine_labels_mark_the_owner_or_none(store: SnapshotStore) -> None:
    owned = record(labels={"org.example.run": "7"})
    labels = owned.engine_labels()
    assert labels[SNAPSHOT_LABEL] == owned.id and labels[_owner.PROJECT_LABEL] == "adk-sandbox"
    assert labels[_owner.OWNER_PID] == str(os.getpid()) and labels["org.example.run"] == "7"
    # A detached snapshot's image must not inherit the container's owner: the labels are blanked.
    assert record(owner={}).engine_labels()[_owner.OWNER_PID] == ""


def test_the_command_line_lists_and_removes(store: SnapshotStore, capsys: pytest.CaptureFixture[str]) -> None:
    taken = put(store, record(name="prepared"))
    assert main(["snapshots", "--store", str(store.root), "ls"]) == 0
    assert taken.id in capsys.readouterr().out
    assert main(["snapshots", "--store", str(store.root), "ls", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["name"] == "prepared"
    assert main(["snapshots", "--store", str(store.root), "rm", "prepared", "missing"]) == 2
    assert store.get(taken.id) == taken  # every name is checked before anything is removed
    assert main(["snapshots", "--store", str(store.root), "rm", "prepared"]) == 0
    assert os.listdir(store.root) == []


def test_a_pools_fixed_path_is_checked() -> None:
    """``PoolConfig(path=...)`` puts every member's workspace copy at one path inside (forks come from it)."""
    from pydantic import ValidationError  # noqa: PLC0415

    from adk_sandbox.executor.backends.docker import PoolConfig  # noqa: PLC0415

    assert PoolConfig(size=2, workspace="mirror", path="/work/repo").path == "/work/repo"
    for bad in ("relative", "/", "/work/../etc", "/tmp/repo", "/home/sandbox", "/proc/x", "/work/repo/"):
        with pytest.raises(ValidationError):
            PoolConfig(size=2, workspace="mirror", path=bad)
    with pytest.raises(ValidationError, match="workspace='mirror'"):
        PoolConfig(size=2, path="/work/repo")


def test_a_two_tier_store_keeps_owned_snapshots_in_memory_and_detached_ones_on_disk(tmp_path: Path) -> None:
    """The default store's split (docs/benchmarks/issue-24-forks.md, "Where the time went"): an owned
    one is built and kept in the memory tier, a detached one on disk; both are listed, found, removed and
    reaped as one store. Catches a store that still writes every snapshot to disk, or loses sight of one
    tier."""
    store = SnapshotStore(tmp_path / "disk", memory_root=tmp_path / "memory")
    owned, detached = record(), record(owner={})
    for snapshot, durable in ((owned, False), (detached, True)):
        partial = store.begin(snapshot.id, durable=durable)
        store.commit(partial, snapshot)
    assert os.listdir(tmp_path / "memory") == [owned.id] and os.listdir(tmp_path / "disk") == [detached.id]
    assert {s.id for s in store.list()} == {owned.id, detached.id}
    assert store.get(owned.id).path == str(tmp_path / "memory" / owned.id)
    gone = record(id=new_id(), expires=int(time.time()) - 1)
    store.commit(store.begin(gone.id, durable=False), gone)
    assert [line.split()[0] for line in store.reap()] == [gone.id]
    store.remove(owned.id)
    store.remove(detached.id)
    assert os.listdir(tmp_path / "memory") == [] and os.listdir(tmp_path / "disk") == []
    assert SnapshotStore(tmp_path / "only").memory_root is None  # a store given a root keeps all there
