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

from adk_sandbox.executor import ExecRequest, ExecResult, InvalidRequestError, Language, ResourceLimits
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from adk_sandbox.executor.backends.docker import _container as container_module
from adk_sandbox.executor.channel.agent_transport import AgentTransport
from adk_sandbox.executor.channel.files import DirEntry
from adk_sandbox.executor.channel.frames import FrameType, encode
from tests.conftest import require

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]

#: Generous "does not hang" bound.
QUICK = 30.0


@pytest.fixture
def workspace(workspace_of_either_owner: Path) -> Path:
    """Owned by uid 1000 or by root (tests/conftest.py): every test here runs both ways."""
    return workspace_of_either_owner


@pytest.fixture
def session(docker_backend: DockerBackend, workspace: Path) -> Iterator[DockerSession]:
    with docker_backend.session(workspace=workspace) as opened:
        transport = opened._transport
        assert isinstance(transport, AgentTransport)
        opened.execute(ExecRequest(language=Language.COMMAND, code="true", timeout=20))
        assert transport.agent_pid is not None
        yield opened


def run(session: DockerSession, code: str, timeout: float = 20) -> ExecResult:
    return session.execute(ExecRequest(language=Language.COMMAND, code=code, timeout=timeout))


def owner_of(workspace: Path) -> int:
    return workspace.stat().st_uid


def other_than(workspace: Path) -> int:
    """A uid that is not the command user's (commands have no capabilities, root included)."""
    return 0 if owner_of(workspace) == 1000 else 1000


def own_file(workspace: Path, name: str, data: bytes, mode: int = 0o644, owner: int | None = None) -> Path:
    """A file made on the host (as root), then given to ``owner`` (the command user by default)."""
    path = workspace / name
    path.write_bytes(data)
    uid = owner_of(workspace) if owner is None else owner
    os.chown(path, uid, uid)
    os.chmod(path, mode)
    return path


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


# -- a write replacing an existing file honours its permission (issue 12) ----------------------------------


def _snapshot(path: Path) -> tuple[bytes, int, int, int, int]:
    info = path.stat()
    return path.read_bytes(), info.st_mode & 0o7777, info.st_uid, info.st_gid, info.st_ino


@pytest.mark.parametrize(
    ("mode", "foreign"),
    [
        pytest.param(0o444, False, id="read-only"),  # the command user's own file, mode 0444
        pytest.param(0o644, True, id="another-users"),  # root's 0644 file for uid 1000 (uid 1000's for root)
        pytest.param(0o664, True, id="writable-by-a-group-it-is-not-in"),
    ],
)
@pytest.mark.parametrize("size", [5, 3 * 1024 * 1024])  # one frame, and data still arriving when refused
def test_a_file_the_command_user_may_not_write_is_refused_and_unchanged(
    session: DockerSession, workspace: Path, mode: int, foreign: bool, size: int
) -> None:
    """Like ``open(path, "w")``: the directory being writable does not make the file writable."""
    owner = other_than(workspace) if foreign else None
    target = own_file(workspace, "target", b"theirs", mode=mode, owner=owner)
    before = _snapshot(target)
    for append in (False, True):
        with pytest.raises(PermissionError) as caught:
            session.files.write_bytes(str(target), os.urandom(size), append=append)
        assert caught.value.errno == errno.EACCES
        assert caught.value.filename == str(target)
    assert _snapshot(target) == before  # content, mode, owner and the inode itself
    assert sorted(os.listdir(workspace)) == [".git", "target"]  # no temporary file left
    assert session.files.read_bytes(str(target)) == b"theirs"  # the agent goes on
    # The command user is refused by the kernel exactly alike (no capability lets root through either).
    assert run(session, f"(echo x > {target}) 2>/dev/null || echo refused").stdout == "refused\n"


def test_a_refusal_says_the_file_was_left_unchanged(session: DockerSession, workspace: Path) -> None:
    target = own_file(workspace, "ro", b"keep", mode=0o444)
    with pytest.raises(PermissionError, match="may not write this file; it was left unchanged"):
        session.files.write_bytes(str(target), b"new")


def test_a_writable_file_is_replaced_with_its_mode_and_owner(session: DockerSession, workspace: Path) -> None:
    files, uid = session.files, owner_of(workspace)
    mine = own_file(workspace, "mine", b"old", mode=0o640)
    assert files.write_bytes(str(mine), b"new content", mode=0o600) == 11  # mode: for a new file only
    info = mine.stat()
    assert (mine.read_bytes(), info.st_mode & 0o7777) == (b"new content", 0o640)
    assert (info.st_uid, info.st_gid) == (uid, uid)
    executable = own_file(workspace, "run.sh", b"#!/bin/sh\necho old\n", mode=0o750)
    files.write_bytes(str(executable), b"#!/bin/sh\necho new\n")
    assert run(session, str(executable)).stdout == "new\n"  # still executable
    # Another user's file that everyone may write: replaced, its mode kept; the owner cannot be given
    # away without CAP_CHOWN, so the replacement is the command user's.
    shared = own_file(workspace, "shared", b"old", mode=0o666, owner=other_than(workspace))
    files.write_bytes(str(shared), b"new")
    info = shared.stat()
    assert (shared.read_bytes(), info.st_mode & 0o7777, info.st_uid) == (b"new", 0o666, uid)
    # A new file still gets exactly the mode asked for.
    files.write_bytes(str(workspace / "fresh"), b"x", mode=0o604)
    assert (workspace / "fresh").stat().st_mode & 0o7777 == 0o604
    assert sorted(os.listdir(workspace)) == [".git", "fresh", "mine", "run.sh", "shared"]


def test_a_symlink_at_the_path_is_replaced_never_followed(session: DockerSession, workspace: Path) -> None:
    """Unchanged by the permission check: the link itself is replaced by a new file of the mode asked for."""
    files, ws = session.files, str(workspace)
    files.write_bytes("/tmp/outside", b"outside", mode=0o644)
    protected = own_file(workspace, "protected", b"theirs", mode=0o444, owner=other_than(workspace))
    before = _snapshot(protected)
    for name, to in (("out-link", "/tmp/outside"), ("ro-link", str(protected)), ("dangling", f"{ws}/none")):
        os.symlink(to, workspace / name)
        os.lchown(workspace / name, owner_of(workspace), owner_of(workspace))
        assert files.write_bytes(f"{ws}/{name}", b"new", mode=0o600) == 3
        assert not (workspace / name).is_symlink()
        info = (workspace / name).stat()
        assert ((workspace / name).read_bytes(), info.st_mode & 0o7777) == (b"new", 0o600)
    assert files.read_bytes("/tmp/outside") == b"outside"
    assert _snapshot(protected) == before
    assert not (workspace / "none").exists()


def test_a_running_program_can_be_replaced(session: DockerSession, workspace: Path) -> None:
    """A program being run cannot be opened for writing (ETXTBSY) on every kernel; replacing it is fine."""
    program = workspace / "prog"
    run(session, f"cp /bin/sleep {program} && chmod 755 {program}")
    running = threading.Thread(target=lambda: run(session, f"{program} 3"))
    running.start()
    try:
        time.sleep(0.5)  # the program is running (if not, the write below is an ordinary one)
        assert session.files.write_bytes(str(program), b"#!/bin/sh\necho replaced\n") > 0
    finally:
        running.join(QUICK)
    assert program.stat().st_mode & 0o777 == 0o755  # the replacement keeps the mode
    assert run(session, str(program)).stdout == "replaced\n"


def test_swapping_the_target_during_writes_never_writes_elsewhere(
    session: DockerSession, workspace: Path
) -> None:
    """Attack: while the host writes again and again, the command swaps the target between its own file,
    a symlink to a file outside the workspace, a symlink to another user's file and that other user's file
    itself (renamed in: the directory is the command user's). Whatever wins each race, no file is written
    through: the outside file and the other user's inode (kept by a hard link in a directory the command
    cannot touch) keep their content and mode, and no temporary file is left."""
    files, ws, other = session.files, str(workspace), other_than(workspace)
    files.write_bytes("/tmp/outside", b"outside", mode=0o644)
    vault = workspace / "vault"
    vault.mkdir(mode=0o755)
    os.chown(vault, other, other)
    secret = own_file(workspace, "theirs", b"secret", mode=0o644, owner=other)
    os.link(secret, vault / "theirs")  # the inode, out of the command's reach
    own_file(workspace, "target", b"mine")
    before = _snapshot(vault / "theirs")
    attack = (
        f"cd {ws} || exit 1; i=0; while [ $i -lt 400 ]; do i=$((i+1)); "
        "ln -sfn /tmp/outside .l && mv -fT .l target; "
        "ln -sfn vault/theirs .l && mv -fT .l target; "
        "mv -fT theirs target 2>/dev/null; mv -fT target theirs 2>/dev/null; "
        "echo mine > .m && mv -fT .m target; "
        "done; echo done"
    )
    outcome: list[ExecResult] = []
    attacker = threading.Thread(target=lambda: outcome.append(run(session, attack, timeout=120)))
    attacker.start()
    written = refused = 0
    try:
        while attacker.is_alive():
            try:
                files.write_bytes(f"{ws}/target", b"host")
                written += 1
            except OSError:
                refused += 1  # EACCES at the probe, ENOENT mid-swap: the race's own outcomes
    finally:
        attacker.join(120 + QUICK)
    assert outcome and outcome[0].stdout == "done\n", outcome
    assert written + refused > 0
    assert files.read_bytes("/tmp/outside") == b"outside"
    assert _snapshot(vault / "theirs") == before
    assert (vault / "theirs").read_bytes() == b"secret"
    assert not [name for name in os.listdir(workspace) if name.startswith(".adk-sandbox-write")]
    assert files.read_bytes(f"{ws}/target", limit=16) in (b"host", b"mine\n", b"secret", b"outside")


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
    target = own_file(workspace, "target", b"old")
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
    target = own_file(workspace, "target", b"old")
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
    """The worker forks, installs its filter and streams under runsc too."""
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
