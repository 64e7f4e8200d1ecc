"""Snapshots of sessions: a session's files at one moment, on disk, and sessions started from them.

``session.snapshot()`` takes one (:class:`Snapshot`), ``backend.session(snapshot=snap)`` starts a session
from it and ``session.fork()`` does both; :class:`SnapshotStore` lists, reads, removes and reaps them
(``adk-sandbox snapshots ls|rm|reap``). See docs/snapshots.md.
"""

from adk_sandbox.executor.snapshots.copy import CopyReport, copy_workspace
from adk_sandbox.executor.snapshots.model import (
    DEFAULT_MAX_MB,
    DEFAULT_TTL_SECONDS,
    SNAPSHOT_LABEL,
    CopyMethod,
    Snapshot,
    SnapshotOptions,
)
from adk_sandbox.executor.snapshots.store import SnapshotStore

__all__ = [
    "DEFAULT_MAX_MB",
    "DEFAULT_TTL_SECONDS",
    "SNAPSHOT_LABEL",
    "CopyMethod",
    "CopyReport",
    "Snapshot",
    "SnapshotOptions",
    "SnapshotStore",
    "copy_workspace",
]
