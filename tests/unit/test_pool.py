"""The warm pool's logic (limits, failures, health, close) with fake sessions (the shipped FakeSession, as
pool members) and a fake engine client.

The real engine's side (never reused, refills, kills from outside, leaks) is
tests/integration/test_docker_pool.py; these pin what is hard to provoke there: a removal that hangs, a
create that fails or never ends.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from adk_sandbox.executor import PolicyNotEnforceableError, ResourceLimits, SandboxFailedError
from adk_sandbox.executor.backends.docker._container import ContainerProvider
from adk_sandbox.executor.backends.docker._spec import ContainerSpec
from adk_sandbox.executor.backends.docker.pool import PoolConfig, SessionPool
from adk_sandbox.executor.backends.docker.session import SessionConfig
from adk_sandbox.executor.pool import PoolSettings, PoolStats, WarmPool
from adk_sandbox.testing import FakeSession

CONFIG = SessionConfig(spec=ContainerSpec(image="img", limits=ResourceLimits()), user=None, policy_env={})


class PoolMember(FakeSession):
    """A pool member: the shipped fake session, plus what the pool asks of a DockerSession besides.

    Its start waits for the maker's gate and fails with the maker's ``fail``; ``ping`` answers ``alive``;
    closing hands its container to the provider (and removes a copy's directory, as a DockerSession does).
    """

    def __init__(self, maker: Maker, config: SessionConfig, provider: ContainerProvider) -> None:
        super().__init__(session_id=uuid.uuid4().hex[:12], workspace=config.spec.workspace)
        self._maker = maker
        self.config = config
        self._provider = provider
        self.alive = True

    def start(self) -> None:
        self._maker.started.wait()
        self.start_error = self._maker.fail
        super().start()

    def ping(self, timeout: float) -> bool:
        return self.alive

    def push_workspace(self) -> None:
        self.pushed = True

    def close(self) -> None:
        if not self.closed:
            super().close()
            self._provider.remove(f"container-{self.session_id}")
            if self.config.workspace_is_copy and self.config.spec.workspace:
                shutil.rmtree(self.config.spec.workspace)


class Maker:
    """Makes :class:`PoolMember` s; ``started`` gates their start, ``fail`` makes it raise."""

    def __init__(self) -> None:
        self.made: list[PoolMember] = []
        self.started = threading.Event()
        self.started.set()
        self.fail: Exception | None = None

    def __call__(self, config: SessionConfig, provider: ContainerProvider) -> Any:
        session = PoolMember(self, config, provider)
        self.made.append(session)
        return session


class FakeEngine:
    """The one engine call a member's removal makes; ``hang`` holds every removal until set."""

    def __init__(self) -> None:
        self.removed: list[str] = []
        self.hang = threading.Event()
        self.hang.set()
        self.api = SimpleNamespace(remove_container=self._remove)

    def _remove(self, container_id: str, force: bool, v: bool = False) -> None:
        self.hang.wait()
        self.removed.append(container_id)


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def maker() -> Maker:
    return Maker()


@pytest.fixture
def pools() -> Iterator[list[SessionPool]]:
    made: list[SessionPool] = []
    yield made
    for pool in made:
        pool.close(timeout=5)


def make_pool(pools: list[SessionPool], engine: FakeEngine, maker: Maker, **settings: Any) -> SessionPool:
    pool = SessionPool(engine, CONFIG, PoolConfig(**settings), maker, engine="fake")  # type: ignore[arg-type]
    pools.append(pool)
    return pool


def test_removals_that_hang_do_not_hold_up_refills(
    pools: list[SessionPool], engine: FakeEngine, maker: Maker
) -> None:
    pool = make_pool(pools, engine, maker, size=2, create_concurrency=1, remove_concurrency=1)
    engine.hang.clear()  # every removal now blocks in the engine
    started = time.monotonic()
    for _ in range(10):
        pool.acquire().close()
    assert time.monotonic() - started < 5
    assert pool.stats().removing == 10  # one stuck in the engine, nine queued behind it
    assert engine.removed == []
    engine.hang.set()
    pool.close(timeout=5)
    assert len(engine.removed) == len(maker.made)  # every member made was removed, none twice
    assert len(set(engine.removed)) == len(engine.removed)


def test_a_failing_create_is_raised_to_the_waiting_acquirer_and_not_retried_in_a_loop(
    pools: list[SessionPool], engine: FakeEngine, maker: Maker
) -> None:
    maker.fail = PolicyNotEnforceableError("the Docker daemon cannot run runtime 'nope'")
    pool = make_pool(pools, engine, maker, size=2, acquire_timeout_seconds=60)
    with pytest.raises(PolicyNotEnforceableError, match="runtime 'nope'"):
        pool.acquire()
    time.sleep(0.3)
    failed = pool.stats().failed
    time.sleep(0.3)
    assert pool.stats().failed == failed  # nobody waiting: no retries
    maker.fail = None
    assert pool.acquire() in maker.made  # the next acquire tries again


def test_an_acquire_with_nothing_ready_in_time_fails_clearly(
    pools: list[SessionPool], engine: FakeEngine, maker: Maker
) -> None:
    maker.started.clear()  # starts never finish
    pool = make_pool(pools, engine, maker, size=1, acquire_timeout_seconds=0.3)
    with pytest.raises(SandboxFailedError, match=r"no warm container was ready within 0\.3 s"):
        pool.acquire()
    maker.started.set()


def test_a_member_that_does_not_answer_is_replaced(
    pools: list[SessionPool], engine: FakeEngine, maker: Maker
) -> None:
    pool = make_pool(pools, engine, maker, size=2)
    assert pool.wait_ready(5)
    dead = maker.made[0]
    dead.alive = False
    got = [pool.acquire(), pool.acquire()]
    assert dead not in got
    assert dead.closed
    assert pool.stats().replaced == 1


def test_close_waits_for_creates_in_flight_and_removes_them(
    pools: list[SessionPool], engine: FakeEngine, maker: Maker
) -> None:
    maker.started.clear()
    pool = make_pool(pools, engine, maker, size=2)
    closer = threading.Thread(target=pool.close)
    closer.start()
    time.sleep(0.2)
    assert closer.is_alive()  # waiting for the two starts
    maker.started.set()
    closer.join(5)
    assert not closer.is_alive()
    assert len(maker.made) == 2
    assert all(session.closed for session in maker.made)
    assert len(engine.removed) == 2
    with pytest.raises(SandboxFailedError, match="closed"):
        pool.acquire()


def test_a_pool_member_has_no_workspace(engine: FakeEngine, maker: Maker) -> None:
    with_workspace = SessionConfig(
        spec=ContainerSpec(image="img", limits=ResourceLimits(), workspace="/w"), user=None, policy_env={}
    )
    with pytest.raises(ValueError, match="no workspace"):
        SessionPool(engine, with_workspace, PoolConfig(size=1), maker, engine="fake")  # type: ignore[arg-type]


def test_a_copies_pool_gives_each_member_a_directory_of_its_own(
    pools: list[SessionPool], engine: FakeEngine, maker: Maker
) -> None:
    pool = make_pool(pools, engine, maker, size=3, workspace="mirror")
    assert pool.wait_ready(5)
    assert pool.root is not None and os.stat(pool.root).st_mode & 0o777 == 0o700
    assert (pool.key.workspace, pool.key.mirror_mb) == ("mirror", CONFIG.mirror_mb)
    copies = [session.config.spec.workspace for session in maker.made]
    assert len(set(copies)) == 3
    for session, copy in zip(maker.made, copies, strict=True):
        assert copy is not None and os.path.dirname(copy) == pool.root and os.listdir(copy) == []
        assert session.config.workspace_transport == "mirror" and session.config.workspace_is_copy
    pool.close(timeout=5)
    assert not os.path.lexists(pool.root)


def test_a_failed_create_of_a_copies_pool_leaves_no_directory(
    pools: list[SessionPool], engine: FakeEngine, maker: Maker
) -> None:
    maker.fail = SandboxFailedError("the engine refused")
    pool = make_pool(pools, engine, maker, size=2, workspace="mirror", acquire_timeout_seconds=60)
    with pytest.raises(SandboxFailedError, match="refused"):
        pool.acquire(copy_of="/nonexistent-source")
    deadline = time.monotonic() + 5
    while pool.stats().creating and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.root is not None and os.listdir(pool.root) == []


def test_each_pool_serves_its_own_kind_of_session(
    pools: list[SessionPool], engine: FakeEngine, maker: Maker
) -> None:
    copies = make_pool(pools, engine, maker, size=1, workspace="mirror")
    plain = make_pool(pools, engine, maker, size=1)
    with pytest.raises(ValueError, match="copy_of"):
        copies.acquire()
    with pytest.raises(ValueError, match="no workspace"):
        plain.acquire(copy_of="/some/project")
    assert copies.stats().served == plain.stats().served == 0
    assert plain.root is None and plain.key.workspace == "none" and plain.key.mirror_mb is None


class Booting(FakeSession):
    """A member whose start lasts until it is closed (a VM killed while it boots), then fails."""

    def __init__(self) -> None:
        super().__init__(session_id=uuid.uuid4().hex[:12])
        self.killed = threading.Event()

    def start(self) -> None:
        self.killed.wait(30)
        raise SandboxFailedError("killed while it booted")

    def ping(self, timeout: float) -> bool:
        return True

    def close(self) -> None:
        self.killed.set()
        super().close()


class BootingPool(WarmPool[Booting, PoolSettings]):
    kill_starting = True

    def __init__(self) -> None:
        self.made: list[Booting] = []
        super().__init__(PoolSettings(size=2), concurrency=2, tend_seconds=60)

    def _new_member(self) -> Booting:
        self.made.append(Booting())
        return self.made[-1]


def test_a_pool_that_kills_starting_members_closes_at_once_and_counts_them_as_booting() -> None:
    pool = BootingPool()
    deadline = time.monotonic() + 5
    while len(pool.made) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.stats().booting == pool.stats().creating == 2
    started = time.monotonic()
    pool.close(timeout=20)
    assert time.monotonic() - started < 5  # killed, not waited for
    assert all(member.closed for member in pool.made)
    assert pool.stats() == PoolStats(
        ready=0, creating=0, removing=0, created=0, served=0, replaced=0, failed=0
    )


def test_a_member_whose_copy_fails_is_destroyed_and_not_counted_as_served(
    pools: list[SessionPool], engine: FakeEngine, maker: Maker, tmp_path: Any
) -> None:
    pool = make_pool(pools, engine, maker, size=1, workspace="mirror")
    assert pool.wait_ready(5)
    with pytest.raises(FileNotFoundError):
        pool.acquire(copy_of=str(tmp_path / "missing"))
    assert maker.made[0].closed and pool.stats().served == 0
    served = pool.acquire(copy_of=str(tmp_path))
    assert served is not maker.made[0] and served in maker.made[1:]  # a refill, never the destroyed member
    assert served.pushed and pool.stats().served == 1
