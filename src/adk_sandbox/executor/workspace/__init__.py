"""How a host workspace reaches a sandbox: one mechanism for every container backend, below them all.

A session hands its host workspace to its sandbox through a :class:`WorkspaceTransport`, asked at four
moments (started, before and after each command, closing). Two transports:

* :class:`BindWorkspace` (``"bind"``): the host directory bind-mounted at its own path; nothing to copy.
* :class:`MirrorWorkspace` (``"mirror"``): a size-capped copy at the same path in the sandbox, pushed in
  and pulled back over the session's own command channel; the host copy stays the truth.

``"auto"`` tries the bind mount and remembers per engine and workspace when it had to mirror
(:data:`AUTO_CHOICES`). :class:`SyncedWorkspace` drives a transport over a session's channel (Docker's and
Kubernetes' sessions alike). ``session(copy_of=...)`` fills a fresh host copy with :func:`copy_tree`.

The modules, by job:

* :mod:`.protocol`: the seam (:class:`WorkspaceTransport`, :data:`Run`, :class:`RunResult`);
* :mod:`.bind`, :mod:`.mirror`, :mod:`.auto`: the transports and the ``"auto"`` choice;
* :mod:`.scan`: the host scan (:class:`Entry`, ``host_keys``, ``scan_host``), walked by descriptor;
* :mod:`.pullback`: the host-tree writer (what the sandbox gives back is hostile input);
* :mod:`.racy`: when a host file's stat can be trusted;
* :mod:`.copies`: workspace copies on the host, and reaping those of dead owners;
* :mod:`.synced`: the synced-workspace runner;
* :mod:`.beneath`: descriptor-safe path resolution (also the file tools', :mod:`adk_sandbox.devtools`).

Nothing here imports a backend, docker-py or :mod:`adk_sandbox.devtools` (``tests/unit/test_layering.py``):
what a backend knows (how to run a command in its sandbox, where its engine is) comes in as arguments. One
exception, for now: :mod:`.synced` takes the command transport's types from Docker's ``_transport`` until
they move to the engine-neutral channel package (the import is marked ``MERGE``).
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
