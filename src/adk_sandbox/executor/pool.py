"""The warm pool, written once: started, never-reused members kept ready, whatever engine makes them.

:class:`WarmPool` holds the lifecycle (fill, acquire with ping and preparation, tending, close) and an
engine's pool subclasses it with its steps; :class:`PoolSettings`, :class:`PoolStats`, :class:`Member`
and the background :class:`Remover`. See docs/docker/pool.md, section "Warm pool".
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, ClassVar, Generic, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from adk_sandbox.executor.errors import ExecutorError, SandboxFailedError

__all__ = ["Member", "PoolSettings", "PoolStats", "Remover", "WarmPool"]

log = logging.getLogger(__name__)


class Member(Protocol):
    """What a pool asks of its members (an engine's sessions)."""

    @property
    def session_id(self) -> str: ...  # noqa: D102
    def start(self) -> None: ...  # noqa: D102
    def ping(self, timeout: float) -> bool: ...  # noqa: D102
    def close(self) -> None: ...  # noqa: D102


class PoolSettings(BaseModel):
    """What every engine's pool config has (``PoolConfig``, ``MicroVMPoolConfig``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    size: Annotated[int, Field(ge=1, le=256)]
    """How many started members to keep ready."""
    acquire_timeout_seconds: Annotated[float, Field(gt=0)] = 120.0
    """How long an acquire waits for a member when none is ready before it fails."""
    ping_timeout_seconds: Annotated[float, Field(gt=0)] = 2.0
    """How long a member may take to answer the ping before it is replaced."""


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of a pool's counters."""

    ready: int
    """Members started and waiting to be handed out."""
    creating: int
    """Members being created and started (a VM: booted) now."""
    removing: int
    """Members queued for or being removed in the background now (released or replaced)."""
    created: int
    """Members made ready since the pool started."""
    served: int
    """Members handed out."""
    replaced: int
    """Members found dead, not answering, past their age or of an older image, removed instead."""
    failed: int
    """Creates that failed."""

    @property
    def booting(self) -> int:
        """A microVM pool's name for :attr:`creating`."""
        return self.creating


M = TypeVar("M", bound=Member)
S = TypeVar("S", bound=PoolSettings)


class Remover:
    """Runs removals in the background, at most ``limit`` at once; :meth:`drain` waits for all."""

    def __init__(self, limit: int) -> None:
        self._slots, self._cond = threading.BoundedSemaphore(limit), threading.Condition()
        self.pending = 0
        """Removals queued or running."""
        self._closed = False

    def submit(self, job: Callable[[], None]) -> bool:
        """Queue ``job``; False once drained, or when no thread can start (the caller then runs it)."""
        with self._cond:
            if self._closed:
                return False
            self.pending += 1
        try:
            threading.Thread(
                target=self._run, args=(job,), name="adk-sandbox-pool-remove", daemon=True
            ).start()
        except RuntimeError:  # the interpreter is shutting down (a close from atexit)
            self._done()
            return False
        return True

    def _run(self, job: Callable[[], None]) -> None:
        try:
            with self._slots:
                job()
        except Exception:  # a removal the engine refused is noted for the reaper by the job itself
            log.warning("a warm pool member could not be removed", exc_info=True)
        finally:
            self._done()

    def _done(self) -> None:
        with self._cond:
            self.pending -= 1
            self._cond.notify_all()

    def drain(self, timeout: float) -> bool:
        """Take no more jobs (later ones run in their caller) and wait for the queued ones; True if done."""
        with self._cond:
            self._closed = True
            return self._cond.wait_for(lambda: not self.pending, timeout)


class WarmPool(Generic[M, S]):
    """Started members kept ready (docs/docker/pool.md); an engine's pool is a subclass.

    The subclass sets up what :meth:`_new_member` needs, then calls ``super().__init__``, which starts the
    first creates and the tending thread.
    """

    noun: ClassVar[str] = "warm pool member"
    """What the pool's logs call a member."""
    threads: ClassVar[str] = "adk-sandbox-pool"
    """The prefix of the pool's thread names."""
    closed_message: ClassVar[str] = "this pool is closed: it hands out no more sessions"
    timeout_message: ClassVar[str] = "no member was ready within {timeout:g} s ({creating} starting)"
    """An acquire's error when no member was ready in time (with ``timeout``, ``creating``, ``limit``)."""
    kill_starting: ClassVar[bool] = False
    """Close destroys the members still starting (their start fails at once) instead of waiting for them."""
    close_seconds: ClassVar[float] = 120.0
    """How long a close waits at most for the creates in flight and the removals."""
    ready_seconds: ClassVar[float] = 120.0
    """How long :meth:`wait_ready` waits when not told."""
    root: str | os.PathLike[str] | None = None
    """The host directory holding the members' workspaces (one each), removed at close, if any."""

    def __init__(
        self,
        settings: S,
        *,
        concurrency: int,
        tend_seconds: float,
        max_age: float | None = None,
        removers: int = 1,
    ) -> None:
        self.settings = settings
        """How this pool keeps its members."""
        self._concurrency, self._tend_seconds, self._max_age = concurrency, tend_seconds, max_age
        self._remover = Remover(removers)
        self._cond = threading.Condition()
        self._ready = deque[tuple[M, float, str | None]]()  # member, when ready, its version
        self._starting: set[M] = set()
        self._newest: str | None = None  # the version of the newest member
        self._creating = self._waiting = self._deferred = 0  # deferred: refills waiting for a first command
        self._created = self._served = self._replaced = self._failed = 0
        self._failures = deque[Exception]()  # create failures not yet raised to a waiting acquirer (one each)
        self._closed = False
        self._stop = threading.Event()
        with self._cond:
            self._fill_locked()
        threading.Thread(target=self._tend, name=f"{self.threads}-tend", daemon=True).start()
        # A pool its owner forgot to close is drained at a normal exit (a killed owner's: the reaper's).
        atexit.register(self.close)

    # -- the engine's steps --------------------------------------------------------------------------
    def _new_member(self) -> M:
        """An unstarted member (leaving nothing behind when it raises)."""
        raise NotImplementedError

    def _version(self, member: M) -> str | None:
        """What a started member runs (an image digest): a newer one makes the older members stale."""
        return None

    def _tended(self, member: M) -> bool:
        """Whether an idle member still runs (asked by the tending thread)."""
        return member.ping(self.settings.ping_timeout_seconds)

    def _after_first_command(self, member: M, hook: Callable[[], None]) -> None:
        """Call ``hook`` once the member's first command ended, or it closed (a deferred refill)."""
        hook()

    def _remove(self, member: M) -> None:
        try:
            member.close()
        except ExecutorError as exc:  # noted for the reaper by the engine; a pool close goes on
            log.warning("closing a %s failed: %s", self.noun, exc)

    # -- stats ---------------------------------------------------------------------------------------
    def stats(self) -> PoolStats:
        """The pool's counters now."""
        with self._cond:
            return PoolStats(
                len(self._ready),
                self._creating,
                self._remover.pending,
                self._created,
                self._served,
                self._replaced,
                self._failed,
            )

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until ``size`` members are ready (True), or ``timeout`` passed or the pool closed (False)."""
        timeout = self.ready_seconds if timeout is None else timeout
        with self._cond:
            self._cond.wait_for(lambda: self._closed or len(self._ready) >= self.settings.size, timeout)
            return not self._closed and len(self._ready) >= self.settings.size

    # -- acquire -------------------------------------------------------------------------------------
    def _acquire(self, prepare: Callable[[M], float | None] | None = None) -> M:
        """A started member no one used before, which answered its ping, prepared by ``prepare``.

        ``prepare`` returns how long at most the member's refill waits for its first command (a fork's:
        its create would compete with that command for the engine's machine; never while an acquirer
        waits), or None.
        """
        deadline = time.monotonic() + self.settings.acquire_timeout_seconds
        while True:
            member = self._take(deadline)
            if not member.ping(self.settings.ping_timeout_seconds):
                log.info("%s %s did not answer its ping: replaced", self.noun, member.session_id)
                self._discard([member])
                continue
            defer: float | None = None
            try:
                defer = prepare(member) if prepare is not None else None
            except BaseException:
                self._remove(member)  # it may hold part of the request: never handed out
                raise
            finally:
                # The refill starts only now: its create would compete with the ping and the preparation.
                with self._cond:
                    self._deferred += defer is not None
                    self._fill_locked()
            if defer is not None:
                self._defer_refill(member, defer)
            with self._cond:
                self._served += 1
            return member

    def _take(self, deadline: float) -> M:
        """The oldest ready member that is not stale, waiting for one when none is (stale ones removed)."""
        stale: list[M] = []
        try:
            with self._cond:
                self._waiting += 1
                try:
                    waited = False
                    while True:
                        if self._closed:
                            raise SandboxFailedError(self.closed_message)
                        now = time.monotonic()
                        while self._ready:
                            ready = self._ready.popleft()
                            if not self._is_stale(ready, now):
                                return ready[0]
                            stale.append(ready[0])
                        if waited and self._failures:
                            raise self._failures.popleft()
                        self._fill_locked()
                        if deadline <= now:
                            limits = {"creating": self._creating, "limit": self._concurrency}
                            timeout = self.settings.acquire_timeout_seconds
                            raise SandboxFailedError(self.timeout_message.format(timeout=timeout, **limits))
                        self._cond.wait(deadline - now)
                        waited = True
                finally:
                    self._waiting -= 1
        finally:
            self._discard(stale)

    def _is_stale(self, ready: tuple[M, float, str | None], now: float) -> bool:
        """Past its age, or running an older version than the newest member (a tag rebuilt meanwhile)."""
        too_old = self._max_age is not None and now - ready[1] > self._max_age
        return too_old or (self._newest is not None and ready[2] != self._newest)

    def _discard(self, members: list[M]) -> None:
        """Remove members instead of handing them out, and refill."""
        if members:
            with self._cond:
                self._replaced += len(members)
                self._fill_locked()
            for member in members:
                self._remove(member)

    # -- refill --------------------------------------------------------------------------------------
    def _defer_refill(self, member: M, seconds: float) -> None:
        """Start the refill for ``member`` when its first command ends (or it closes, or ``seconds`` pass)."""
        released = threading.Event()

        def release() -> None:
            with self._cond:
                if released.is_set():
                    return
                released.set()
                self._deferred -= 1
                self._fill_locked()
            timer.cancel()

        timer = threading.Timer(seconds, release)
        timer.daemon, timer.name = True, f"{self.threads}-deferred-refill"
        timer.start()
        self._after_first_command(member, release)

    def _fill_locked(self) -> None:
        """Start creates until ready + creating (+ deferred while no acquirer waits) covers size + waiting."""
        want = self.settings.size + self._waiting
        held = 0 if self._waiting else self._deferred
        while (
            not self._closed
            and self._creating < self._concurrency
            and len(self._ready) + self._creating + held < want
        ):
            self._creating += 1
            threading.Thread(target=self._create_one, name=f"{self.threads}-create", daemon=True).start()

    def _create_one(self) -> None:
        member: M | None = None
        try:
            member = self._new_member()
            with self._cond:
                if self._closed and self.kill_starting:
                    raise SandboxFailedError("the pool closed")
                self._starting.add(member)
            member.start()
        except Exception as exc:
            if member is not None:
                self._remove(member)
            with self._cond:
                self._starting.discard(member)
                self._creating -= 1
                if not self._closed:
                    log.warning("the pool could not start a %s: %s", self.noun, exc)
                    self._failed += 1
                    if len(self._failures) < self._waiting:  # none waiting: the next acquire tries again
                        self._failures.append(exc)
                self._cond.notify_all()
            return
        version = self._version(member)
        with self._cond:
            self._starting.discard(member)
            if not self._closed:
                self._newest = version
                self._ready.append((member, time.monotonic(), version))
                self._created += 1
                self._failures.clear()  # a create works again: earlier failures are history
                self._creating -= 1
                self._fill_locked()
                self._cond.notify_all()
                return
        self._remove(member)  # closed while it started: removed before the create counts as done
        with self._cond:
            self._creating -= 1
            self._cond.notify_all()

    def _tend(self) -> None:
        """Replace idle members that stopped or grew stale, until the pool closes."""
        while not self._stop.wait(self._tend_seconds):
            with self._cond:
                ready = list(self._ready)
            now = time.monotonic()
            bad = [r for r in ready if self._is_stale(r, now) or not self._tended(r[0])]
            with self._cond:  # only those still ready: an acquire may have taken one meanwhile
                bad = [r for r in bad if r in self._ready]
                for r in bad:
                    self._ready.remove(r)
            if bad:
                log.info("%d idle %s(s) stopped or grew stale: replaced", len(bad), self.noun)
            self._discard([r[0] for r in bad])

    # -- close ---------------------------------------------------------------------------------------
    def close(self, timeout: float | None = None) -> None:
        """Stop refilling, destroy every member of the pool (ready, starting, released), remove its root.

        Idempotent. Sessions handed out are their owner's (the backend's close closes them first); a
        session still open keeps its workspace in the root, and so the root, until it closes.
        """
        timeout = self.close_seconds if timeout is None else timeout
        deadline = time.monotonic() + timeout
        atexit.unregister(self.close)
        with self._cond:
            self._closed = True
            members = [r[0] for r in self._ready] + (list(self._starting) if self.kill_starting else [])
            self._ready.clear()
            self._cond.notify_all()
        self._stop.set()
        for member in members:
            self._remove(member)
        with self._cond:
            self._cond.wait_for(lambda: not self._creating, max(deadline - time.monotonic(), 0.001))
        if not self._remover.drain(max(deadline - time.monotonic(), 0.001)):
            log.warning("the warm pool's removals did not finish in %g s; the reaper takes the rest", timeout)
        try:
            if self.root is not None:
                os.rmdir(self.root)  # empty once every member closed (each removes its own directory)
        except FileNotFoundError:
            pass
        except OSError:
            log.warning("warm pool directory %s left: sessions with workspaces in it are open", self.root)
