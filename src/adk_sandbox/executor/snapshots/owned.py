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

_lock = threading.RLock()  # re-entered by a signal handler that interrupts a registration
#: Snapshot path -> (owner pid, what removes it).
_owned: dict[str, tuple[int, Callable[[], None]]] = {}
_hooked_pid: int | None = None
_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def register(path: str, remove: Callable[[], None]) -> None:
    """Call ``remove`` when this process exits (it removes the owned snapshot at ``path``).

    Unless :func:`forget` comes first.
    """
    global _hooked_pid  # noqa: PLW0603 - one hook per process, installed once
    pid = os.getpid()
    with _lock:
        _owned[path] = (pid, remove)
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
    """Remove every owned snapshot this process still has; the paths removed (failures are logged)."""
    pid = os.getpid()
    with _lock:
        mine = [(path, remove) for path, (owner, remove) in _owned.items() if owner == pid]
        _owned.clear()
    removed = []
    for path, remove in mine:
        try:
            remove()
        except Exception as exc:
            log.warning("owned snapshot %s could not be removed at exit: %s", path, exc)
            continue
        removed.append(path)
    return removed


def _on_signal(signum: int, frame: FrameType | None) -> None:
    """Remove the owned snapshots, then die of ``signum`` as the default action would have."""
    try:
        remove_all()
    finally:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
