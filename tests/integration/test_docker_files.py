"""File operations inside the sandbox over the agent channel (``DockerSession.files``), and OOM evidence.

Real engine. Each operation runs in the container as the session's command user, so the permissions are
the container's: the tests check them from the host (owners of what lands in the workspace) and from
inside (a read-only root, another user's directory). Bounds are generous "does not hang" limits.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from executor import ExecRequest, ExecResult, InvalidRequestError, Language, ResourceLimits
from executor.backends.docker import DockerBackend, DockerSession
from executor.backends.docker import _container as container_module
from executor.backends.docker._agent_transport import AgentTransport
from executor.backends.docker._frames import FrameType, encode
from executor.backends.docker.files import DirEntry
from tests.conftest import require

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]

#: Generous "does not hang" bound.
QUICK = 30.0


@pytest.fixture(autouse=True, params=["python", "static"])
def agent_flavour(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs on both agents (the variable is read when an agent starts): the same semantics."""
    flavour = str(request.param)
    monkeypatch.setenv("ADK_SANDBOX_AGENT", flavour)
    return flavour


@pytest.fixture
def workspace(workspace_of_either_owner: Path) -> Path:
    """Owned by uid 1000 or by root (tests/conftest.py): every test here runs both ways."""
    return workspace_of_either_owner


@pytest.fixture
def session(docker_backend: DockerBackend, workspace: Path, agent_flavour: str) -> Iterator[DockerSession]:
    with docker_backend.session(workspace=workspace) as opened:
        transport = opened._transport
        assert isinstance(transport, AgentTransport)
        opened.execute(ExecRequest(language=Language.COMMAND, code="true", timeout=20))
        assert transport.agent_flavour == agent_flavour
        yield opened


def run(session: DockerSession, code: str, timeout: float = 20) -> ExecResult:
    return session.execute(ExecRequest(language=Language.COMMAND, code=code, timeout=timeout))


def owner_of(workspace: Path) -> int:
    return workspace.stat().st_uid


def test_every_operation_round_trips_as_the_command_user(session: DockerSession, workspace: Path) -> None:
    files, ws, uid = session.files, str(workspace), owner_of(workspace)
    assert files.write_bytes(f"{ws}/a.txt", b"hello\n", mode=0o640) == 6
    assert files.read_bytes(f"{ws}/a.txt") == b"hello\n"
    assert files.write_bytes(f"{ws}/a.txt", b"more\n", append=True) == 5
    assert (workspace / "a.txt").read_bytes() == b"hello\nmore\n"
    host = (workspace / "a.txt").stat()
    assert (host.st_uid, host.st_gid, host.st_mode & 0o7777) == (uid, uid, 0o640)  # exact mode, no umask
    status = files.stat(f"{ws}/a.txt")
    assert (status.type, status.size, status.mode, status.uid, status.gid) == ("file", 11, 0o640, uid, uid)
    assert abs(status.mtime - host.st_mtime) < 1
    files.mkdir(f"{ws}/d/e/f", parents=True, mode=0o700)
    files.mkdir(f"{ws}/d/e", parents=True)  # an existing directory is fine with parents
    assert (workspace / "d" / "e" / "f").stat().st_mode & 0o777 == 0o700
    assert (workspace / "d").stat().st_uid == uid
    with pytest.raises(FileExistsError):
        files.mkdir(f"{ws}/d")
    files.rename(f"{ws}/a.txt", f"{ws}/d/b.txt")
    assert sorted((e.name, e.type) for e in files.list_dir(f"{ws}/d")) == [(b"b.txt", "file"), (b"e", "dir")]
    os.symlink("b.txt", workspace / "d" / "link")
    assert files.stat(f"{ws}/d/link", follow=False).type == "symlink"
    assert files.stat(f"{ws}/d/link").type == "file"
    assert DirEntry(b"link", "symlink") in files.list_dir(f"{ws}/d")
    with pytest.raises(OSError, match="not empty") as caught:
        files.remove(f"{ws}/d")
    assert caught.value.errno == errno.ENOTEMPTY
    files.remove(f"{ws}/d/link")
    assert (workspace / "d" / "b.txt").exists()
    files.remove(f"{ws}/d", recursive=True)
    assert not (workspace / "d").exists()
    with pytest.raises(FileNotFoundError) as missing:
        files.read_bytes(f"{ws}/d/b.txt")
    assert missing.value.filename == f"{ws}/d/b.txt"
    with pytest.raises(IsADirectoryError):
        files.read_bytes(ws)
    files.write_bytes(f"{ws}/plain", b"")
    with pytest.raises(NotADirectoryError):
        files.list_dir(f"{ws}/plain")
    with pytest.raises(FileExistsError):
        files.write_bytes(f"{ws}/plain", b"x", exclusive=True)
    files.write_bytes(f"{ws}/new", b"x", exclusive=True)
    assert (workspace / "new").read_bytes() == b"x"


def test_the_containers_permissions_apply(session: DockerSession, workspace: Path) -> None:
    files, ws = session.files, str(workspace)
    for path in ("/etc/planted", "/planted"):  # the root filesystem is read-only
        with pytest.raises(OSError) as caught:
            files.write_bytes(path, b"x")
        assert caught.value.errno == errno.EROFS
    # A directory of the other user (the commands have no capabilities, root included).
    other = 0 if owner_of(workspace) == 1000 else 1000
    foreign = workspace / "foreign"
    foreign.mkdir(mode=0o755)
    os.chown(foreign, other, other)
    (foreign / "keep").write_bytes(b"theirs")
    os.chmod(foreign / "keep", 0o600)
    os.chown(foreign / "keep", other, other)
    with pytest.raises(PermissionError):
        files.write_bytes(f"{ws}/foreign/new", b"x")
    with pytest.raises(PermissionError):
        files.mkdir(f"{ws}/foreign/sub")
    with pytest.raises(PermissionError):
        files.read_bytes(f"{ws}/foreign/keep")
    with pytest.raises(PermissionError):
        files.remove(f"{ws}/foreign/keep")
    assert sorted(os.listdir(foreign)) == ["keep"]
    if owner_of(workspace) == 1000:
        with pytest.raises(PermissionError):
            files.read_bytes("/etc/shadow")


def test_binary_data_over_many_frames_and_ranges(session: DockerSession, workspace: Path) -> None:
    files, path = session.files, str(workspace / "blob")
    data = os.urandom(3 * 1024 * 1024 + 17) + b"\0" * 1000 + b"end"  # > 1 MiB: many STDIN/STDOUT frames
    assert files.write_bytes(path, data) == len(data)
    assert (workspace / "blob").read_bytes() == data
    assert files.read_bytes(path) == data
    assert (
        files.read_bytes(path, offset=1024 * 1024 - 3, limit=2 * 1024 * 1024)
        == data[1024 * 1024 - 3 : 3 * 1024 * 1024 - 3]
    )
    assert files.read_bytes(path, offset=len(data) - 3, limit=100) == b"end"
    assert files.read_bytes(path, offset=len(data) + 100) == b""
    assert files.read_bytes(path, limit=0) == b""
    assert files.write_bytes(path, b"") == 0
    assert files.read_bytes(path) == b""


def test_non_utf8_names_survive_a_listing(session: DockerSession, workspace: Path) -> None:
    name = b"caf\xe9-\xff\xfe.txt"
    with open(os.path.join(os.fsencode(workspace), name), "wb") as handle:
        handle.write(b"x")
    os.mkfifo(workspace / "fifo")
    entries = {entry.name: entry.type for entry in session.files.list_dir(str(workspace))}
    assert entries[name] == "file"
    assert entries[b"fifo"] == "other"
    assert b"." not in entries and b".." not in entries


def test_a_fifo_never_holds_the_agent(session: DockerSession, workspace: Path) -> None:
    os.mkfifo(workspace / "fifo")
    os.chown(workspace / "fifo", owner_of(workspace), owner_of(workspace))
    started = time.monotonic()
    with pytest.raises(OSError) as caught:
        session.files.read_bytes(str(workspace / "fifo"))
    assert caught.value.errno == errno.EINVAL
    with pytest.raises(OSError) as appended:  # opening a FIFO with no reader for writing must not wait
        session.files.write_bytes(str(workspace / "fifo"), b"x", append=True)
    assert appended.value.errno in (errno.EINVAL, errno.ENXIO)
    with pytest.raises(OSError):
        session.files.read_bytes("/dev/zero")  # endless: refused, not read
    assert run(session, "echo after").stdout == "after\n"
    assert time.monotonic() - started < QUICK


def _open_write(session: DockerSession, path: str, first: bytes) -> tuple[object, int, object]:
    """A write whose data arrives slowly: the FILE frame and some data, the rest still to come."""
    transport = session._transport
    assert isinstance(transport, AgentTransport)
    agent = transport._agent_for(session._user, time.monotonic() + QUICK)
    number, channel = agent.open_channel()
    request = {"op": "write", "path": path, "mode": 0o644, "exclusive": False, "append": False}
    agent.send(
        encode(FrameType.FILE, number, request) + encode(FrameType.STDIN, number, first),
        time.monotonic() + QUICK,
    )
    return agent, number, channel


def _result(channel: object) -> dict[str, object]:
    while True:
        kind, value = channel.events.get(timeout=QUICK)  # type: ignore[attr-defined]
        if kind == "result":
            return value  # type: ignore[no-any-return]
        assert kind == "stdout"


def test_a_write_in_progress_is_invisible_and_commands_run_meanwhile(
    session: DockerSession, workspace: Path
) -> None:
    target = workspace / "target"
    target.write_bytes(b"old")
    agent, number, channel = _open_write(session, str(target), b"new half")
    time.sleep(0.5)  # the worker holds the first half; the agent must keep serving
    assert run(session, f"cat {target}; echo; ls -a {workspace} | grep -c adk-sandbox-write").stdout == (
        "old\n1\n"  # the old content, the new data in a temporary file beside it
    )
    assert target.read_bytes() == b"old"
    agent.send(  # type: ignore[attr-defined]
        encode(FrameType.STDIN, number, b" and the rest") + encode(FrameType.STDIN, number),
        time.monotonic() + QUICK,
    )
    assert _result(channel) == {"size": len(b"new half and the rest")}
    agent.close_channel(number)  # type: ignore[attr-defined]
    assert target.read_bytes() == b"new half and the rest"
    assert sorted(os.listdir(workspace)) == [".git", "target"]


def test_a_killed_write_leaves_the_target_unchanged(session: DockerSession, workspace: Path) -> None:
    target = workspace / "target"
    target.write_bytes(b"old")
    agent, number, channel = _open_write(session, str(target), b"x" * 100_000)
    time.sleep(0.5)
    agent.send(encode(FrameType.KILL, number), time.monotonic() + QUICK)  # type: ignore[attr-defined]
    result = _result(channel)
    assert result["error"]["name"] == "ECANCELED"  # type: ignore[index]
    agent.close_channel(number)  # type: ignore[attr-defined]
    assert target.read_bytes() == b"old"
    assert sorted(os.listdir(workspace)) == [".git", "target"]  # the temporary file is gone
    assert session.files.read_bytes(str(target)) == b"old"  # and the agent is fine


def test_a_big_write_and_commands_side_by_side(session: DockerSession, workspace: Path) -> None:
    data = os.urandom(1024 * 1024) * 64
    written: list[int] = []
    thread = threading.Thread(
        target=lambda: written.append(session.files.write_bytes(str(workspace / "big"), data))
    )
    thread.start()
    outputs = [run(session, f"echo {i}").stdout for i in range(5)]
    thread.join(QUICK)
    assert outputs == [f"{i}\n" for i in range(5)]
    assert written == [len(data)]
    assert (workspace / "big").read_bytes() == data


def test_a_full_filesystem_leaves_the_old_content(owned_workspace: Path) -> None:
    with (
        DockerBackend(limits=ResourceLimits(tmpfs_mb=8)) as backend,
        backend.session(workspace=owned_workspace) as session,
    ):
        files = session.files
        files.write_bytes("/tmp/keep", b"old content")
        assert run(session, "head -c 7000000 /dev/zero > /tmp/fill; echo $?").stdout == "0\n"
        with pytest.raises(OSError) as caught:
            files.write_bytes("/tmp/keep", os.urandom(3 * 1024 * 1024))
        assert caught.value.errno == errno.ENOSPC
        assert files.read_bytes("/tmp/keep") == b"old content"
        names = {entry.name for entry in files.list_dir("/tmp")}
        assert {b"keep", b"fill"} <= names
        assert not [
            name for name in names if name.startswith(b".adk-sandbox-write")
        ]  # no temporary file left


def test_a_recursive_remove_never_follows_a_symlink(session: DockerSession, workspace: Path) -> None:
    files, ws = session.files, str(workspace)
    # A directory of the command user outside the workspace, with something to lose.
    files.mkdir("/tmp/victim")
    files.write_bytes("/tmp/victim/keep", b"precious")
    (workspace / "tree" / "sub").mkdir(parents=True)
    os.symlink("/tmp/victim", workspace / "tree" / "sub" / "link")
    os.symlink("/tmp/victim", workspace / "tree" / "link")
    os.symlink("/tmp/victim", workspace / "top-link")
    os.chown(workspace / "tree", owner_of(workspace), owner_of(workspace))
    os.chown(workspace / "tree" / "sub", owner_of(workspace), owner_of(workspace))
    files.remove(f"{ws}/top-link", recursive=True)  # the link itself goes
    assert not os.path.lexists(workspace / "top-link")
    files.remove(f"{ws}/tree", recursive=True)
    assert not (workspace / "tree").exists()
    assert files.read_bytes("/tmp/victim/keep") == b"precious"
    assert [entry.name for entry in files.list_dir("/tmp/victim")] == [b"keep"]


def test_rename_replaces_and_moves(session: DockerSession, workspace: Path) -> None:
    files, ws = session.files, str(workspace)
    files.write_bytes(f"{ws}/a", b"A")
    files.write_bytes(f"{ws}/b", b"B")
    files.rename(f"{ws}/a", f"{ws}/b")
    assert (workspace / "b").read_bytes() == b"A"
    assert not (workspace / "a").exists()
    with pytest.raises(OSError) as across:  # rename(2) does not cross filesystems (workspace to tmpfs)
        files.rename(f"{ws}/b", "/tmp/b")
    assert across.value.errno == errno.EXDEV
    with pytest.raises(FileNotFoundError) as caught:
        files.rename(f"{ws}/missing", f"{ws}/c")
    assert caught.value.filename2 == f"{ws}/c"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda f, ws: f.read_bytes("relative/path"), "absolute"),
        (lambda f, ws: f.read_bytes(f"{ws}/a\0b"), "NUL"),
        (lambda f, ws: f.read_bytes(f"{ws}/x", offset=-1), "offset"),
        (lambda f, ws: f.write_bytes(f"{ws}/x", b"", mode=0o4755), "mode"),
        (lambda f, ws: f.write_bytes(f"{ws}/x", "text"), "bytes"),  # type: ignore[arg-type]
        (lambda f, ws: f.mkdir(f"{ws}/x", mode=0o1777), "mode"),
        (lambda f, ws: f.rename(f"{ws}/x", "y"), "absolute"),
        (lambda f, ws: f.write_bytes(f"{ws}/\udcff", b""), "UTF-8"),
    ],
)
def test_invalid_arguments_send_nothing(
    session: DockerSession, workspace: Path, call: object, message: str
) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        call(session.files, str(workspace))  # type: ignore[operator]
    assert sorted(os.listdir(workspace)) == [".git"]


def test_the_exec_transport_refuses_file_operations_clearly(owned_workspace: Path) -> None:
    with DockerBackend(transport="exec") as backend, backend.session(workspace=owned_workspace) as session:
        with pytest.raises(InvalidRequestError, match="agent channel"):
            session.files.write_bytes(str(owned_workspace / "x"), b"x")
        assert not (owned_workspace / "x").exists()


def test_oom_kills_are_counted_inside_the_container(
    owned_workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No host-side counter (as with a remote engine): only the agent's EXIT can say it.
    monkeypatch.setattr(container_module.OomCounter, "for_container", classmethod(lambda cls, inspect: None))
    with (
        DockerBackend(limits=ResourceLimits(memory_mb=128)) as backend,
        backend.session(workspace=owned_workspace) as session,
    ):
        assert session._oom_counter is None
        result = session.execute(
            ExecRequest(
                language=Language.PYTHON, code="b = b'x' * (600 * 1024 * 1024); print('survived')", timeout=60
            )
        )
        assert result.oom_killed
        assert result.exit_code is None
        assert not run(session, "true").oom_killed


def test_file_operations_work_under_gvisor(docker_backend: DockerBackend, owned_workspace: Path) -> None:
    """The worker forks, installs its filter and streams under runsc too (no subreapers, no cgroup files)."""
    require("runsc" in docker_backend._client.info().get("Runtimes", {}), "gVisor's runsc is not registered")
    with DockerBackend(runtime="runsc") as backend, backend.session(workspace=owned_workspace) as session:
        data = os.urandom(1024 * 1024) + b"\0tail"
        path = str(owned_workspace / "g.bin")
        assert session.files.write_bytes(path, data) == len(data)
        assert (owned_workspace / "g.bin").stat().st_uid == 1000
        assert session.files.read_bytes(path, offset=1024 * 1024) == b"\0tail"
        assert DirEntry(b"g.bin", "file") in session.files.list_dir(str(owned_workspace))
        with pytest.raises(OSError):
            session.files.write_bytes("/etc/planted", b"x")
        assert run(session, "echo hi").stdout == "hi\n"
