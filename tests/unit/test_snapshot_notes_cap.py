"""A snapshot's ``skipped`` notes are capped, and a record the store cannot read is still reaped, host-only.

A sandbox decides how many notes a snapshot gets (one per link leading out of its workspace) and how long
they are (a link's target, a line of its tar's complaints). Before the cap, 12,000 outward links made a
record over the 1 MiB the store reads of one: ``get`` and ``list`` failed on it, and the reaper, which only
sees what ``list`` returns, left its directory forever (docs/snapshots.md, "Lifecycle").
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from adk_sandbox.executor.snapshots import Snapshot, SnapshotStore
from adk_sandbox.executor.snapshots.copy import copy_workspace
from adk_sandbox.executor.snapshots.model import MAX_TTL_SECONDS, new_record, options_from
from adk_sandbox.executor.snapshots.store import RECORD, new_id

MIB = 1024 * 1024
#: The documented cap (docs/snapshots.md): at most 100 notes, each at most 300 characters.
NOTES, NOTE_CHARS = 100, 300
#: Past any snapshot's expiry, whatever its record said.
LATER = MAX_TTL_SECONDS + 60


@pytest.fixture
def store(tmp_path: Path) -> SnapshotStore:
    return SnapshotStore(tmp_path / "snapshots")


def _take(store: SnapshotStore, workspace: Path | None = None, **fields: object) -> Snapshot:
    """Take a snapshot as an engine does: ``store.take`` with a build that copies ``workspace`` in."""
    snapshot_id = new_id()

    def build(partial: str) -> Snapshot:
        report = None
        if workspace is not None:
            target = os.path.join(partial, "workspace")
            os.mkdir(target, 0o700)
            report = copy_workspace(str(workspace), target, 64 * MIB, "max_mb")
        return new_record(
            options_from(),
            snapshot_id,
            time.time(),
            image="adk-sandbox/base:latest",
            image_id="sha256:" + "0" * 64,
            profile="hardened",
            workspace="/work/repo",
            method=report.method if report is not None else "none",
            size_bytes=report.size_bytes if report is not None else 0,
            skipped=report.skipped if report is not None else (),
            **fields,
        )

    return store.take(snapshot_id, build)


def _check_capped(notes: tuple[str, ...], total: int) -> None:
    assert len(notes) <= NOTES
    assert all(len(note) <= NOTE_CHARS for note in notes)
    assert notes[-1] == f"… and {total - (NOTES - 1)} more"


def test_12000_outward_links_leave_a_record_the_store_reads(store: SnapshotStore, tmp_path: Path) -> None:
    """The audit's attack: a sandbox plants 12,000 links leading out of its bound workspace, then the user
    snapshots. Fails the old code: the record (~3 MiB of notes) was cut at 1 MiB when read, so ``get`` said
    "no snapshot" and ``list`` left it out (and the reaper with it)."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "kept.txt").write_text("data\n")
    target = "/" + "x" * 200  # outside the workspace; a longer target only makes each note longer
    for index in range(12_000):
        (workspace / f"out-{index:05}").symlink_to(target)
    taken = _take(store, workspace)
    assert store.get(taken.id) == taken
    assert [s.id for s in store.list()] == [taken.id]
    _check_capped(taken.skipped, 12_000)
    assert all(note.startswith("out-") for note in taken.skipped[:-1])
    assert os.path.getsize(os.path.join(taken.path, RECORD)) < 64 * 1024
    assert Path(taken.workspace_dir, "kept.txt").read_text() == "data\n"
    assert not any(name.startswith("out-") for name in os.listdir(taken.workspace_dir))


def test_notes_added_after_the_record_is_built_are_capped_too(store: SnapshotStore) -> None:
    """A gVisor task snapshot appends its root archive's tar complaints with ``model_copy(update=...)``,
    which skips the model's checks: the store validates what it writes. Fails the old code: 20 tar lines of
    100,000 characters each made a 2 MB record that no longer read back."""
    snapshot_id = new_id()

    def build(partial: str) -> Snapshot:
        record = new_record(
            options_from(), snapshot_id, time.time(), image="i", image_id="sha256:1", profile="task"
        )
        lines = tuple(f"/: tar: {'y' * 100_000}: Cannot open: Permission denied" for _ in range(20))
        return record.model_copy(update={"root_archive": True, "skipped": lines})

    taken = store.take(snapshot_id, build)
    assert store.get(taken.id) == taken
    assert len(taken.skipped) == 20
    assert all(len(note) == NOTE_CHARS and note.endswith("…") for note in taken.skipped)


def test_the_cap_holds_once_and_a_record_read_back_is_not_cut_again() -> None:
    from adk_sandbox.executor.snapshots.model import MAX_NOTE_CHARS, MAX_NOTES, cap_notes  # noqa: PLC0415

    assert (MAX_NOTES, MAX_NOTE_CHARS) == (NOTES, NOTE_CHARS)
    few = ("a: one", "b: " + "z" * 1000)
    assert cap_notes(few) == ("a: one", "b: " + "z" * (NOTE_CHARS - 4) + "…")
    assert cap_notes(f"n{i}" for i in range(NOTES)) == tuple(f"n{i}" for i in range(NOTES))  # no summary
    capped = cap_notes(f"n{i}" for i in range(NOTES + 1))
    _check_capped(capped, NOTES + 1)
    assert cap_notes(capped) == capped and cap_notes(cap_notes(few)) == cap_notes(few)


def _too_big(store: SnapshotStore) -> Snapshot:
    """A committed snapshot whose record was then made over 1 MiB (as the old code wrote one)."""
    taken = _take(store)
    record = json.loads(taken.model_dump_json())
    record["skipped"] = [f"out-{index:05}: a symbolic link to '/{'x' * 200}'" for index in range(12_000)]
    Path(taken.path, RECORD).write_text(json.dumps(record))
    assert os.path.getsize(os.path.join(taken.path, RECORD)) > MIB
    return taken


def test_a_record_too_big_to_read_is_still_reaped_once_past_any_expiry(store: SnapshotStore) -> None:
    """Fails the old code: the reaper only saw what ``list`` read, so the directory stayed forever."""
    big = _too_big(store)
    ordinary = _take(store)  # expires in a day, by its record
    assert [s.id for s in store.list()] == [ordinary.id]
    assert store.reap() == []  # no owner or expiry to go by: only its age, and it is new
    two_days = time.time() + 2 * 24 * 3600
    assert [line.split()[0] for line in store.reap(now=two_days)] == [ordinary.id]
    assert os.listdir(store.root) == [big.id]
    assert store.reap(now=time.time() + MAX_TTL_SECONDS - 3600) == []
    removed = store.reap(now=time.time() + LATER)
    assert removed == [f"{big.id}: a snapshot whose record is unreadable, older than any expiry"]
    assert os.listdir(store.root) == []


def test_an_unreadable_or_forged_record_never_reaches_outside_the_store(
    store: SnapshotStore, tmp_path: Path
) -> None:
    """Only real directories named like an id in the store's own tiers go: a link named like one is left
    (and what it leads to), a forged record (naming another snapshot) removes only its own directory, and a
    record pointing elsewhere is never followed. The old code removed none of them (nor the unreadable)."""
    outside = tmp_path / "outside"
    (outside / "victim").mkdir(parents=True)
    (outside / "victim" / "keep.txt").write_text("host file\n")
    store.root.mkdir()
    link = store.root / new_id()
    link.symlink_to(outside / "victim")
    empty = store.root / new_id()
    empty.mkdir()  # a directory without a record
    forged = _take(store)
    renamed = store.root / new_id()
    os.rename(forged.path, renamed)  # its record names another id (its old one)
    broken = store.root / new_id()
    broken.mkdir()
    (broken / RECORD).write_text(json.dumps({"id": broken.name, "path": str(outside / "victim")}))
    assert store.list() == []
    removed = store.reap(now=time.time() + LATER)
    assert sorted(line.split(":")[0] for line in removed) == sorted([empty.name, renamed.name, broken.name])
    assert os.listdir(store.root) == [link.name] and os.path.islink(link)
    assert (outside / "victim" / "keep.txt").read_text() == "host file\n"
