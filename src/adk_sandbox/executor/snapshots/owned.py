"""Owned snapshots go when their owner goes: removed at this process's exit, by any path but SIGKILL.

:func:`register` (called by the store for each owned snapshot it commits) and :func:`forget`; at exit,
or on SIGTERM/SIGHUP left at their default, :func:`remove_all` removes what is still registered.
See docs/snapshots.md, section "Lifecycle", "An owned snapshot goes with its owner".
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
