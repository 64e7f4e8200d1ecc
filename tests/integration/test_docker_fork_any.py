"""Forks of any session: an ordinary session forks by layer into a spare, with no pool configured for it.

``DockerBackend()`` with its defaults, a session bound to a host directory (the session users have): its
snapshot reads ``/tmp`` and HOME on the host through the container's ``/proc/<pid>/root`` (runc), and the
fork takes the backend's spare for that path, its state mounted as overlays over the snapshot's copies
(docs/snapshots.md, "Forks of any session"). On d163729 every such fork started cold (``fork_method ==
"copy"``: a new container, the workspace pushed and ``/tmp`` unpacked through the channel).

One backend, one parent, one fork shared by the module; the attacks plant what a hostile parent can in
its own ``/tmp`` and check from the host what the snapshot and the fork hold.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from adk_sandbox.executor import ExecRequest, ExecResult, Language
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession, PoolConfig
from adk_sandbox.executor.backends.docker.config import DockerConfig
from tests.conftest import require

pytestmark = pytest.mark.docker

HOME = "/home/sandbox"


def outside_tmp(prefix: str) -> Path:
    """A fresh directory outside /tmp (a spare's path may not be in the sandbox's own tmpfs): the cache."""
    cache = Path.home() / ".cache"
    cache.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=cache))


def run(session: DockerSession, code: str) -> ExecResult:
    return session.execute(ExecRequest(language=Language.COMMAND, code=code, timeout=60))


def ok(session: DockerSession, code: str) -> str:
    result = run(session, code)
    assert result.exit_code == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def secret_dir() -> Iterator[Path]:
    """A host directory holding a secret a naive host-side copy would read by following a planted link."""
    path = outside_tmp("adk-fork-any-secret-")
    (path / "secret").write_text("host-secret-" + uuid.uuid4().hex)
    yield path
    (path / "secret").unlink()
    path.rmdir()


@pytest.fixture(scope="module")
def backend() -> Iterator[DockerBackend]:
    require(os.geteuid() == 0, "forks by layer mount on the host: they need root on the engine's machine")
    made = DockerBackend()
    yield made
    made.close()


@pytest.fixture(scope="module")
def workspace() -> Iterator[Path]:
    """The parent's host directory: outside /tmp (a pool's path may not be in the sandbox's own tmpfs)."""
    path = outside_tmp("adk-fork-any-")
    (path / "src.py").write_text("print('parent')\n")
    yield path
    for child in sorted(path.rglob("*"), reverse=True):
        child.unlink() if not child.is_dir() or child.is_symlink() else child.rmdir()
    path.rmdir()


@pytest.fixture(scope="module")
def parent(backend: DockerBackend, workspace: Path, secret_dir: Path) -> Iterator[DockerSession]:
    session = backend.session(workspace=str(workspace))
    ok(
        session,
        "echo tmp-state > /tmp/state && mkdir -p /tmp/deep/er && echo deep > /tmp/deep/er/f && "
        f"echo home-state > {HOME}/.rc && "
        # What a hostile parent plants for the host to trip over (the copy is made on the host):
        f"ln -s {secret_dir} /tmp/escape && ln -s / /tmp/hostroot && ln -s ../../../../{secret_dir} "
        f"/tmp/climb && mkfifo /tmp/fifo && echo data > /tmp/setuid && chmod 4755 /tmp/setuid 2>/dev/null; "
        "true",
    )
    yield session
    session.close()


@pytest.fixture(scope="module")
def fork(parent: DockerSession) -> Iterator[DockerSession]:
    child = parent.fork()
    yield child
    child.close()


def test_an_ordinary_session_forks_by_layer(fork: DockerSession, workspace: Path) -> None:
    """Old code: ``fork_method == "copy"`` (a cold container, everything through the channel)."""
    assert fork.fork_method == "overlay"
    assert fork.workspace_inside == str(workspace)
    assert ok(fork, f"cat {workspace}/src.py /tmp/state /tmp/deep/er/f {HOME}/.rc") == (
        "print('parent')\ntmp-state\ndeep\nhome-state\n"
    )


def test_forks_and_parent_run_apart(parent: DockerSession, fork: DockerSession, workspace: Path) -> None:
    """A write in the fork reaches neither the parent (checked on the host and inside) nor a sibling."""
    sibling = parent.fork()
    try:
        ok(fork, f"echo fork > {workspace}/src.py && echo fork > /tmp/state && echo fork > {HOME}/.rc")
        assert (workspace / "src.py").read_text() == "print('parent')\n"
        assert ok(parent, f"cat /tmp/state {HOME}/.rc") == "tmp-state\nhome-state\n"
        assert ok(sibling, f"cat {workspace}/src.py /tmp/state") == "print('parent')\ntmp-state\n"
        ok(parent, "echo later > /tmp/later")
        assert run(fork, "cat /tmp/later").exit_code != 0
    finally:
        sibling.close()


def test_a_hostile_parents_links_fifos_and_setid_files_stay_out(
    fork: DockerSession, secret_dir: Path
) -> None:
    """The host copies the parent's /tmp through /proc/<pid>/root: a copy that follows links by path
    (``shutil.copytree(symlinks=False)`` of ``/proc/<pid>/root/tmp``) resolves an absolute link against the
    host's root and copies the host's secret; a FIFO would hang it. None of it may reach the snapshot or
    the fork."""
    secret = (secret_dir / "secret").read_text()
    snapshot = fork.origin
    assert snapshot is not None and snapshot.tmpfs_format == "tree"
    for directory, _, files in os.walk(snapshot.path):
        for name in files:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                assert secret not in Path(path).read_text(errors="replace"), path
    listing = ok(fork, "ls -a /tmp")
    assert {"escape", "hostroot", "climb", "fifo"}.isdisjoint(listing.split())
    read = run(fork, f"cat /tmp/escape/secret /tmp/climb/secret /tmp/hostroot{secret_dir}/secret")
    assert secret not in read.stdout + read.stderr
    # (the sandbox's filter refuses set-id modes already; the host copy drops them besides)
    assert int(ok(fork, "stat -c %a /tmp/setuid").strip(), 8) & 0o7000 == 0


def test_closing_a_fork_leaves_no_mount_and_no_snapshot(parent: DockerSession) -> None:
    child = parent.fork()
    snapshot = child.origin
    assert snapshot is not None and child.fork_method == "overlay"
    child.close()
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        assert snapshot.path not in handle.read()
    assert not os.path.exists(snapshot.path)


def test_without_spares_a_fork_starts_cold(workspace: Path) -> None:
    """``DockerConfig(fork_spares=0)``: the old path, still correct (and the /tmp read on the host)."""
    backend = DockerBackend(config=DockerConfig(fork_spares=0))
    try:
        with backend.session(workspace=str(workspace)) as parent:
            ok(parent, "echo cold > /tmp/state")
            with parent.fork() as child:
                assert child.fork_method == "copy"
                assert ok(child, "cat /tmp/state") == "cold\n"
    finally:
        backend.close()


def test_a_copy_from_the_default_pool_forks_by_layer(workspace: Path) -> None:
    """``PoolConfig(workspace="mirror")`` without a path puts each copy in the copies directory
    (``/dev/shm``), where a user's pool path may not be; the backend's own spare may (the copy is mounted
    there already). Old code: cold, ``fork_method == "copy"``."""
    backend = DockerBackend(pool=PoolConfig(size=1, workspace="mirror"))
    try:
        with backend.session(copy_of=str(workspace)) as parent:
            ok(parent, "echo copied > /tmp/state && echo more > more.txt")
            with parent.fork() as child:
                assert child.fork_method == "overlay"
                assert child.workspace_inside == parent.workspace_inside
                assert ok(child, "cat /tmp/state more.txt") == "copied\nmore\n"
    finally:
        backend.close()


def test_the_hosts_namesake_of_the_sandboxs_home_is_never_copied(parent: DockerSession) -> None:
    """The snapshot reads HOME as ``/proc/self/fd/<n>`` of a directory in the container's mount namespace.
    Resolving that path (``realpath``, as a plain walk does) names the *host's* directory of the same name,
    ``/home/sandbox`` here, whose files a naive copy would put in the snapshot and the fork."""
    made = not os.path.exists(HOME)
    os.makedirs(HOME, exist_ok=True)
    marker = Path(HOME) / f"host-only-{uuid.uuid4().hex}"
    marker.write_text("the host's file")
    try:
        with parent.fork() as child:
            assert ok(child, f"cat {HOME}/.rc") == "home-state\n"
            assert run(child, f"ls {HOME}/{marker.name}").exit_code != 0
            origin = child.origin
            assert origin is not None
            for _, _, files in os.walk(origin.path):
                assert marker.name not in files
    finally:
        marker.unlink()
        if made:
            os.rmdir(HOME)
