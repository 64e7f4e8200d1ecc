"""Snapshots of the task profile's root filesystem under gVisor (issue 24, docs/snapshots.md).

gVisor keeps a root's writes in its own sandbox: ``docker commit`` sees none of them (the naive design,
which the first test would catch: the fork would start from the bare image). The snapshot reads the
changes from inside; a session from it removes what was removed and unpacks the rest. One parent session
is shared by the module; it is prepared as an eval's setup would be (a user added, a package-like tree
written, image files deleted and replaced).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator

import docker
import pytest

from adk_sandbox.executor import ExecRequest, SandboxFailedError
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from adk_sandbox.executor.snapshots import Snapshot, SnapshotStore
from tests.conftest import require

pytestmark = pytest.mark.docker

PREPARE = """
set -e
useradd -m bob
mkdir -p /testbed/pkg && echo 'v = 1' > /testbed/pkg/mod.py
echo replaced > /etc/issue
rm -f /etc/motd
rm -rf /srv
ln -s /testbed/pkg/mod.py /opt/link
echo tmp-state > /tmp/state
"""
CHECK = (
    "id -un bob; cat /testbed/pkg/mod.py /etc/issue /tmp/state; readlink /opt/link; "
    "test -e /etc/motd || echo no-motd; test -e /srv || echo no-srv"
)
EXPECTED = "bob\nv = 1\nreplaced\ntmp-state\n/testbed/pkg/mod.py\nno-motd\nno-srv\n"


def out(session: DockerSession, script: str) -> str:
    result = session.execute(ExecRequest(argv=("sh", "-c", script), timeout=60))
    assert result.exit_code == 0, result
    return result.stdout


@pytest.fixture(scope="module")
def gvisor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DockerBackend]:
    client = docker.from_env()
    try:
        require("runsc" in (client.info().get("Runtimes") or {}), "runsc is not registered (scripts/setup)")
    finally:
        client.close()
    with DockerBackend(runtime="runsc", profile="task") as backend:
        backend.snapshots = SnapshotStore(tmp_path_factory.mktemp("gvisor-root") / "snapshots")
        yield backend


@pytest.fixture(scope="module")
def parent(gvisor: DockerBackend) -> Iterator[DockerSession]:
    with gvisor.session() as session:
        out(session, PREPARE)
        yield session


@pytest.fixture(scope="module")
def snap(parent: DockerSession) -> Snapshot:
    assert parent.capabilities().snapshots == ("files",)
    return parent.snapshot(name="prepared")


def test_a_fork_has_the_roots_writes_and_removals(gvisor: DockerBackend, snap: Snapshot) -> None:
    assert snap.root_archive and snap.root_image is None
    with gvisor.session(snapshot=snap) as fork:
        assert out(fork, CHECK) == EXPECTED


def test_forks_and_the_parent_see_nothing_of_each_others_root_writes(
    gvisor: DockerBackend, parent: DockerSession, snap: Snapshot
) -> None:
    """A fork rewrites and deletes image files and the snapshot's as root; sibling and parent keep theirs."""
    with gvisor.session(snapshot=snap) as one, gvisor.session(snapshot=snap) as two:
        out(one, "echo one > /etc/issue; rm -rf /testbed /etc/passwd.bak; echo x > /usr/local/bin/planted")
        assert out(two, CHECK) == EXPECTED
        assert out(two, "test -e /usr/local/bin/planted || echo clean") == "clean\n"
    assert out(parent, CHECK) == EXPECTED


def test_a_fork_of_a_fork_keeps_the_first_generations_changes(gvisor: DockerBackend, snap: Snapshot) -> None:
    """Restored files count as the fork's own changes (their ctime is the restore's), removals too."""
    with gvisor.session(snapshot=snap) as fork:
        out(fork, "echo second > /testbed/second")
        again = fork.snapshot(name="second-generation")
        try:
            with gvisor.session(snapshot=again) as grandchild:
                assert out(grandchild, CHECK + "; cat /testbed/second") == EXPECTED + "second\n"
        finally:
            gvisor.remove_snapshot(again)


def test_the_archive_stays_opaque_on_the_host(snap: Snapshot) -> None:
    """The root's changes are bytes in 0600 files of the snapshot; nothing of them is unpacked here."""
    names = sorted(os.listdir(snap.path))
    assert "root.tar" in names and "root.dirs" in names
    for name in ("root.tar", "root.dirs"):
        info = os.lstat(os.path.join(snap.path, name))
        assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
    assert not any(name in {"etc", "testbed", "opt", "usr"} for name in names)


def test_a_snapshot_of_another_image_build_is_refused_and_leaves_nothing(
    gvisor: DockerBackend, snap: Snapshot
) -> None:
    """Its lists describe changes to one image: on another build they would remove the wrong files."""
    before = {session.session_id for session in gvisor.sessions()}
    other = snap.model_copy(update={"image_id": "sha256:" + "0" * 64})
    with pytest.raises(SandboxFailedError, match="holds changes to image"):
        gvisor.session(snapshot=other)
    assert {session.session_id for session in gvisor.sessions()} == before
