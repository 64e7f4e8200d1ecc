"""Owned snapshots go when their owner goes: removed at this process's exit, by any path but SIGKILL.

An owned snapshot (``session.snapshot()`` without ``detached=True``, every ``fork()``'s) lives in the
memory tier (``/dev/shm``): left behind by a process that ended, it held host memory until the next
backend's reaper ran, which may be never on a CI runner. So every owned snapshot a
:class:`~adk_sandbox.executor.snapshots.store.SnapshotStore` commits is registered here, with the function
that removes its root image when it has one, and :func:`remove_all` removes what is still registered:

* at **interpreter exit** (``atexit``): a normal end, ``sys.exit``, an uncaught exception, Ctrl-C
  (``KeyboardInterrupt``);
* on **SIGTERM and SIGHUP**, when the process left them at their default (``SIG_DFL``: the process would
  die without running ``atexit``): a handler installed with the first registration removes the snapshots,
  restores the default and raises the signal again, so the process still ends by that signal, with its
  usual status. A handler the application installed is never replaced (its shutdown path usually ends in
  ``sys.exit``, which runs ``atexit``); a process that is not on its main thread when it first registers
  gets ``atexit`` alone.

SIGKILL leaves them: the reaper (``DockerBackend()`` as it starts, ``adk-sandbox snapshots reap``) removes
those, as before. A child made by ``os.fork`` does not own its parent's snapshots: it removes none.
A snapshot that is the lower layer of a live fork by layer is left for the reaper (its mounts outlive
this process until the reaper detaches them); a root image still used by a running container is left to
the reaper too (its labels say it is leaked once this process is gone), its directory removed.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

__all__ = ["forget", "register", "remove_all"]

log = logging.getLogger(__name__)

#: Removes an engine image by id (gone already is not an error).
ImageRemover = Callable[[str], None]

_lock = threading.RLock()  # re-entered by a signal handler that interrupts a registration
#: Snapshot path -> (owner pid, the root image's remover or None).
_owned: dict[str, tuple[int, ImageRemover | None]] = {}
_hooked_pid: int | None = None
_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def register(path: str, remove_image: ImageRemover | None = None) -> None:
    """Remove the owned snapshot at ``path`` when this process exits (unless :func:`forget` comes first)."""
    global _hooked_pid  # noqa: PLW0603 - one hook per process, installed once
    pid = os.getpid()
    with _lock:
        _owned[path] = (pid, remove_image)
        if _hooked_pid == pid:
            return
        _hooked_pid = pid
    atexit.register(remove_all)
    if threading.current_thread() is threading.main_thread():
        for signum in _SIGNALS:
            with contextlib.suppress(ValueError, OSError):
                if signal.getsignal(signum) is signal.SIG_DFL:
                    signal.signal(signum, _on_signal)


def forget(path: str) -> None:
    """The snapshot at ``path`` was removed (or handed on): nothing to do for it at exit."""
    with _lock:
        _owned.pop(path, None)


def remove_all() -> list[str]:
    """Remove every owned snapshot this process still has; the ids removed (failures are logged)."""
    from adk_sandbox.executor.snapshots.store import SnapshotStore, layered_on  # noqa: PLC0415 - it imports this

    pid = os.getpid()
    with _lock:
        mine = [(path, remover) for path, (owner, remover) in _owned.items() if owner == pid]
        _owned.clear()
    removed = []
    for path, remover in mine:
        snapshot_id = os.path.basename(path)
        store = SnapshotStore(os.path.dirname(path))
        try:
            store.remove(snapshot_id, remover)
        except Exception as exc:
            if not os.path.isdir(path):
                continue
            if layered_on(path):
                log.warning("owned snapshot %s is a live fork's lower layer: left to the reaper", snapshot_id)
                continue
            log.warning(
                "owned snapshot %s: %s; its directory is removed, its image left to the reaper", path, exc
            )
            store.discard(snapshot_id, os.path.dirname(path))
        removed.append(snapshot_id)
    return removed


def _on_signal(signum: int, frame: FrameType | None) -> None:
    """Remove the owned snapshots, then die of ``signum`` as the default action would have."""
    try:
        remove_all()
    finally:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
