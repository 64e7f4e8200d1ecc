"""Forks by layer (``PoolConfig(forkable=True, fork_by="layer")``, docs/snapshots.md "Forks by layer").

On the real engine, as root (the mounts are the host's). One pool, one parent and one snapshot shared by
the module. Isolation and the mounts' protections are tested as attacks from inside a fork, checked from
the host (its reading of the container's mountinfo, the snapshot's and the parent's directories); each
attack's docstring names the naive design it would catch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from adk_sandbox.devtools import Workspace
from adk_sandbox.devtools.errors import PathEscapeError
from adk_sandbox.executor import ExecRequest, ExecResult, InvalidRequestError, Language, ResourceLimits
from adk_sandbox.executor._mountinfo import read_mountinfo, top_mounts
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession, PoolConfig
from adk_sandbox.executor.backends.docker._layers import RUN_ROOT, reap_layers
from adk_sandbox.executor.backends.docker._reaper import reap_leaked
from adk_sandbox.executor.snapshots import Snapshot, SnapshotStore
from tests.conftest import require

pytestmark = pytest.mark.docker

REPO = "/work/repo"
HOME = "/home/sandbox"
USER = "1000:1000"
TMPFS_MB = 16


def run(session: DockerSession, code: str) -> ExecResult:
    return session.execute(ExecRequest(language=Language.COMMAND, code=code, timeout=60))


def tree_of(root: str) -> dict[str, bytes | str]:
    """Every entry below ``root``: a file's bytes, a link's target, ``"dir"``; links not followed."""
    found: dict[str, bytes | str] = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                found[rel] = "->" + os.readlink(path)
            elif os.path.isdir(path):
                found[rel] = "dir"
            else:
                found[rel] = Path(path).read_bytes()
    return found


def mounts_below(root: str) -> list[str]:
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        return [line for line in handle if f" {root}/" in line or f" {root} " in line]


def container_tops(session: DockerSession) -> dict[str, tuple[str, frozenset[str], tuple[str, ...]]]:
    """The top mount of each mount point inside, read from the host (the kernel's account)."""
    pid = session._opened().inspect["State"]["Pid"]
    return {p: (m.fstype, m.options, m.super_options) for p, m in top_mounts(read_mountinfo(pid)).items()}


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DockerBackend]:
    require(os.geteuid() == 0, "forks by layer mount on the host: they need root on the engine's machine")
    try:
        made = DockerBackend(
            pool=PoolConfig(size=2, workspace="mirror", path=REPO, forkable=True, fork_by="layer"),
            user=USER,
            limits=ResourceLimits(tmpfs_mb=TMPFS_MB),
            mirror_size_mb=TMPFS_MB,
        )
    except Exception as exc:
        require(False, f"the Docker engine is not usable here: {exc}")
        raise
    made.snapshots = SnapshotStore(tmp_path_factory.mktemp("layer-store") / "snapshots")
    yield made
    made.close()


@pytest.fixture(scope="module")
def parent(backend: DockerBackend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DockerSession]:
    source = tmp_path_factory.mktemp("layer-src")
    (source / "app.py").write_text("print('v1')\n")
    with backend.session(copy_of=source) as session:
        prepared = run(session, "echo built > build.out; echo tmp-state > /tmp/state; echo home > ~/.rc")
        assert prepared.exit_code == 0, prepared
        yield session


@pytest.fixture(scope="module")
def snap(parent: DockerSession) -> Snapshot:
    return parent.snapshot(name="layer-base")


def test_forks_see_the_snapshot_and_their_writes_reach_no_one_else(
    backend: DockerBackend, parent: DockerSession, snap: Snapshot
) -> None:
    """Attack: two forks of one snapshot write to every writable path (workspace, /tmp, HOME), edit a file
    of the snapshot (a copy-up) and delete one. Catches an overlay whose upper is shared between forks or
    is the snapshot's directory itself, and a fork mounted over the parent's directory instead of a copy."""
    before = {"snap": tree_of(snap.path), "parent": tree_of(parent.workspace or "")}
    parent_tmp = tree_of(parent.state_dirs["/tmp"])
    with backend.session(snapshot=snap) as one, backend.session(snapshot=snap) as two:
        assert one.fork_method == two.fork_method == "overlay"
        assert one.workspace_inside == REPO and one.workspace != two.workspace != parent.workspace
        seen = run(one, "cat app.py build.out /tmp/state ~/.rc")
        assert seen.stdout == "print('v1')\nbuilt\ntmp-state\nhome\n", seen
        wrote = run(
            one,
            "echo mine > new.txt; echo v2 > app.py; rm build.out; echo t > /tmp/one; echo h > ~/one; "
            "echo edited > /tmp/state",
        )
        assert wrote.exit_code == 0, wrote
        # The fork's host view is its overlay; the copy-up landed in its own upper only.
        assert Path(one.workspace or "", "app.py").read_text() == "v2\n"
        layers = one.layers
        assert layers is not None
        assert Path(layers.root, "u0", "upper", "app.py").read_text() == "v2\n"
        assert Path(snap.workspace_dir, "app.py").read_text() == "print('v1')\n"
        sibling = run(
            two, "cat app.py build.out /tmp/state; ls new.txt /tmp/one ~/one 2>&1 | grep -c 'No such'"
        )
        assert sibling.stdout == "print('v1')\nbuilt\ntmp-state\n3\n", sibling
    assert tree_of(snap.path) == before["snap"]
    assert tree_of(parent.workspace or "") == before["parent"]
    assert tree_of(parent.state_dirs["/tmp"]) == parent_tmp
    assert run(parent, "cat app.py /tmp/state").stdout == "print('v1')\ntmp-state\n"


def test_attacks_from_inside_a_fork_find_its_mounts_inert_and_capped(
    backend: DockerBackend, snap: Snapshot
) -> None:
    """Attacks from a fork: it plants a set-uid root program and a device node (here put there by the host,
    as a hostile layer could hold them), tries to unmount or remount its overlays `suid`, fills /tmp past
    its cap, and plants a link to `/` in its workspace. Catches an overlay mounted without nosuid,nodev,
    one mounted without a size cap (or whose upper is the host's /dev/shm), a sandbox holding
    CAP_SYS_ADMIN over its mounts, and host file tools or a snapshot that follow the fork's links."""
    shm = os.statvfs("/dev/shm")
    with backend.session(snapshot=snap) as fork:
        tops = container_tops(fork)
        for path in (REPO, "/tmp", HOME):
            fstype, options, _ = tops[path]
            assert fstype == "overlay" and {"nosuid", "nodev"} <= options, (path, tops[path])
        host = fork.workspace or ""
        assert run(fork, f"cp /usr/bin/id {REPO}/myid").exit_code == 0
        os.chown(os.path.join(host, "myid"), 0, 0)
        os.chmod(os.path.join(host, "myid"), 0o4755)  # noqa: S103 - set-uid root, in the fork's layer
        os.mknod(os.path.join(host, "mem"), 0o666 | 0o020000, os.makedev(1, 1))  # /dev/mem's numbers
        setuid = run(fork, "./myid -u; head -c 1 ./mem >/dev/null 2>&1 && echo read-mem || echo no-mem")
        assert setuid.stdout == "1000\nno-mem\n", setuid
        remount = run(fork, f"umount /tmp; umount -l {REPO}; mount -o remount,suid {REPO}; echo done")
        assert remount.stdout.strip().endswith("done")
        after = container_tops(fork)
        for path in (REPO, "/tmp", HOME):
            assert after[path] == tops[path], path
        full = run(fork, f"dd if=/dev/zero of=/tmp/big bs=1M count={TMPFS_MB * 2} 2>&1; echo rc=$?")
        assert "No space left" in full.stdout and "rc=1" in full.stdout, full
        # Not written to the host's /dev/shm either (an uncapped upper there would take 2 x TMPFS_MB; the
        # margin is for the host's other users of /dev/shm meanwhile).
        assert os.statvfs("/dev/shm").f_bavail * shm.f_frsize > shm.f_bavail * shm.f_frsize - TMPFS_MB * 2**20
        assert run(fork, "rm -f /tmp/big; ln -s / root").exit_code == 0
        with Workspace.read_only(host) as tools, pytest.raises(PathEscapeError):
            tools.open_regular("root/etc/hostname")
        taken = fork.snapshot(name="of-a-layered-fork")
    try:
        assert not os.path.lexists(os.path.join(taken.workspace_dir, "root"))
        assert any(note.startswith("root") for note in taken.skipped), taken.skipped
        assert os.stat(os.path.join(taken.workspace_dir, "myid")).st_mode & 0o7000 == 0
        assert not os.path.lexists(os.path.join(taken.workspace_dir, "mem"))
    finally:
        backend.remove_snapshot(taken)


def test_a_closed_fork_leaves_no_mount_and_its_snapshot_is_kept_while_it_runs(
    backend: DockerBackend, snap: Snapshot
) -> None:
    """A snapshot under a live fork is not removed (its lower would vanish under the fork); once the fork
    closes nothing of it stays mounted or on disk. Catches a close that removes the container but leaves
    the overlays and tmpfs mounted on the host."""
    other = backend.session(copy_of=snap.workspace_dir)
    try:
        second = other.snapshot(name="short-lived")
    finally:
        other.close()
    fork = backend.session(snapshot=second)
    layers = fork.layers
    assert layers is not None
    with pytest.raises(InvalidRequestError, match="lower layer of a running fork"):
        backend.remove_snapshot(second)
    fork.close()
    assert mounts_below(layers.root) == [] and not os.path.lexists(layers.root)
    backend.remove_snapshot(second)
    assert not os.path.lexists(second.path)


def test_a_killed_owners_mounts_are_reaped(backend: DockerBackend, tmp_path: Path) -> None:
    """A subprocess owner with a layered pool and a fork is SIGKILLed: its mounts outlive it until the reaper
    unmounts them and removes its directories (and its containers go). Catches a reaper that removes the
    directories but leaves the mounts (or fails on the busy ones)."""
    (tmp_path / "f").write_text("x")
    script = textwrap.dedent(
        f"""
        import sys, time
        from adk_sandbox.executor.backends.docker import DockerBackend, PoolConfig
        pool = PoolConfig(size=1, workspace="mirror", path={REPO!r}, forkable=True, fork_by="layer")
        backend = DockerBackend(pool=pool, user={USER!r})
        parent = backend.session(copy_of={str(tmp_path)!r})
        fork = backend.session(snapshot=parent.snapshot())
        print(fork.layers.root, fork.container_id, flush=True)
        time.sleep(600)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout is not None
        root, container = child.stdout.readline().split()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    assert mounts_below(root) != []  # outlived its owner
    reaped = reap_layers()
    assert root in reaped
    assert [line for line in mounts_below(RUN_ROOT) if f"-{child.pid}-" in line] == []
    assert not [name for name in os.listdir(RUN_ROOT) if f"-{child.pid}-" in name]
    backend.reap_snapshots()
    reap_leaked(backend.client)
    assert backend.client.containers.list(all=True, filters={"id": container}) == []


PEER_GROUPS = """
import json, os
from adk_sandbox.executor.backends.docker._layers import MemberLayers
def peer_group(point):  # of the first mount at point: D's bind onto itself (the base tmpfs is on it)
    for line in open("/proc/self/mountinfo"):
        fields = line.split()
        if fields[4] == point:
            group = [t for t in fields[6 : fields.index("-")] if t.startswith("shared:")]
            return group[0] if group else None
    return None
layers = MemberLayers.create("/work/repo", {"/work/repo": 1, "/tmp": 1}, (os.getuid(), os.getgid()))
try:
    print(json.dumps({"root": peer_group("/"), "points": [peer_group(p) for p in layers.points.values()]}))
finally:
    layers.release()
"""


def test_a_members_mount_points_leave_the_hosts_peer_group() -> None:
    """On a host whose root mount is shared (systemd's default), each member's mount point is a peer group
    of its own, so a fork's mounts on it reach its container and appear nowhere else. Run in a mount
    namespace of its own (unshare) whose root is made shared. Catches a bind of D onto itself made shared
    without being made private first: it joins the root's peer group, and every layer mounted on it would
    appear wherever that mount is shared (other namespaces, other containers binding /run)."""
    require(os.geteuid() == 0, "a layered pool's mount points need root")
    shared = 'mount --make-shared / && exec "$0" -c "$1"'
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "unchanged", "sh", "-c", shared, sys.executable, PEER_GROUPS],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    groups = json.loads(result.stdout)
    assert groups["root"] is not None  # the namespace's root is shared, as on a systemd host
    assert all(group is not None and group != groups["root"] for group in groups["points"]), groups
