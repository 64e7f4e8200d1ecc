"""Idle pause: a session that sat idle for ``idle_pause_seconds`` pauses itself to disk (any engine).

Idle means both, for the whole period: no call of the session reached inside (each one notes its time:
``ChannelSession.last_call``), and the sandbox used less than :data:`BUSY_CPU_SHARE` of one CPU, read on
the host by the engine's reader: a container's cgroup (:func:`cgroup_cpu_reader`), a VM's QEMU process
(:func:`process_cpu_reader`). An idle gVisor sandbox's own clock costs a few percent (measured about 4 %),
an idle microVM's QEMU under TCG about 0.4 %, so "no CPU" is that floor, not zero. The pause is an ordinary
``pause(wait_seconds=0)``: it is refused, and tried again after another idle period, when a command runs
or a terminal, program, port or connection is open. The next call resumes the session, as after any
pause (docs/pause.md).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from adk_sandbox.executor.errors import ExecutorError

if TYPE_CHECKING:
    from adk_sandbox.executor.channel.session import ChannelSession

__all__ = ["BUSY_CPU_SHARE", "CpuReader", "IdlePauser", "cgroup_cpu_reader", "process_cpu_reader"]

#: CPU seconds used so far (None: not readable now, as when the sandbox stopped).
CpuReader = Callable[[], float | None]

log = logging.getLogger(__name__)

#: A sandbox using at least this share of one CPU (averaged over a check's step) is busy.
BUSY_CPU_SHARE = 0.10


def cgroup_cpu_reader(pid: int) -> CpuReader | None:
    """A reader of the CPU seconds used by the cgroup of host process ``pid`` (v1 cpuacct or v2), or None."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="ascii") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    path: str | None = None
    v2 = False
    for line in lines:
        _, controllers, where = line.split(":", 2)
        if "cpuacct" in controllers.split(","):
            path = next(
                (
                    candidate
                    for candidate in (
                        f"/sys/fs/cgroup/cpuacct{where}/cpuacct.usage",
                        f"/sys/fs/cgroup/cpu,cpuacct{where}/cpuacct.usage",
                    )
                    if _readable(candidate)
                ),
                None,
            )
            break
        if line.startswith("0::"):
            path, v2 = f"/sys/fs/cgroup{where}/cpu.stat", True
    if path is None or not _readable(path):
        return None
    found = path

    def read() -> float | None:
        try:
            with open(found, encoding="ascii") as handle:
                text = handle.read()
        except OSError:
            return None  # the container stopped (paused to disk) or is gone
        if not v2:
            return int(text) / 1e9
        usage = next((line.split()[1] for line in text.splitlines() if line.startswith("usage_usec ")), None)
        return int(usage) / 1e6 if usage is not None else None

    return read


def process_cpu_reader(pid: int) -> CpuReader | None:
    """A reader of the CPU seconds host process ``pid`` used, all its threads (a VM's QEMU)."""
    tick = os.sysconf("SC_CLK_TCK")

    def read() -> float | None:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None  # it ended (paused to disk) or is gone
        return (int(fields[11]) + int(fields[12])) / tick  # utime, stime

    return read if read() is not None else None


def _readable(path: str) -> bool:
    try:
        with open(path, encoding="ascii"):
            return True
    except OSError:
        return False


class IdlePauser:
    """Watches one session and pauses it to disk once it sat idle for ``seconds`` (see the module)."""

    def __init__(
        self, session: ChannelSession, seconds: float, reader: Callable[[int], CpuReader | None]
    ) -> None:
        """Watch ``session`` (its ``running_sandbox()``: an id and a host pid), CPU read by ``reader``."""
        self._session = session
        self._seconds = seconds
        self._reader = reader
        self._step = min(max(seconds / 4, 0.05), 5.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="adk-sandbox-idle", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Watch no more (the session closes); idempotent."""
        self._stop.set()

    def _watch(self) -> None:
        session = self._session
        cpu: Callable[[], float | None] | None = None
        watched: str | None = None
        quiet_since = time.monotonic()
        last_call, last_cpu = session.last_call, None
        while not self._stop.wait(self._step):
            now = time.monotonic()
            running = session.running_sandbox()
            if running is None or session.paused:  # not started, closed, or paused already
                quiet_since, last_cpu = now, None
                continue
            key = f"{running[0]}:{running[1]}"
            if watched != key:  # a new container, or restored: its own cgroup
                watched, cpu = key, self._reader(running[1])
            used = cpu() if cpu is not None else None
            busy = (
                used is None
                or last_cpu is None
                or used - last_cpu >= BUSY_CPU_SHARE * self._step
                or session.last_call != last_call
            )
            last_call, last_cpu = session.last_call, used
            if busy:
                quiet_since = now
                continue
            if now - quiet_since < self._seconds:
                continue
            try:
                session.pause(wait_seconds=0)
                log.info("session %s paused to disk after %g s idle", watched[:12], self._seconds)
            except ExecutorError as exc:  # busy after all (a command, an open terminal): later
                log.debug("idle pause of %s refused: %s", watched[:12], exc)
            quiet_since, last_cpu = time.monotonic(), None
