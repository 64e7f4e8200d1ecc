"""A workspace that travels (issue 13, step 2): the mirror on the local engine, forced.

Round trips (create, modify, delete, binary, empty directories, 10k files), hostile pull-back (links out,
link-then-write-through, FIFOs, devices, .git writes: nothing outside the workspace, nothing in .git), a
disk bomb stopped at the volume's cap, the file tools over a mirrored workspace, and ``auto`` choosing
bind on the local engine. ``auto`` choosing mirror, and mirror over TLS, are in
test_docker_remote_engine.py (they need the private engine).

The cases that take a ``mirrored`` session run twice: on a Docker session, and on a Kubernetes session
whose Pod is a real hardened container reached through ``pods/exec`` framing (tests/integration/
k8s_on_docker.py): the same mirror over the other backend's channel.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from adk_sandbox.devtools import DevToolset, Workspace
from adk_sandbox.executor import ExecRequest, ExecResult, Language
from adk_sandbox.executor.backend import SandboxSession, SessionFactory
from adk_sandbox.executor.backends.docker import DockerBackend
from adk_sandbox.executor.backends.kubernetes import KubernetesBackend
from adk_sandbox.executor.errors import InvalidRequestError, PolicyNotEnforceableError
from adk_sandbox.executor.workspace.mirror import MirrorWorkspace, _parse_record
from adk_sandbox.executor.workspace.protocol import Run
from adk_sandbox.executor.workspace.pullback import safe_name
from adk_sandbox.executor.workspace.scan import Entry
from tests.integration.k8s_on_docker import backend_on, docker_pod_api

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]


@pytest.fixture(scope="module")
def mirror_backend() -> Iterator[DockerBackend]:
    with DockerBackend(workspace_transport="mirror", mirror_size_mb=64) as backend:
        yield backend


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A workspace owned by uid 1000 inside a parent the tests watch for escapes (``outside``)."""
    root = tmp_path / "ws"
    root.mkdir()
    (tmp_path / "outside").mkdir()
    os.chown(root, 1000, 1000)
    return root


#: Opens a mirrored session of a workspace with a copy of ``cap_mb`` MiB (64 or 16).
Mirrored = Callable[..., SessionFactory]


def docker_mirrored(request: pytest.FixtureRequest) -> Mirrored:
    """The Docker backends of the requesting module, by cap: its ``mirror_backend`` (64 MiB) and
    ``small_mirror_backend`` (16 MiB) fixtures (test_docker_remote_conformance.py gives remote ones)."""
    backends = {64: "mirror_backend", 16: "small_mirror_backend"}
    return lambda cap_mb=64: request.getfixturevalue(backends[cap_mb])


@pytest.fixture(params=["docker", "kubernetes"])
def mirrored(request: pytest.FixtureRequest) -> Iterator[Mirrored]:
    """A backend mirroring workspaces, by its copy's cap: Docker's, or Kubernetes' over a stand-in Pod."""
    if request.param == "docker":
        yield docker_mirrored(request)
        return
    with docker_pod_api() as api:
        made: list[KubernetesBackend] = []

        def kubernetes(cap_mb: int = 64) -> KubernetesBackend:
            made.append(backend_on(api, workspace_mb=cap_mb))
            return made[-1]

        try:
            yield kubernetes
        finally:
            for backend in made:
                backend.close()


def sh(session: SandboxSession, code: str, timeout: float = 60) -> ExecResult:
    return session.execute(ExecRequest(language=Language.COMMAND, code=code, timeout=timeout))


def tree_of(root: Path) -> dict[str, str]:
    """Every entry under ``root``: 'dir', 'link:<target>' or the file's content (hex when binary)."""
    found = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            found[rel] = "link:" + os.readlink(path)
        elif path.is_dir():
            found[rel] = "dir"
        else:
            data = path.read_bytes()
            try:
                found[rel] = data.decode()
            except UnicodeDecodeError:
                found[rel] = data.hex()
    return found


def test_round_trip_create_modify_delete_binary_and_empty_dirs(
    mirror_backend: DockerBackend, workspace: Path
) -> None:
    (workspace / "keep.txt").write_text("keep\n")
    (workspace / "edit.txt").write_text("before\n")
    (workspace / "gone.txt").write_text("to delete\n")
    (workspace / "old").mkdir()
    (workspace / "old" / "inner.txt").write_text("inner\n")
    (workspace / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (workspace / "run.sh").chmod(0o755)
    blob = bytes(range(256)) * 64
    (workspace / "blob.bin").write_bytes(blob)
    with mirror_backend.session(workspace=workspace) as session:
        assert session.workspace_transport == "mirror" and session.capabilities().workspace == "mirror"
        first = sh(session, "pwd; id -u; ./run.sh; cat keep.txt; md5sum blob.bin | cut -c1-32")
        assert first.stdout.splitlines()[:4] == [str(workspace), "1000", "ran", "keep"]
        # The workspace is a copy, not the host's directory.
        mounts = mirror_backend._client.api.inspect_container(session.container_id)["Mounts"]
        assert not any(m.get("Type") == "bind" and m.get("Source") == str(workspace) for m in mounts)
        made = sh(
            session,
            "echo after > edit.txt; rm gone.txt; rm -r old; mkdir -p empty/nested; echo new > new.txt; "
            "head -c 100000 /dev/urandom > rand.bin; md5sum rand.bin | cut -c1-32; chmod 600 keep.txt",
        )
        assert made.exit_code == 0, made.stderr
        assert (workspace / "edit.txt").read_text() == "after\n"
        assert not (workspace / "gone.txt").exists() and not (workspace / "old").exists()
        assert (workspace / "empty" / "nested").is_dir()
        assert (workspace / "new.txt").read_text() == "new\n"
        assert hashlib.md5((workspace / "rand.bin").read_bytes()).hexdigest() == made.stdout.strip()  # noqa: S324
        assert stat.S_IMODE((workspace / "keep.txt").stat().st_mode) == 0o600
        for name in ("new.txt", "rand.bin", "empty", "empty/nested"):
            info = (workspace / name).stat()
            assert (info.st_uid, info.st_gid) == (1000, 1000), name  # the user's, not root's
        # Host-side changes between commands are pushed before the next one (host copy is the truth).
        (workspace / "host.txt").write_text("from the host\n")
        (workspace / "new.txt").unlink()
        (workspace / "blob.bin").write_bytes(b"\x00\xff" * 10)
        seen = sh(
            session, "cat host.txt; test -e new.txt && echo still-there; od -An -tx1 blob.bin | head -1"
        )
        assert seen.stdout.split("\n")[0] == "from the host"
        assert "still-there" not in seen.stdout and "00 ff 00 ff" in seen.stdout
        # The close brings back what a command left.
        sh(session, "echo last > last.txt")
    assert (workspace / "last.txt").read_text() == "last\n"
    assert (workspace / "blob.bin").read_bytes() == b"\x00\xff" * 10  # not pulled back over the host's


def test_ten_thousand_small_files_travel_and_only_changes_come_back(
    mirror_backend: DockerBackend, workspace: Path
) -> None:
    for d in range(100):
        directory = workspace / f"d{d:02}"
        directory.mkdir()
        for f in range(100):
            (directory / f"f{f:02}.txt").write_text(f"{d}-{f}\n")
    with mirror_backend.session(workspace=workspace) as session:
        counted = sh(session, "find . -type f | wc -l; cat d42/f17.txt")
        assert counted.stdout.split() == ["10000", "42-17"]
        before = (workspace / "d00" / "f00.txt").stat().st_mtime_ns
        sh(session, "for i in 0 1 2 3 4 5 6 7 8 9; do echo changed > d0$i/f5$i.txt; done; rm d99/f99.txt")
        assert (workspace / "d07" / "f57.txt").read_text() == "changed\n"
        assert not (workspace / "d99" / "f99.txt").exists()
        assert (workspace / "d00" / "f00.txt").stat().st_mtime_ns == before  # untouched files not rewritten
        assert sum(1 for _ in workspace.rglob("*.txt")) == 9999


def test_hostile_pull_back_writes_nothing_outside_and_nothing_in_git(
    mirrored: Mirrored, workspace: Path
) -> None:
    outside = workspace.parent / "outside"
    (workspace / ".git").mkdir()
    (workspace / ".git" / "config").write_text("[core]\n\tbare = false\n")
    (workspace / "victim").mkdir()
    (workspace / "victim" / "f.txt").write_text("v\n")
    with mirrored().session(workspace=workspace) as session:
        attacks = sh(
            session,
            f"ln -s {outside} out_abs; ln -s ../outside out_rel; ln -s /etc/passwd passwd; "
            # link-then-write-through: a directory the host has becomes a link out, then is written through
            f"rm -r victim; ln -s {outside} victim; echo pwned > victim/f.txt 2>/dev/null; "
            # a link chain: each link looks inside on its own, the second escapes through the first
            "mkdir -p a/b; ln -s .. a/b/up; ln -s up/../../.. a/b/chain; "
            "ln -s .git gitlink; ln -s .git/hooks hooks; "
            "mkdir -p .git/hooks; echo 'echo pwned' > .git/hooks/pre-commit; echo x >> .git/config; "
            "mkdir -p sub/.git/hooks; echo pwned > sub/.git/hooks/post-checkout; "
            "mkfifo fifo; mknod dev c 1 3 2>&1; mknod blk b 7 0 2>&1; "
            "python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.bind(\"sock\")'; "
            "echo fine > fine.txt",
        )
        assert "Operation not permitted" in attacks.stdout  # no device nodes without capabilities
        note = attacks.stderr
        for name in ("out_abs", "out_rel", "passwd", "victim", "gitlink", "hooks", "fifo", "sock"):
            assert name in note, (name, note)  # told to the model, not silently dropped
        sh(session, "echo pwned > victim/again 2>/dev/null; true")
    assert list(outside.iterdir()) == []
    assert (workspace / ".git" / "config").read_text() == "[core]\n\tbare = false\n"
    assert not (workspace / ".git" / "hooks").exists()
    assert not (workspace / "sub" / ".git").exists() and (workspace / "sub").is_dir()
    assert (workspace / "fine.txt").read_text() == "fine\n"
    for name in ("out_abs", "out_rel", "passwd", "victim", "gitlink", "hooks", "fifo", "dev", "blk", "sock"):
        assert not (workspace / name).exists() and not (workspace / name).is_symlink(), name
    assert (workspace / "a" / "b" / "up").is_symlink()  # .. from a/b stays inside: kept
    assert not (workspace / "a" / "b" / "chain").is_symlink()  # escapes through 'up': refused


def test_names_pull_back_refuses() -> None:
    # A real filesystem cannot hold these, but the listing is the sandbox's output: it may say anything.
    for name in ("../x", "a/../../x", "/etc/passwd", "a//b", "./a", ".git/hooks/x", "s/.git/config", ""):
        assert not safe_name(name), name
        assert _parse_record(name.encode(), b"f 644 1 1.0 1.0 7") is None
    assert _parse_record(b"\xff\xfe", b"f 644 1 1.0 1.0 7") is None  # not UTF-8
    assert _parse_record(b"ok", b"f 644 1 1.0x 1.0 7") is None  # a record that does not parse
    assert _parse_record(b"ok", b"f 644 1 -2.5 1.0 7") == (
        "ok",
        Entry("f", 0o644, 1, -1_500_000_000, "", 7, 10**9),
    )
    assert safe_name("a/b.git/c") and safe_name(".gitignore")


@pytest.fixture(scope="module")
def small_mirror_backend() -> Iterator[DockerBackend]:
    """A mirror of 16 MiB (the disk bomb's cap); test_docker_remote_conformance.py gives a remote one."""
    with DockerBackend(workspace_transport="mirror", mirror_size_mb=16) as backend:
        yield backend


def test_a_disk_bomb_stops_at_the_cap_and_no_more_comes_back(mirrored: Mirrored, workspace: Path) -> None:
    with mirrored(16).session(workspace=workspace) as session:
        bomb = sh(session, "dd if=/dev/zero of=bomb bs=1M count=64 2>&1; truncate -s 900M sparse; echo done")
        assert "No space left on device" in bomb.stdout
        assert (workspace / "bomb").stat().st_size <= 16 * 1024 * 1024
        assert not (workspace / "sparse").exists() and "sparse" in bomb.stderr  # 900M apparent: refused
        assert sh(session, "echo ok").stdout == "ok\n"  # the session goes on


def test_a_workspace_larger_than_the_cap_is_refused_before_anything_runs(workspace: Path) -> None:
    (workspace / "big").write_bytes(b"\0" * (3 * 1024 * 1024))
    with (
        DockerBackend(workspace_transport="mirror", mirror_size_mb=2) as backend,
        pytest.raises(PolicyNotEnforceableError, match="more than its copy in the sandbox may hold"),
    ):
        backend.session(workspace=workspace).start()


def test_devtools_over_a_mirrored_workspace(mirrored: Mirrored, workspace: Path) -> None:
    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        with Workspace(workspace, sandbox=mirrored()) as ws:
            tools = DevToolset(ws)
            await tools.run("write_file", {"path": "from_tool.txt", "content": "written on the host\n"})
            seen = await tools.run("bash", {"command": "cat from_tool.txt; echo made in bash > made.txt"})
            read = await tools.run("read_file", {"path": "made.txt"})
            return seen, read

    seen, read = asyncio.run(scenario())
    assert seen["stdout"] == "written on the host\n"
    assert read["content"] == "     1\tmade in bash\n"


def test_auto_binds_on_the_local_engine_and_bind_is_reported(
    docker_backend: DockerBackend, workspace: Path
) -> None:
    assert docker_backend.workspace_transport == "auto"
    # Decided per workspace: the backend does not claim "bind" for a directory it has not checked.
    assert docker_backend.capabilities().workspace == "auto"
    assert docker_backend.capabilities(workspace=workspace).workspace == "bind"
    with docker_backend.session(workspace=workspace) as session:
        sh(session, "echo direct > direct.txt")
        assert session.workspace_transport == "bind" and session.mirror is None
        mounts = docker_backend._client.api.inspect_container(session.container_id)["Mounts"]
        assert any(m["Type"] == "bind" and m["Source"] == str(workspace) for m in mounts)
    assert (workspace / "direct.txt").read_text() == "direct\n"


def test_edits_that_keep_size_and_mtime_travel_both_ways(mirrored: Mirrored, workspace: Path) -> None:
    deep = workspace / "nested" / "deep"
    deep.mkdir(parents=True)
    (deep / "same.txt").write_text("aaaa\n")
    with mirrored().session(workspace=workspace) as session:
        assert sh(session, "cat nested/deep/same.txt").stdout == "aaaa\n"  # listed since, with its stat
        # In the container: same size, the mtime put back to the nanosecond (only the ctime moves).
        edit = "cd nested/deep && touch -r same.txt /tmp/t && printf 'bbbb\\n' > same.txt && "
        edit += "touch -r /tmp/t same.txt"
        assert sh(session, edit).exit_code == 0
        assert (deep / "same.txt").read_text() == "bbbb\n"
        # On the host: written in place (same inode), same size, the mtime put back.
        before = (deep / "same.txt").stat()
        with (deep / "same.txt").open("r+b") as handle:
            handle.write(b"cccc\n")
        os.utime(deep / "same.txt", ns=(before.st_atime_ns, before.st_mtime_ns))
        after = (deep / "same.txt").stat()
        assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
            before.st_ino,
            before.st_size,
            before.st_mtime_ns,
        )
        assert sh(session, "cat nested/deep/same.txt").stdout == "cccc\n"
    assert (deep / "same.txt").read_text() == "cccc\n"


def test_renames_and_deletions_in_nested_directories_travel_both_ways(
    mirrored: Mirrored, workspace: Path
) -> None:
    for rel in ("a/b/c/f1.txt", "a/b/g.txt", "a/d/h.txt", "top/x.txt"):
        (workspace / rel).parent.mkdir(parents=True, exist_ok=True)
        (workspace / rel).write_text(rel + "\n")
    with mirrored().session(workspace=workspace) as session:
        moved = sh(
            session,
            "mv a/b/c a/moved && mv a/b/g.txt a/moved/g2.txt && rm -r a/d && mkdir -p a/new/deeper && "
            "echo n > a/new/deeper/n.txt && mv top renamed",
        )
        assert moved.exit_code == 0, moved.stderr
        assert tree_of(workspace) == {
            "a": "dir", "a/b": "dir", "a/moved": "dir", "a/moved/f1.txt": "a/b/c/f1.txt\n",
            "a/moved/g2.txt": "a/b/g.txt\n", "a/new": "dir", "a/new/deeper": "dir",
            "a/new/deeper/n.txt": "n\n", "renamed": "dir", "renamed/x.txt": "top/x.txt\n",
        }  # fmt: skip
        # On the host, between commands: a directory renamed, a file renamed in it, others removed.
        (workspace / "a" / "moved").rename(workspace / "a" / "back")
        (workspace / "a" / "back" / "f1.txt").rename(workspace / "a" / "back" / "f9.txt")
        (workspace / "a" / "new" / "deeper" / "n.txt").unlink()
        shutil.rmtree(workspace / "renamed")
        listed = sh(session, "find . -mindepth 1 | sort; cat a/back/f9.txt")
        assert listed.stdout.split() == [
            "./a", "./a/b", "./a/back", "./a/back/f9.txt", "./a/back/g2.txt", "./a/new", "./a/new/deeper",
            "a/b/c/f1.txt",
        ]  # fmt: skip
    assert sorted(tree_of(workspace)) == ["a", "a/b", "a/back", "a/back/f9.txt", "a/back/g2.txt", "a/new",
                                          "a/new/deeper"]  # fmt: skip


def test_a_command_forging_times_hides_nothing_reaches_nothing_and_loses_to_host_edits(
    mirrored: Mirrored, workspace: Path
) -> None:
    outside = workspace.parent / "outside"
    (workspace / "host.txt").write_text("original\n")
    (workspace / "kept.txt").write_text("kept\n")
    with mirrored().session(workspace=workspace) as session:
        sh(session, "true")

        def host_edits(stream: str, data: str) -> None:
            # While the command runs, the host changes host.txt (the file tools write the host copy).
            if stream == "stdout" and "ready" in data:
                (workspace / "host.txt").write_text("host edit\n")

        forging = (
            "touch -r host.txt /tmp/pushed; echo ready; sleep 2; "
            # the same file, the same size as the host's edit, its times put back to what was pushed
            "printf 'sandbox!!\\n' > host.txt; touch -r /tmp/pushed host.txt; "
            # an edit hidden behind the old mtime, a file dated in the future and one in 1970
            "touch -r kept.txt /tmp/k; printf 'KEPT\\n' > kept.txt; touch -r /tmp/k kept.txt; "
            "echo future > future.txt; touch -d '2100-01-01' future.txt; "
            "echo past > past.txt; touch -d @0 past.txt; "
            # links out, dated in the past (touch -h sets the link's own times)
            f"ln -s {outside} out; touch -h -d @0 out; mkdir -p d; ln -s ../.. d/up; touch -h -d @0 d/up"
        )
        request = ExecRequest(language=Language.COMMAND, code=forging, timeout=60)
        result = session.execute(request, on_output=host_edits)
        assert result.exit_code == 0, result.stderr
        assert (workspace / "host.txt").read_text() == "host edit\n"  # the host's edit won
        assert (workspace / "kept.txt").read_text() == "KEPT\n"  # the forged mtime hid nothing
        assert (workspace / "future.txt").read_text() == "future\n"
        assert (workspace / "past.txt").read_text() == "past\n"
        assert "out" in result.stderr and "d/up" in result.stderr
        assert sh(session, "cat host.txt").stdout == "host edit\n"  # and was pushed before the next one
    assert list(outside.iterdir()) == []
    assert not (workspace / "out").is_symlink() and not (workspace / "d" / "up").is_symlink()
    assert (workspace / "host.txt").read_text() == "host edit\n"


def test_mirror_volume_goes_with_the_container(mirror_backend: DockerBackend, workspace: Path) -> None:
    client = mirror_backend._client
    with mirror_backend.session(workspace=workspace) as session:
        volume = next(m["Name"] for m in client.api.inspect_container(session.container_id)["Mounts"]
                      if m["Destination"] == str(workspace))  # fmt: skip
        options = client.api.inspect_volume(volume)["Options"]
        assert options["type"] == "tmpfs" and "size=64m" in options["o"] and "uid=1000" in options["o"]
    names = {v["Name"] for v in client.api.volumes().get("Volumes") or []}
    assert volume not in names


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(InvalidRequestError, match="workspace_transport"):
        DockerBackend(workspace_transport="copy")
    with pytest.raises(InvalidRequestError, match="mirror_size_mb"):
        DockerBackend(mirror_size_mb=0)
    with pytest.raises(InvalidRequestError, match="attached"):
        DockerBackend(workspace_transport="mirror", container="some-service")


def test_a_close_whose_last_pull_back_fails_still_removes_the_container(
    mirror_backend: DockerBackend, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever the last pull-back raises (not only the documented errors), the container goes."""

    def broken(self: MirrorWorkspace, run: Run) -> None:
        raise RuntimeError("a bug in the last pull-back")

    session = mirror_backend.session(workspace=workspace)
    assert sh(session, "true").exit_code == 0
    container = session.container_id
    monkeypatch.setattr(MirrorWorkspace, "closing", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        session.close()
    assert session.closed
    with pytest.raises(docker.errors.NotFound):
        mirror_backend._client.api.inspect_container(container)
