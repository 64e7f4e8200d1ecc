"""``workspace_transport="auto"``: what each workspace got on each local engine, kept for the process.

A bind mount when the engine's identity check shows it sees this machine's directory, else the mirror;
:class:`AutoChoices` remembers which, so a second session of the workspace does not pay for a failed check.
"""

from __future__ import annotations

import os
import threading
from typing import Literal

__all__ = ["AUTO_CHOICES", "AutoChoices"]


#: The engine's socket (path, device, inode, ctime) and the workspace directory's (device, inode).
_ChoiceKey = tuple[str, int, int, int, int, int]


class AutoChoices:
    """What ``"auto"`` found for each workspace on each local engine, kept for this process.

    ``"bind"``: the identity check passed; ``"mirror"``: it failed. A failed check costs a whole container
    (created, started, probed, removed) before the mirror's own, so a second session of the workspace
    goes to the mirror at once. The key is the engine's socket (path, device, inode, ctime: a restarted or
    other daemon makes a new socket, which is checked again) and the workspace directory (device, inode: the
    same directory by any path; a directory has no stable time to add, so one made later under a reused
    inode number gets the remembered answer). A remembered ``"bind"`` changes nothing: every bound
    session is identity-checked at start anyway, and a check failing then is remembered as ``"mirror"``.
    A remembered ``"mirror"`` stays for the process: mirroring a directory the engine could see is
    slower, never wrong.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[_ChoiceKey, Literal["bind", "mirror"]] = {}

    @staticmethod
    def key(socket_path: str | None, workspace: str) -> _ChoiceKey | None:
        """The key of ``workspace`` on the local engine at ``socket_path`` (None: nothing to key by)."""
        if socket_path is None:
            return None  # not a local engine: "auto" mirrors without a check
        try:
            engine, directory = os.stat(socket_path), os.stat(workspace)
        except OSError:
            return None
        # The ctime too: a socket made anew may get the inode number of the one removed.
        return (
            socket_path,
            engine.st_dev,
            engine.st_ino,
            engine.st_ctime_ns,
            directory.st_dev,
            directory.st_ino,
        )

    def get(self, key: _ChoiceKey | None) -> Literal["bind", "mirror"] | None:
        """What was found for ``key`` (None: never checked)."""
        if key is None:
            return None
        with self._lock:
            return self._known.get(key)

    def put(self, key: _ChoiceKey | None, mode: Literal["bind", "mirror"]) -> None:
        """Remember ``mode`` for ``key`` (a ``"mirror"`` is never replaced by a later ``"bind"``)."""
        if key is None:
            return
        with self._lock:
            if self._known.get(key) != "mirror":
                self._known[key] = mode

    def clear(self) -> None:
        """Forget everything (the next ``"auto"`` session of each workspace checks again)."""
        with self._lock:
            self._known.clear()


#: The process's :class:`AutoChoices`, shared by every backend and session.
AUTO_CHOICES = AutoChoices()
