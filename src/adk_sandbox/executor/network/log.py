"""A session's connection log: each attempt through the proxy, bounded, the oldest dropped first."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Literal

__all__ = ["DEFAULT_LOG_ENTRIES", "ConnectionEntry", "ConnectionLog", "LogSnapshot"]

DEFAULT_LOG_ENTRIES = 1000
"""How many entries a log keeps by default."""


@dataclass(frozen=True)
class ConnectionEntry:
    """One connection attempt, recorded when it ended (allowed ones carry the bytes each way)."""

    time: float
    """When the attempt began (seconds since the epoch)."""
    host: str
    """The host asked for (as parsed; empty when the request could not be parsed)."""
    port: int
    """The port asked for (0 when the request could not be parsed)."""
    decision: Literal["allowed", "refused"]
    """Whether bytes went to a server."""
    rule: str
    """The rule that allowed or refused (``allow pypi.org``), or what refused it (``address``, ``sni``)."""
    detail: str = ""
    """Why, in a sentence, when refused or cut short; the address connected to when allowed."""
    bytes_up: int = 0
    """Bytes from the sandbox delivered to the server."""
    bytes_down: int = 0
    """Bytes from the server delivered to the sandbox."""


@dataclass(frozen=True)
class LogSnapshot:
    """The log at one moment: the entries kept, oldest first, and how many older ones were dropped."""

    entries: tuple[ConnectionEntry, ...]
    dropped: int


class ConnectionLog:
    """The bounded, thread-safe connection log of one session.

    Holds at most ``max_entries``; past that the oldest go, counted in :attr:`dropped` so a reader knows the
    log is not the whole story. A sandbox opening a thousand connections costs the host a fixed amount.
    """

    def __init__(self, max_entries: int = DEFAULT_LOG_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, not {max_entries}")
        self._max = max_entries
        self._entries: deque[ConnectionEntry] = deque(maxlen=max_entries)
        self._dropped = 0
        self._lock = threading.Lock()

    @property
    def max_entries(self) -> int:
        """The most entries kept."""
        return self._max

    def record(self, entry: ConnectionEntry) -> None:
        """Add an entry, dropping the oldest if the log is full."""
        with self._lock:
            if len(self._entries) == self._max:
                self._dropped += 1
            self._entries.append(entry)

    def snapshot(self) -> LogSnapshot:
        """The entries kept and the count dropped, read together."""
        with self._lock:
            return LogSnapshot(entries=tuple(self._entries), dropped=self._dropped)

    def entries(self) -> tuple[ConnectionEntry, ...]:
        """The entries kept, oldest first."""
        return self.snapshot().entries

    @property
    def dropped(self) -> int:
        """How many entries were dropped to keep the log bounded."""
        with self._lock:
            return self._dropped
