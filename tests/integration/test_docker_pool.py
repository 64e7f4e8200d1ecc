"""The warm pool (``DockerBackend(pool=N)``) on the real engine: fresh members, refills, health, no leaks.

Each pooled container carries ``io.adk-sandbox.pool=<pool id>``: the tests count a pool's containers by
that label (running or not), so other processes' containers on the machine do not disturb the counts.
"""

from __future__ import annotations

import asyncio
import calendar
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
from pydantic import ValidationError

from adk_sandbox.executor import (
    ExecRequest,
    InvalidRequestError,
    Language,
    PolicyNotEnforceableError,
    SandboxFailedError,
)
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession, PoolConfig, SessionPool
from adk_sandbox.executor.backends.docker.pool import POOL_LABEL
from adk_sandbox.executor.tools import SandboxTool
from tests.conftest import require

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]


def run(session: DockerSession, code: str, timeout: float = 30):  # type: ignore[no-untyped-def]
    return session.execute(ExecRequest(language=Language.COMMAND, code=code, timeout=timeout))


def pool_containers(client: docker.DockerClient, pool: SessionPool) -> set[str]:
    """Ids of every container (running or not) made for ``pool``."""
    found = client.containers.list(all=True, sparse=True, filters={"label": f"{POOL_LABEL}={pool.id}"})
    return {str(c.id) for c in found}


def pooled(size: int, runtime: str | None = None, **settings: float) -> tuple[DockerBackend, SessionPool]:
    backend = DockerBackend(runtime=runtime, pool=PoolConfig(size=size, **settings))  # type: ignore[arg-type]
    if runtime is not None:
        require(runtime in (backend._client.info().get("Runtimes") or {}), f"{runtime} is not registered")
    assert backend.pool is not None
    assert backend.pool.wait_ready(120), backend.pool.stats()
    return backend, backend.pool


def wait_removed(pool: SessionPool, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while pool.stats().removing and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.parametrize("runtime", [None, "runsc"], ids=["runc", "runsc"])
def test_a_released_member_is_never_handed_out_again(runtime: str | None) -> None:
    backend, pool = pooled(2, runtime)
    marker = f"/tmp/adk-pool-marker-{uuid.uuid4().hex}"
    try:
        first = backend.session()
        assert run(first, f"echo used > {marker} && cat {marker}").stdout == "used\n"
        released, released_id = first.container_id, first.session_id
        first.close()
        seen = {released}
        for _ in range(6):
            with backend.session() as session:
                result = run(session, f"test -e {marker} && echo reused || echo fresh")
                assert result.stdout == "fresh\n", "a released member's files were seen again"
                assert session.container_id not in seen
                assert session.session_id != released_id
                seen.add(session.container_id)
        wait_removed(pool)
        # Released means destroyed: the container is gone, not parked.
        assert released not in pool_containers(backend._client, pool)
    finally:
        backend.close()


def test_a_pool_refills_after_a_burst() -> None:
    backend, pool = pooled(3)
    try:
        burst = [backend.session() for _ in range(3)]
        handed = {session.container_id for session in burst}
        for session in burst:
            assert run(session, "echo ok").stdout == "ok\n"
            session.close()
        assert pool.wait_ready(120), pool.stats()
        wait_removed(pool)
        refilled = pool_containers(backend._client, pool)
        assert len(refilled) == 3
        assert not refilled & handed  # the ready ones are new containers, the burst's are gone
        stats = pool.stats()
        assert (stats.served, stats.ready) == (3, 3)
        assert stats.created >= 6
    finally:
        backend.close()


def test_a_member_killed_from_outside_is_replaced_not_handed_out() -> None:
    backend, pool = pooled(2)
    client = backend._client
    try:
        victim = sorted(pool_containers(client, pool))[0]
        client.api.kill(victim)
        sessions = [backend.session(), backend.session()]
        try:
            for session in sessions:
                assert session.container_id != victim
                assert run(session, "echo alive").stdout == "alive\n"
                # Handed a dead member, a session would heal itself with a fresh container and count it.
                assert session.restarts == 0
        finally:
            for session in sessions:
                session.close()
        assert pool.stats().replaced >= 1
    finally:
        backend.close()


def test_a_member_past_its_age_is_replaced() -> None:
    backend, pool = pooled(1, max_age_seconds=1.5)
    client = backend._client
    try:
        old = pool_containers(client, pool)
        time.sleep(2)
        with backend.session() as session:
            assert session.container_id not in old
            assert run(session, "echo ok").stdout == "ok\n"
        assert pool.stats().replaced >= 1
    finally:
        backend.close()


def test_closing_the_backend_leaves_no_container() -> None:
    backend, pool = pooled(3)
    client = backend._client
    held = backend.session()  # handed out, still open
    backend.session().close()  # released: its removal queued
    assert pool.wait_ready(120)
    extra = backend.session()  # two ready, one refill being created while the backend closes
    assert pool.stats().creating > 0
    assert pool.stats().ready == 2
    made = pool_containers(client, pool) | {held.container_id, extra.container_id}
    backend.close()
    assert pool_containers(client, pool) == set()
    assert all(not _exists(client, container_id) for container_id in made)
    with pytest.raises(SandboxFailedError, match="closed"):
        pool.acquire()


def _exists(client: docker.DockerClient, container_id: str) -> bool:
    try:
        client.api.inspect_container(container_id)
    except docker.errors.NotFound:
        return False
    return True


def test_a_sigkilled_owners_pool_is_reaped_by_the_next_backend() -> None:
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
            import time
            from adk_sandbox.executor.backends.docker import DockerBackend
            backend = DockerBackend(pool=2)
            session = backend.session()  # one handed out, two ready
            assert backend.pool.wait_ready(120)
            print(backend.pool.id, session.container_id, flush=True)
            time.sleep(600)
        """),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert owner.stdout is not None
    pool_id, handed_out = owner.stdout.readline().split()
    client = docker.from_env()
    label = {"label": f"{POOL_LABEL}={pool_id}"}
    try:
        members = {str(c.id) for c in client.containers.list(all=True, sparse=True, filters=label)}
        assert len(members) == 3
        assert handed_out in members
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    # A SIGKILL gives the owner no chance to drain its pool.
    assert {str(c.id) for c in client.containers.list(all=True, sparse=True, filters=label)} == members
    with DockerBackend() as backend:
        assert members <= {leaked.id for leaked in backend.reaped}
    assert client.containers.list(all=True, sparse=True, filters=label) == []


def test_a_pool_its_owner_forgot_to_close_is_drained_at_exit() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
            from adk_sandbox.executor.backends.docker import DockerBackend
            backend = DockerBackend(pool=2)
            backend.session().close()
            assert backend.pool.wait_ready(120)
            print(backend.pool.id, flush=True)
        """),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert done.returncode == 0, done.stderr
    label = {"label": f"{POOL_LABEL}={done.stdout.strip()}"}
    assert docker.from_env().containers.list(all=True, sparse=True, filters=label) == []


def test_eight_threads_through_a_pool_of_two() -> None:
    backend, pool = pooled(2)
    client = backend._client
    errors: list[BaseException] = []
    ids: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        try:
            for _ in range(4):
                with backend.session() as session:
                    # Each container's first user: no earlier session's mark in /tmp.
                    result = run(session, "test -e /tmp/mark && echo reused; echo x > /tmp/mark; echo ok")
                    assert (result.exit_code, result.stdout) == (0, "ok\n"), result
                    assert session.restarts == 0
                    with lock:
                        ids.append(session.session_id)
        except BaseException as exc:
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    try:
        assert errors == []
        assert len(ids) == 32
        assert len(set(ids)) == 32  # every acquire got a member of its own
        assert pool.stats().served == 32
    finally:
        backend.close()
    assert pool_containers(client, pool) == set()


def test_throwaway_execute_and_sandbox_tool_come_from_the_pool() -> None:
    backend, pool = pooled(2)
    try:
        ready = pool_containers(backend._client, pool)
        result = backend.execute(ExecRequest(language=Language.COMMAND, code="hostname; id -u", timeout=30))
        assert result.stdout == "sandbox\n65534\n"
        with SandboxTool(backend) as tool:
            payload = tool.run_sync({"language": "command", "code": "echo via-tool"})
        assert (payload["status"], payload["stdout"]) == ("success", "via-tool\n")
        assert pool.stats().served == 2
        wait_removed(pool)
        assert not ready & pool_containers(backend._client, pool)  # both served members are destroyed
    finally:
        backend.close()


def test_a_workspace_session_starts_cold(owned_workspace: Path) -> None:
    backend, pool = pooled(1)
    try:
        with backend.session(workspace=owned_workspace) as session:
            assert run(session, "pwd").stdout == f"{owned_workspace}\n"
            assert session.container_id not in pool_containers(backend._client, pool)
        assert pool.stats().served == 0
    finally:
        backend.close()


def test_pooled_sessions_keep_their_id_for_cleanup() -> None:
    backend, _ = pooled(1)
    try:
        session = backend.session()
        container = session.container_id
        # The id was given when the pool created the member; cleanup by it finds the handed-out container.
        assert backend.cleanup(session.session_id) == [container]
        session.close()
    finally:
        backend.close()


def test_pool_settings_that_cannot_work_are_refused() -> None:
    with pytest.raises(InvalidRequestError, match="max_age_seconds"):
        DockerBackend(pool=PoolConfig(size=1, max_age_seconds=100), lifetime_seconds=100)
    with pytest.raises(InvalidRequestError, match="attached"):
        DockerBackend(pool=1, container="some-compose-service")


# -- copies of a workspace from the pool (PoolConfig(workspace="mirror"), backend.session(copy_of=...)) --


def copies_pool(size: int, runtime: str | None = None) -> tuple[DockerBackend, SessionPool]:
    backend = DockerBackend(runtime=runtime, pool=PoolConfig(size=size, workspace="mirror"))
    if runtime is not None:
        require(runtime in (backend._client.info().get("Runtimes") or {}), f"{runtime} is not registered")
    assert backend.pool is not None and backend.pool.root is not None
    assert backend.pool.wait_ready(120), backend.pool.stats()
    return backend, backend.pool


def make_source(root: Path) -> Path:
    """A project tree to copy: nested files, an executable, an empty directory, a link inside."""
    source = root / "project"
    (source / "src" / "pkg").mkdir(parents=True)
    (source / "empty").mkdir()
    (source / "README").write_text("the original\n")
    (source / "src" / "pkg" / "mod.py").write_text("VALUE = 1\n")
    (source / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (source / "run.sh").chmod(0o755)
    (source / "readme-link").symlink_to("README")
    return source


def snapshot(root: Path) -> dict[str, tuple[int, int, bytes | str]]:
    """Every entry below ``root`` (links not followed): mode, mtime, content or link target."""
    found: dict[str, tuple[int, int, bytes | str]] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        what: bytes | str = (
            os.readlink(path) if path.is_symlink() else path.read_bytes() if path.is_file() else b""
        )
        found[str(path.relative_to(root))] = (info.st_mode, info.st_mtime_ns, what)
    return found


@pytest.mark.parametrize("runtime", [None, "runsc"], ids=["runc", "runsc"])
def test_a_pooled_copy_sees_the_tree_and_its_writes_stay_in_the_copy(
    tmp_path: Path, runtime: str | None
) -> None:
    source = make_source(tmp_path)
    before = snapshot(source)
    backend, pool = copies_pool(1, runtime)
    client = backend._client
    try:
        ready = pool_containers(client, pool)
        assert len(ready) == 1
        asked = time.time()
        session = backend.session(copy_of=source)
        copy = session.workspace
        assert copy is not None and pool.root is not None
        assert Path(copy).parent == Path(pool.root)
        # From the pool: the member made before the acquire, already started, counted as served.
        assert session.container_id in ready
        created = client.api.inspect_container(session.container_id)["Created"]
        assert _seconds(created) < asked
        assert pool.stats().served == 1
        assert session.workspace_transport == "mirror"
        result = run(
            session, "pwd; cat README src/pkg/mod.py readme-link; ./run.sh; test -d empty && echo dir"
        )
        assert result.stdout == f"{copy}\nthe original\nVALUE = 1\nthe original\nran\ndir\n", result.stderr
        assert run(session, "echo changed > README && echo new > made.txt && rm run.sh").exit_code == 0
        # The writes came back to the copy, never to the source.
        assert Path(copy, "README").read_text() == "changed\n"
        assert Path(copy, "made.txt").read_text() == "new\n"
        assert not Path(copy, "run.sh").exists()
        assert snapshot(source) == before
        released = session.container_id
        session.close()
        assert not os.path.lexists(copy), "a closed session's copy was left"
        # Released means destroyed: its directory is never handed out again, nor its container.
        with backend.session(copy_of=source) as again:
            assert again.workspace != copy and again.container_id != released
            assert run(again, "cat README; test -e made.txt || echo fresh").stdout == "the original\nfresh\n"
        wait_removed(pool)
        assert released not in pool_containers(client, pool)
    finally:
        backend.close()
    assert snapshot(source) == before


def _seconds(created: str) -> float:
    """Docker's ``Created`` (RFC 3339 with nanoseconds) as epoch seconds."""
    stamp, _, fraction = created.rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S")) + float(f"0.{fraction or 0}")


def test_the_file_tools_work_over_a_pooled_copy(tmp_path: Path) -> None:
    from adk_sandbox.devtools import DevToolset, Workspace  # noqa: PLC0415 - only this test needs the tool layer

    source = make_source(tmp_path)
    backend, _ = copies_pool(1)
    try:
        with backend.session(copy_of=source) as session:
            assert session.workspace is not None

            async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
                with Workspace(session.workspace, sandbox=session) as ws:  # type: ignore[arg-type]
                    tools = DevToolset(ws)
                    await tools.run("write_file", {"path": "from_tool.txt", "content": "from the tool\n"})
                    seen = await tools.run(
                        "bash", {"command": "pwd; cat from_tool.txt README; echo from bash > made.txt"}
                    )
                    read = await tools.run("read_file", {"path": "made.txt"})
                    return seen, read

            seen, read = asyncio.run(scenario())
            assert seen["stdout"] == f"{session.workspace}\nfrom the tool\nthe original\n", seen
            assert read["content"] == "     1\tfrom bash\n"
        assert not (source / "from_tool.txt").exists() and not (source / "made.txt").exists()
    finally:
        backend.close()


def test_hostile_content_in_the_source_is_neither_followed_nor_copied(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("host secret\n")
    source = make_source(tmp_path)
    (source / "to-secret").symlink_to(secret / "key")  # absolute, outside the source
    (source / "up").symlink_to("../secret")  # relative, climbs out
    (source / "abs-inside").symlink_to(source / "README")  # absolute: leads out of the copy
    os.mkfifo(source / "fifo")  # opening it would block a naive copy
    before = snapshot(source)
    backend, _ = copies_pool(1)
    try:
        with backend.session(copy_of=source) as session:
            copy = Path(str(session.workspace))
            for name in ("to-secret", "up", "abs-inside", "fifo"):
                assert not os.path.lexists(copy / name), name
            assert (copy / "readme-link").is_symlink()  # a link that stays inside is kept
            result = run(session, "cat to-secret up/key 2>&1; ls -A; cat readme-link")
            assert "host secret" not in result.stdout
            assert result.stdout.endswith("README\nempty\nreadme-link\nrun.sh\nsrc\nthe original\n"), result
    finally:
        backend.close()
    assert snapshot(source) == before
    assert (secret / "key").read_text() == "host secret\n"


def test_a_copy_without_a_pool_is_a_cold_mirrored_session(tmp_path: Path) -> None:
    source = make_source(tmp_path)
    before = snapshot(source)
    with DockerBackend() as backend:  # a local engine, workspace_transport "auto": a copy still mirrors
        session = backend.session(copy_of=source)
        copy = session.workspace
        assert copy is not None and Path(copy).name.startswith("adk-sandbox-copy-")
        with session:
            assert session.workspace_transport == "mirror"
            assert run(session, "pwd; cat README; echo new > made.txt").stdout == f"{copy}\nthe original\n"
            assert Path(copy, "made.txt").read_text() == "new\n"
        assert not os.path.lexists(copy)
    assert snapshot(source) == before


def test_a_replaced_copies_member_takes_its_directory_along(tmp_path: Path) -> None:
    backend, pool = copies_pool(1)
    client = backend._client
    root = Path(str(pool.root))
    try:
        victim = next(iter(pool_containers(client, pool)))
        (old_copy,) = root.iterdir()
        client.api.kill(victim)
        with backend.session(copy_of=make_source(tmp_path)) as session:
            assert session.container_id != victim
            assert session.restarts == 0
            assert session.workspace != str(old_copy)
        assert pool.stats().replaced >= 1
        assert not old_copy.exists()
    finally:
        backend.close()


def test_a_copy_too_large_for_the_volume_is_refused_and_its_member_destroyed(tmp_path: Path) -> None:
    source = tmp_path / "big"
    source.mkdir()
    (source / "blob").write_bytes(b"\0" * (3 * 1024 * 1024))
    backend = DockerBackend(mirror_size_mb=2, pool=PoolConfig(size=1, workspace="mirror"))
    assert backend.pool is not None and backend.pool.wait_ready(120)
    client, pool = backend._client, backend.pool
    try:
        (member,) = pool_containers(client, pool)
        with pytest.raises(PolicyNotEnforceableError, match="more than its copy in the sandbox may hold"):
            backend.session(copy_of=source)
        wait_removed(pool)
        assert member not in pool_containers(client, pool)
        assert pool.wait_ready(120)
        assert len(list(Path(str(pool.root)).iterdir())) == 1  # the refill's copy only
    finally:
        backend.close()


def test_closing_a_copies_pool_leaves_no_container_and_no_directory(tmp_path: Path) -> None:
    source = make_source(tmp_path)
    backend, pool = copies_pool(2)
    client = backend._client
    held = backend.session(copy_of=source)  # handed out, still open
    backend.session(copy_of=source).close()  # released: its removal queued
    held_copy = held.workspace
    made = pool_containers(client, pool) | {held.container_id}
    backend.close()
    assert pool_containers(client, pool) == set()
    assert all(not _exists(client, container_id) for container_id in made)
    assert held_copy is not None and not os.path.lexists(held_copy)
    assert pool.root is not None and not os.path.lexists(pool.root)


def test_copy_requests_that_cannot_work_are_refused(tmp_path: Path) -> None:
    source = make_source(tmp_path)
    backend, pool = copies_pool(1)
    try:
        with pytest.raises(InvalidRequestError, match="not both"):
            backend.session(workspace=source, copy_of=source)
        with pytest.raises(InvalidRequestError, match="not a directory"):
            backend.session(copy_of=source / "README")
        with pytest.raises(InvalidRequestError, match="holds the directory the copies are made in"):
            backend.session(copy_of=os.path.dirname(str(pool.root)))
        assert pool.stats().served == 0
        # A pool of copies serves copies only: a workspace-less session starts cold.
        with backend.session() as session:
            assert session.container_id not in pool_containers(backend._client, pool)
        assert pool.stats().served == 0
    finally:
        backend.close()
    with pytest.raises(ValidationError):
        PoolConfig(size=1, workspace="bind")  # type: ignore[arg-type]


def test_a_sigkilled_owners_copies_are_removed_by_the_next_backend(tmp_path: Path) -> None:
    source = make_source(tmp_path)
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import time
            from adk_sandbox.executor.backends.docker import DockerBackend, PoolConfig
            backend = DockerBackend(pool=PoolConfig(size=1, workspace="mirror"))
            pooled = backend.session(copy_of={str(source)!r})  # a copy handed out, one member ready
            cold = DockerBackend().session(copy_of={str(source)!r})
            assert backend.pool.wait_ready(120)
            print(backend.pool.root, pooled.workspace, cold.workspace, flush=True)
            time.sleep(600)
        """),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert owner.stdout is not None
    root, pooled, cold = owner.stdout.readline().split()
    try:
        assert (Path(pooled) / "README").read_text() == "the original\n"
        assert (Path(cold) / "README").read_text() == "the original\n"
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    assert os.path.isdir(root) and os.path.isdir(cold)  # a SIGKILL gives the owner no chance to clean up
    with DockerBackend() as backend:
        assert {root, cold} <= set(backend.reaped_copies)
    assert not os.path.lexists(root) and not os.path.lexists(cold)
