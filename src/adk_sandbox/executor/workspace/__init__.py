"""How a host workspace reaches a sandbox: one mechanism for every container backend, below them all.

A :class:`WorkspaceTransport` (:class:`BindWorkspace`, :class:`MirrorWorkspace`, or ``"auto"`` via
:data:`AUTO_CHOICES`) driven by :class:`SyncedWorkspace`; :func:`copy_tree` and :func:`reap_copies` for
workspace copies. Nothing here imports a backend, docker-py or :mod:`adk_sandbox.devtools`. Depth:
docs/docker/workspace-transport.md; module map: docs/DOCKER.md, "Code".
"""

from adk_sandbox.executor.workspace.auto import AUTO_CHOICES, AutoChoices
from adk_sandbox.executor.workspace.bind import BindWorkspace
from adk_sandbox.executor.workspace.copies import copies_dir, copy_prefix, copy_tree, reap_copies
from adk_sandbox.executor.workspace.mirror import DEFAULT_MIRROR_MB, MirrorWorkspace
from adk_sandbox.executor.workspace.protocol import WORKSPACE_TRANSPORTS, Run, RunResult, WorkspaceTransport
from adk_sandbox.executor.workspace.scan import Entry, scan_host
from adk_sandbox.executor.workspace.synced import SyncChannel, SyncedWorkspace, refusal_note

__all__ = [
    "AUTO_CHOICES",
    "DEFAULT_MIRROR_MB",
    "WORKSPACE_TRANSPORTS",
    "AutoChoices",
    "BindWorkspace",
    "Entry",
    "MirrorWorkspace",
    "Run",
    "RunResult",
    "SyncChannel",
    "SyncedWorkspace",
    "WorkspaceTransport",
    "copies_dir",
    "copy_prefix",
    "copy_tree",
    "reap_copies",
    "refusal_note",
    "scan_host",
]
