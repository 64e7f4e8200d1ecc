"""Snapshots and forks of Docker sessions on the real engine (issue 24, docs/snapshots.md).

Isolation is tested as attacks: a fork writes everywhere it can, a sandbox leaves a hostile tree for the
snapshot to copy. Each attack's docstring names the naive design it would catch. A backend and a
prepared parent session are shared per module; tests that need a fresh one make it.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from adk_sandbox.executor import (
    ExecRequest,
    ExecResult,
    InvalidRequestError,
    Language,
    PolicyNotEnforceableError,
)
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession, PoolConfig
from adk_sandbox.executor.cli import main
from adk_sandbox.executor.snapshots import SNAPSHOT_LABEL, Snapshot, SnapshotStore
from tests.conftest import require

pytestmark = pytest.mark.docker

HOME = "/home/sandbox"
REPO = "/work/repo"  # the pool's fixed path inside (PoolConfig(path=...))


def run(session: DockerSession, code: str, timeout: float = 30) -> ExecResult:
    return session.execute(ExecRequest(language=Language.COMMAND, code=code, timeout=timeout))


def out(session: DockerSession, code: str) -> str:
    result = run(session, code)
    return result.stdout


def tree_of(root: str) -> dict[str, tuple[str, bytes]]:
    """Every entry below ``root`` (kind, content or link target), links not followed."""
    found: dict[str, tuple[str, bytes]] = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                found[rel] = ("l", os.readlink(path).encode())
            elif os.path.isdir(path):
                found[rel] = ("d", b"")
            else:
                found[rel] = ("f", Path(path).read_bytes())
    return found


def snapshot_images(client: docker.DockerClient, snapshot_id: str) -> list[str]:
    return [str(i.id) for i in client.images.list(filters={"label": f"{SNAPSHOT_LABEL}={snapshot_id}"})]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> SnapshotStore:
    return SnapshotStore(tmp_path_factory.mktemp("snapshot-store") / "snapshots")


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text("print('v1')\n")
    (root / "README").write_text("the project\n")
    return root


@pytest.fixture(scope="module")
def backend(store: SnapshotStore) -> Iterator[DockerBackend]:
    try:
        made = DockerBackend(pool=PoolConfig(size=2, workspace="mirror", path=REPO))
    except Exception as exc:
        require(False, f"the Docker engine is not usable here: {exc}")
        raise
    made.snapshots = store
    yield made
    made.close()


@pytest.fixture(scope="module")
def parent(backend: DockerBackend, source: Path) -> Iterator[DockerSession]:
    """A prepared session: files in the workspace, /tmp and HOME."""
    with backend.session(copy_of=source) as session:
        prepared = run(session, "echo built > src/build.out; echo tmp-state > /tmp/state; echo home > ~/.rc")
        assert prepared.exit_code == 0, prepared
        yield session


@pytest.fixture(scope="module")
def snap(parent: DockerSession) -> Snapshot:
    return parent.snapshot(name="prepared")


@pytest.fixture(scope="module")
def task_backend(store: SnapshotStore) -> Iterator[DockerBackend]:
    with DockerBackend(profile="task") as made:
        made.snapshots = store
        yield made


def test_a_fork_starts_with_the_parents_files_at_the_parents_path(
    backend: DockerBackend, parent: DockerSession, snap: Snapshot
) -> None:
    assert snap.carries == ("files",) and snap.method in ("copy", "reflink") and snap.workspace == REPO
    assert parent.workspace_inside == REPO and parent.workspace != REPO  # the pool's path inside
    assert parent.capabilities().snapshots == ("files",) == backend.capabilities().snapshots
    with backend.session(snapshot=snap) as fork:
        assert fork.origin == snap
        assert fork.workspace_inside == REPO and fork.workspace not in (parent.workspace, REPO)
        assert out(fork, "pwd; cat src/build.out /tmp/state ~/.rc") == f"{REPO}\nbuilt\ntmp-state\nhome\n"
        assert Path(fork.workspace or "", "src", "build.out").read_text() == "built\n"


def test_sibling_forks_and_the_parent_see_nothing_of_a_forks_writes(
    backend: DockerBackend, parent: DockerSession, snap: Snapshot
) -> None:
    """Attack: one fork writes to every writable path. Catches forks that share anything writable: one host
    directory bind-mounted into every fork, a /tmp volume shared among them, or an overlay whose upper
    layer is the parent's (a write in one would show in the others)."""
    before = tree_of(parent.workspace or "")
    with backend.session(snapshot=snap) as first, backend.session(snapshot=snap) as second:
        attack = (
            "for d in . /tmp ~; do echo pwned > $d/pwned; done;"
            "echo pwned >> src/app.py; rm README; echo pwned > /tmp/state; echo pwned > ~/.rc"
        )
        run(first, attack)
        assert out(first, "cat pwned /tmp/pwned ~/pwned") == "pwned\n" * 3
        for other in (second, parent):
            check = (
                "ls pwned /tmp/pwned ~/pwned 2>&1 | grep -c 'No such'; cat src/app.py README /tmp/state ~/.rc"
            )
            assert out(other, check) == "3\nprint('v1')\nthe project\ntmp-state\nhome\n"
        assert Path(first.workspace or "", "pwned").read_text() == "pwned\n"
        assert not Path(second.workspace or "", "pwned").exists()
    assert tree_of(parent.workspace or "") == before


def test_a_fork_cannot_reach_its_parents_host_directory(
    backend: DockerBackend, parent: DockerSession, snap: Snapshot
) -> None:
    """Attack: from inside a fork, write to the parent's host directory's path and look for its mounts.
    Catches a fork that mounts the parent's directory (read-only, or as an overlay's lower layer): its path
    would show the parent's live files, and a write through a missed read-only flag would reach them."""
    host = parent.workspace or ""
    before = tree_of(host)
    with backend.session(snapshot=snap) as fork:
        inspect = backend.client.api.inspect_container(fork.container_id)
        sources = {m.get("Source") for m in inspect["Mounts"]}
        assert host not in sources and snap.path not in sources
        assert not any(str(s or "").startswith(snap.path) for s in sources)
        result = run(fork, f"mkdir -p {host} && echo pwned > {host}/escaped; ls {host}")
        assert result.exit_code != 0 or "escaped" in result.stdout  # its own (read-only root: refused)
    assert tree_of(host) == before
    assert not os.path.exists(os.path.join(host, "escaped"))


def test_a_forks_changes_never_reach_the_parent_and_fork_removes_its_snapshot(
    backend: DockerBackend, parent: DockerSession, store: SnapshotStore
) -> None:
    known = {s.id for s in store.list()}
    fork = parent.fork()
    taken = fork.origin
    assert taken is not None and taken.id not in known and os.path.isdir(taken.path)
    run(fork, "echo fork > src/app.py; echo fork > /tmp/state")
    assert out(parent, "cat src/app.py /tmp/state") == "print('v1')\ntmp-state\n"
    fork_dir = fork.workspace or ""
    fork.close()
    assert not os.path.exists(taken.path) and not os.path.exists(fork_dir)


def test_a_fork_comes_from_the_pool_when_its_path_matches(backend: DockerBackend, snap: Snapshot) -> None:
    pool = backend.pool
    assert pool is not None and pool.serves_snapshot(snap)
    assert pool.wait_ready(120)
    served = pool.stats().served
    with backend.session(snapshot=snap) as fork:
        assert pool.stats().served == served + 1
        assert out(fork, "cat /tmp/state") == "tmp-state\n"


def test_a_snapshot_waits_for_running_commands_and_holds_new_ones_back(parent: DockerSession) -> None:
    started = threading.Event()

    def slow() -> None:
        started.set()
        run(parent, "sleep 1")

    worker = threading.Thread(target=slow)
    worker.start()
    started.wait()
    time.sleep(0.2)
    with pytest.raises(InvalidRequestError, match="still ran"):
        parent.snapshot(wait_seconds=0.1)  # refused: nothing taken
    began = time.monotonic()
    taken = parent.snapshot()
    assert time.monotonic() - began > 0.3  # waited for the sleep
    worker.join()
    parent._remove_snapshot(taken)


def test_task_profile_root_layer_is_carried_and_forks_do_not_share_it(
    task_backend: DockerBackend, source: Path
) -> None:
    """Attack: a task fork writes over the root filesystem. Catches forks that share the parent's root layer
    (one container, or an image that the next fork's writes would land in)."""
    client = task_backend.client
    with task_backend.session(copy_of=source) as parent:
        run(parent, "echo parent > /etc/marker; echo t > /tmp/t")
        taken = parent.snapshot()
        assert taken.root_image is not None and snapshot_images(client, taken.id) == [taken.root_image]
        with task_backend.session(snapshot=taken) as one, task_backend.session(snapshot=taken) as two:
            assert out(one, "cat /etc/marker /tmp/t") == "parent\nt\n"
            run(one, "echo one > /etc/marker; echo one > /usr/local/bin/tool; echo one > /tmp/t")
            assert out(two, "cat /etc/marker /tmp/t; ls /usr/local/bin/tool 2>&1 | grep -c 'No such'") == (
                "parent\nt\n1\n"
            )
            assert out(parent, "cat /etc/marker") == "parent\n"
            with pytest.raises(InvalidRequestError, match="used by a running session"):
                task_backend.remove_snapshot(taken)  # refused: kept as it was
            assert os.path.isdir(taken.path)
    # `snapshots rm` leaves nothing behind: no directory, no image.
    assert main(["snapshots", "--store", str(task_backend.snapshots.root), "rm", taken.id]) == 0
    assert not os.path.exists(taken.path) and snapshot_images(client, taken.id) == []


def test_a_hostile_sandbox_leaves_nothing_dangerous_on_the_host(
    task_backend: DockerBackend, source: Path
) -> None:
    """Attack: a root task sandbox plants links out, FIFOs, set-id files and a huge sparse file.

    Catches ``shutil.copytree`` (follows ``out-abs``/``out-climb`` into the host's /etc, keeps the set-uid
    bit, blocks on the FIFO), ``cp -a`` as root (recreates device nodes and set-id root files on the host),
    unpacking the sandbox's tar on the host (links then writes through them, ``..`` members), and a copy
    that reads a sparse file densely (1000 MiB of holes in a 256 MiB /tmp). Decided: links are copied as
    links only when they stay inside, special files are skipped, set-id bits dropped; tmpfs contents stay
    archives (0600) that only a sandbox unpacks."""
    plant = textwrap.dedent(
        """
        ln -s /etc/shadow out-abs; ln -s ../../../../etc/passwd out-climb; ln -s src/app.py in-link
        mkfifo fifo; cp /bin/true suid; chmod 6755 suid
        ln -s /etc/shadow /tmp/out; mkfifo /tmp/fifo; cp /bin/true /tmp/suid; chmod 4755 /tmp/suid
        truncate -s 1000M /tmp/sparse && ls -l /tmp/sparse
        cp /bin/true /usr/local/bin/rootsuid; chmod 4755 /usr/local/bin/rootsuid
        """
    )
    with task_backend.session(copy_of=source) as hostile:
        assert run(hostile, plant).exit_code == 0
        taken = hostile.snapshot()
        for directory, dirs, files in os.walk(taken.path):
            for name in dirs + files:
                path = os.path.join(directory, name)
                info = os.lstat(path)
                assert not info.st_mode & (stat.S_ISUID | stat.S_ISGID), path
                assert (
                    stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)
                ), path
                if stat.S_ISLNK(info.st_mode):
                    assert os.path.realpath(path).startswith(taken.workspace_dir + "/"), path
        assert os.readlink(os.path.join(taken.workspace_dir, "in-link")) == "src/app.py"
        for index in range(len(taken.tmpfs)):
            info = os.lstat(taken.archive(index))
            assert stat.S_ISREG(info.st_mode) and info.st_mode & 0o777 == 0o600
        assert (
            taken.size_bytes < 64 * 1024 * 1024
        )  # the sparse 1000 MiB (4x /tmp's size) travelled as its data
        assert not os.path.lexists(os.path.join(taken.workspace_dir, "out-abs"))  # pull-back refused it
        with task_backend.session(snapshot=taken) as fork:
            # Inside its own sandbox the fork has what the parent had (its /tmp is the parent's, as a copy).
            listing = out(
                fork, "ls -l /tmp/suid /usr/local/bin/rootsuid; readlink /tmp/out; stat -c %s /tmp/sparse"
            )
            assert "/etc/shadow" in listing and str(1000 * 1024**2) in listing
            assert not os.path.lexists(os.path.join(fork.workspace or "", "out-abs"))
            assert not os.stat(os.path.join(fork.workspace or "", "suid")).st_mode & stat.S_ISUID
        task_backend.remove_snapshot(taken)


def test_a_snapshot_over_its_cap_is_refused_and_leaves_nothing(
    task_backend: DockerBackend, source: Path
) -> None:
    client = task_backend.client
    store = task_backend.snapshots
    with task_backend.session(copy_of=source) as session:
        before = {s.id for s in store.list()}
        run(session, "head -c 3000000 /dev/urandom > /tmp/big")
        with pytest.raises(PolicyNotEnforceableError, match="cap"):
            session.snapshot(max_mb=2)
        run(session, "rm /tmp/big; head -c 3000000 /dev/urandom > /etc/big")
        with pytest.raises(PolicyNotEnforceableError, match="root filesystem"):
            session.snapshot(max_mb=2)
        assert {s.id for s in store.list()} == before
        assert [n for n in os.listdir(store.root) if n.startswith(".")] == []
        labelled = client.images.list(filters={"label": SNAPSHOT_LABEL})
        assert all(i.labels.get(SNAPSHOT_LABEL) in before for i in labelled)


def test_a_snapshot_outlives_its_process_and_is_reaped_after_its_owner_or_expiry(
    task_backend: DockerBackend, store: SnapshotStore
) -> None:
    """Taken in a subprocess: the detached one is read here after that process ended; an owned one (with a
    root image) goes with its owner's normal exit, directory and image (before, it stayed until a reaper
    ran); one whose owner ended without exit handlers (``os._exit``, as SIGKILL) is reaped once its owner
    is gone, and one past its expiry too: no directory, no image."""
    script = textwrap.dedent(
        f"""
        import os, sys
        from adk_sandbox.executor import DockerBackend, ExecRequest, Language
        from adk_sandbox.executor.snapshots import SnapshotStore
        with DockerBackend(profile="task") as backend:
            backend.snapshots = SnapshotStore({str(store.root)!r})
            with backend.session() as session:
                request = ExecRequest(language=Language.COMMAND, code="echo kept > /tmp/kept", timeout=30)
                session.execute(request)
                if sys.argv[1] == "exit":
                    print(session.snapshot(name="detached", detached=True, ttl_seconds=600).id)
                print(session.snapshot(name="owned").id, flush=True)
        if sys.argv[1] == "_exit":
            os._exit(0)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    ids = []
    for ending in ("exit", "_exit"):
        child = subprocess.run(
            [sys.executable, "-c", script, ending],
            capture_output=True, text=True, env=env, timeout=300, check=False,
        )  # fmt: skip
        assert child.returncode == 0, child.stderr
        ids += child.stdout.split()
    detached_id, gone_id, owned_id = ids
    with pytest.raises(InvalidRequestError):
        store.get(gone_id)
    assert snapshot_images(task_backend.client, gone_id) == []
    detached, owned = store.get(detached_id), store.get(owned_id)
    assert detached.owner == {} and owned.owner and owned.root_image
    client = task_backend.client
    removed = task_backend.reap_snapshots()
    assert any(line.startswith(owned_id) for line in removed)
    assert not os.path.exists(owned.path) and snapshot_images(client, owned_id) == []
    with task_backend.session(snapshot=detached_id) as restored:
        assert out(restored, "cat /tmp/kept") == "kept\n"
    with task_backend.session() as session:
        short = session.snapshot(ttl_seconds=1)
    time.sleep(1.5)
    assert any(line.startswith(short.id) for line in task_backend.reap_snapshots())
    assert not os.path.exists(short.path) and snapshot_images(client, short.id) == []
    task_backend.remove_snapshot(detached)
    assert snapshot_images(client, detached_id) == []


def test_gvisor_forks_a_hardened_session(store: SnapshotStore, source: Path) -> None:
    """The task profile's root under gVisor: tests/integration/test_docker_snapshot_gvisor_root.py."""
    client = docker.from_env()
    try:
        require("runsc" in (client.info().get("Runtimes") or {}), "runsc is not registered (scripts/setup)")
    finally:
        client.close()
    with DockerBackend(runtime="runsc") as gvisor:
        gvisor.snapshots = store
        with gvisor.session(copy_of=source) as parent:
            run(parent, "echo g > /tmp/g")
            with parent.fork() as fork:
                assert out(fork, "cat /tmp/g src/app.py") == "g\nprint('v1')\n"


def test_a_snapshot_of_another_profile_or_with_other_arguments_is_refused(
    backend: DockerBackend, task_backend: DockerBackend, snap: Snapshot, source: Path
) -> None:
    with pytest.raises(InvalidRequestError, match="hardened"):
        task_backend.session(snapshot=snap)
    with pytest.raises(InvalidRequestError, match="not with"):
        backend.session(snapshot=snap, copy_of=source)
    with pytest.raises(InvalidRequestError, match="no snapshot"):
        backend.session(snapshot="no-such-snapshot")


def test_a_bound_workspace_with_links_out_and_fifos_is_copied_safely(
    backend: DockerBackend, tmp_path: Path
) -> None:
    """Attack: a session bound to a host directory (its links and FIFOs land on the host as made) is
    snapshotted. Catches ``shutil.copytree(symlinks=False)`` (copies the host's /etc/passwd into the
    snapshot, served to every fork) and ``symlinks=True`` (keeps ``out-abs``: a host tool in the fork's
    directory follows it to the host's file), and any copy that opens the FIFO (hangs)."""
    workspace = tmp_path / "bound"
    workspace.mkdir()
    (workspace / "keep.txt").write_text("keep\n")
    with backend.session(workspace=workspace) as bound:
        assert bound.workspace_transport == "bind"
        plant = "ln -s /etc/passwd out-abs; ln -s ../../.. out-climb; ln -s keep.txt in-link; mkfifo fifo"
        assert run(bound, plant).exit_code == 0
        assert os.path.islink(workspace / "out-abs") and stat.S_ISFIFO(os.lstat(workspace / "fifo").st_mode)
        taken = bound.snapshot()
    names = set(os.listdir(taken.workspace_dir))
    assert names == {"keep.txt", "in-link"}, names
    assert {line.split(":")[0] for line in taken.skipped} >= {"out-abs", "out-climb"}
    with backend.session(snapshot=taken) as fork:
        assert fork.workspace_inside == str(workspace) and fork.workspace != str(workspace)
        assert out(fork, "cat in-link; echo fork > keep.txt") == "keep\n"
    assert (workspace / "keep.txt").read_text() == "keep\n"
    backend.remove_snapshot(taken)


@pytest.fixture(scope="module")
def forkable(store: SnapshotStore) -> Iterator[DockerBackend]:
    """A pool whose members keep /tmp and HOME in tmpfs volumes this process copies on the host."""
    require(os.geteuid() == 0, "forkable pools need root on the engine's machine (its volumes)")
    with DockerBackend(pool=PoolConfig(size=2, workspace="mirror", path=REPO, forkable=True)) as made:
        made.snapshots = store
        yield made


def test_forkable_forks_copy_tmp_and_home_on_the_host_and_siblings_see_nothing(
    forkable: DockerBackend, source: Path
) -> None:
    """Attack: a fork of a forkable session writes to every writable path (workspace, /tmp, HOME), checked
    from the host in every tmpfs volume. Catches forks that share a host directory or a volume for /tmp or
    HOME (one volume mounted into every fork, or the parent's volume copied by reference), and a host copy
    that leaves the command user unable to write what it owned in the parent."""
    with forkable.session(copy_of=source) as parent:
        assert set(parent.state_dirs) == {"/tmp", HOME}
        assert run(parent, "echo tmp-state > /tmp/state; echo home > ~/.rc; mkdir /tmp/d").exit_code == 0
        taken = parent.snapshot()
        assert taken.tmpfs_format == "tree" and os.path.isdir(taken.tree(0))
        with forkable.session(snapshot=taken) as one, forkable.session(snapshot=taken) as two:
            assert one.state_dirs and not set(one.state_dirs.values()) & set(parent.state_dirs.values())
            attack = "for d in . /tmp /tmp/d ~; do echo pwned > $d/pwned; done; echo pwned > /tmp/state"
            assert run(one, attack).exit_code == 0  # the files it inherited are its own to write
            assert Path(one.state_dirs["/tmp"], "pwned").read_text() == "pwned\n"
            for other in (two, parent):
                for host in other.state_dirs.values():
                    assert not any(name == "pwned" for _, _, files in os.walk(host) for name in files)
                assert Path(other.state_dirs["/tmp"], "state").read_text() == "tmp-state\n"
                assert out(other, "cat /tmp/state ~/.rc") == "tmp-state\nhome\n"
            assert not any(name == "pwned" for _, _, files in os.walk(taken.path) for name in files)
        forkable.remove_snapshot(taken)


def test_a_forkable_snapshot_whose_directories_together_pass_the_cap_is_refused(
    forkable: DockerBackend, source: Path
) -> None:
    """/tmp and HOME each hold 1.5 MB, under a 2 MiB cap alone, 3 MB together. The host copies them at
    once, each within the whole cap: the sum is what is refused, and nothing of the copies is left. Catches
    parallel copies that check only each directory against the cap."""
    store = forkable.snapshots
    with forkable.session(copy_of=source) as session:
        before = {s.id for s in store.list()}
        fill = "head -c 1500000 /dev/urandom > /tmp/half; head -c 1500000 /dev/urandom > ~/half"
        assert run(session, fill).exit_code == 0
        with pytest.raises(PolicyNotEnforceableError, match="cap of 2 MiB"):
            session.snapshot(max_mb=2)
        assert {s.id for s in store.list()} == before
        assert [n for n in os.listdir(store.root) if n.startswith(".")] == []


def test_a_hostile_tmp_in_a_forkable_session_is_copied_safely_on_the_host(
    forkable: DockerBackend, source: Path, tmp_path: Path
) -> None:
    """Attack: the sandbox plants in its host-side /tmp and HOME a link to a host file, a link climbing out,
    a FIFO and a set-id file, then is snapshotted and forked. Catches a host copy of /tmp that follows links
    (the host's file copied into the snapshot, or a fork's write landing on it), opens the FIFO (hangs),
    or keeps set-id bits on the host; the walk is the workspace's (walk_copy)."""
    secret = tmp_path / "host-secret"
    secret.write_text("host only\n")
    plant = (
        f"ln -s {secret} /tmp/out-abs; ln -s ../../../../../../etc /tmp/out-climb; ln -s state /tmp/in;"
        "echo s > /tmp/state; mkfifo /tmp/fifo ~/fifo; cp /bin/true /tmp/suid; chmod 4755 /tmp/suid;"
        "ls -l /tmp/suid"
    )
    with forkable.session(copy_of=source) as hostile:
        run(hostile, plant)  # the hardened filter may refuse the set-id mode: the rest is planted
        taken = hostile.snapshot()
        for directory, dirs, files in os.walk(taken.path):
            for name in dirs + files:
                path = os.path.join(directory, name)
                info = os.lstat(path)
                assert not info.st_mode & (stat.S_ISUID | stat.S_ISGID), path
                assert not (stat.S_ISFIFO(info.st_mode) or stat.S_ISCHR(info.st_mode)), path
                if stat.S_ISLNK(info.st_mode):
                    assert os.path.realpath(path).startswith(taken.tree(0) + "/"), path
        names = set(os.listdir(taken.tree(0)))
        assert {"state", "in"} <= names and not names & {"out-abs", "out-climb", "fifo"}
        with forkable.session(snapshot=taken) as fork:
            assert out(fork, "cat /tmp/in; echo pwned > /tmp/out-abs 2>&1; ls /tmp").startswith("s\n")
        assert secret.read_text() == "host only\n"
        forkable.remove_snapshot(taken)


def _stat_tree(root: str) -> dict[str, tuple[int, int, int, int]]:
    """Every entry below ``root`` as (mode, uid, gid, mtime_ns), links not followed."""
    found = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            info = os.lstat(os.path.join(directory, name))
            found[os.path.relpath(os.path.join(directory, name), root)] = (
                info.st_mode, info.st_uid, info.st_gid, info.st_mtime_ns,
            )  # fmt: skip
    return found


def test_a_forkable_fork_gets_its_workspace_on_the_host_and_both_ways_still_sync(
    forkable: DockerBackend, source: Path
) -> None:
    """The fork's workspace copy in the sandbox is filled on the host, not pushed through the channel (a
    push restores whole-second mtimes, the host copy keeps the nanoseconds), as the command user; then the
    mirror syncs as after a push: a change inside comes back by the normal pull-back, a change on the host
    reaches the sandbox, and a deletion on either side stays a deletion on both. Catches a host-side fill
    that does not tell the mirror what the sandbox holds (the first pull-back would fetch, or delete, the
    wrong files; a host edit would not be pushed), and a fill whose files the command user cannot write."""
    with forkable.session(copy_of=source) as parent:
        assert run(parent, "echo gone > gone.txt; echo kept > host-gone.txt").exit_code == 0
        fine = 1_704_164_645_123_456_789  # an mtime with nanoseconds, on the host (the truth)
        os.utime(Path(parent.workspace or "", "README"), ns=(fine, fine))
        taken = parent.snapshot()
        with forkable.session(snapshot=taken) as fork:
            volume = fork.mirror_dir
            assert volume is not None and fork.workspace is not None
            inside = _stat_tree(volume)
            assert inside["README"][3] % 1_000_000_000 == 123456789  # copied on the host, not by tar
            # The first listing's records were predicted on the host, byte for byte (all but the racy
            # files): that pull-back parses nothing unchanged.
            mirror, synced = fork.mirror, fork._workspace
            assert mirror is not None and synced is not None
            listed, _, _ = mirror._list(synced.run)
            racy = {path.encode() for path in mirror._inside_racy}
            assert mirror._records and mirror._records == {k: v for k, v in listed.items() if k not in racy}
            user = out(fork, "id -u; id -g").split()
            for path, (mode, uid, gid, _) in inside.items():
                assert (str(uid), str(gid)) == tuple(user), path
                assert not mode & (stat.S_ISUID | stat.S_ISGID), path
            assert set(inside) == set(_stat_tree(fork.workspace))
            assert fork.mirror is not None
            # Inside: change, delete, create; all of it comes back to the host by the pull-back.
            assert run(fork, "echo v2 > src/app.py; rm gone.txt; mkdir new; echo n > new/f").exit_code == 0
            host = Path(fork.workspace)
            assert (host / "src" / "app.py").read_text() == "v2\n"
            assert (host / "new" / "f").read_text() == "n\n"
            assert not (host / "gone.txt").exists()
            # On the host: change, delete, create; all of it reaches the sandbox before the next command.
            (host / "README").write_text("host edit\n")
            (host / "host-gone.txt").unlink()
            (host / "from-host").write_text("h\n")
            listing = "cat README from-host; ls; test -e gone.txt || echo no; test -e host-gone.txt || echo 0"
            assert out(fork, listing) == "host edit\nh\nREADME\nfrom-host\nnew\nsrc\nno\n0\n"
            assert not (host / "gone.txt").exists() and not (host / "host-gone.txt").exists()
            assert not Path(volume, "host-gone.txt").exists() and not Path(volume, "gone.txt").exists()
            # The parent, the snapshot and a sibling saw none of it (checked on the host).
            with forkable.session(snapshot=taken) as sibling:
                for other in (parent.workspace, parent.mirror_dir, taken.workspace_dir, sibling.workspace,
                              sibling.mirror_dir):  # fmt: skip
                    assert other is not None
                    assert Path(other, "src", "app.py").read_text() == "print('v1')\n", other
                    assert Path(other, "gone.txt").exists() and not Path(other, "new").exists(), other
        forkable.remove_snapshot(taken)


def test_a_hostile_snapshot_workspace_is_copied_safely_into_a_forkable_member(
    forkable: DockerBackend, source: Path, tmp_path: Path
) -> None:
    """Attack: the snapshot's workspace on the host holds a link to a host file, a link climbing out, a
    FIFO, a set-id file and a hard link to a host file (a snapshot directory tampered with, or a copy made
    by a naive walk); a fork from it gets its workspace copied on the host into the member's volume. Catches
    a fill of the volume that follows links (the host file copied in, or a write in the fork landing on
    it), opens the FIFO (hangs), keeps set-id bits in the sandbox's copy, or links instead of copying."""
    secret = tmp_path / "host-secret"
    secret.write_text("host only\n")
    with forkable.session(copy_of=source) as parent:
        taken = parent.snapshot()
    planted = Path(taken.workspace_dir)
    (planted / "out-abs").symlink_to(secret)
    (planted / "out-climb").symlink_to("../../../../../../../../etc")
    os.mkfifo(planted / "fifo")
    (planted / "suid").write_bytes(b"#!/bin/sh\n")
    os.chmod(planted / "suid", 0o4755)  # noqa: S103 - the attack: a set-id file in the snapshot
    fine = 1_704_164_645_123_456_789
    os.utime(planted / "suid", ns=(fine, fine))
    os.link(secret, planted / "hard")
    with forkable.session(snapshot=taken) as fork:
        assert fork.mirror_dir is not None and fork.workspace is not None
        for root in (fork.mirror_dir, fork.workspace):
            names = set(os.listdir(root))
            assert {"README", "src", "suid", "hard"} <= names, names
            assert not names & {"out-abs", "out-climb", "fifo"}, names
            for path, (mode, _, _, _) in _stat_tree(root).items():
                assert stat.S_ISREG(mode) or stat.S_ISDIR(mode), path
                assert not mode & (stat.S_ISUID | stat.S_ISGID), path
            assert os.lstat(Path(root, "hard")).st_ino != os.lstat(secret).st_ino
            assert os.lstat(Path(root, "suid")).st_mtime_ns == fine  # copied on the host (tar: seconds)
        attack = "echo pwned > hard; echo pwned > out-abs; ls -l suid"
        assert "rwx" in out(fork, attack)
        assert Path(fork.workspace, "hard").read_text() == "pwned\n"
    assert secret.read_text() == "host only\n"
    forkable.remove_snapshot(taken)


def test_a_forks_refill_waits_for_its_first_command_or_its_close(
    forkable: DockerBackend, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The member a fork takes is replaced only once the fork's first command ended (or the fork closed),
    so the replacement's create+start does not compete with that command for the engine's machine. The
    fallback delay is made long here: each wait below ends by the fork's command or close, never by it."""
    from adk_sandbox.executor.backends.docker import pool as pool_module  # noqa: PLC0415

    monkeypatch.setattr(pool_module, "REFILL_DEFER_SECONDS", 120.0)
    pool = forkable.pool
    assert pool is not None
    with forkable.session(copy_of=source) as parent:
        taken = parent.snapshot()
        for ends_by in ("first command", "close"):
            assert pool.wait_ready(60)
            fork = forkable.session(snapshot=taken)
            try:
                stats = pool.stats()
                assert (stats.ready, stats.creating) == (1, 0), (ends_by, stats)  # deferred, not started
                if ends_by == "first command":
                    assert run(fork, "true").exit_code == 0
                    assert pool.wait_ready(60), "the refill did not start when the first command ended"
            finally:
                fork.close()
            assert pool.wait_ready(60), f"the refill did not start by the fork's {ends_by}"
        forkable.remove_snapshot(taken)
