"""``session.pause()`` to a checkpoint on disk, every process kept (``checkpoints=True``; gVisor and runc).

The tests taking the ``backend`` fixture run twice: on gVisor (runsc's own checkpoint) and on runc
(CRIU's, as ``scripts/setup`` installs it).

A background program holds a random token in its memory only and answers it on a Unix socket; beside it
a counter ticks every 50 ms (the same program as ``test_docker_pause.py``). From the host:

* paused, the container is stopped and nothing of it runs on the host (no gVisor process names it, no
  process is in its cgroup): its memory is on disk, in the engine's directory, outside every mount the
  sandbox has;
* after resume the same program answers the same token, and the counter did not move meanwhile;
* ``fork(processes=True)``: a new container restored from a checkpoint of the running session holds the
  same program with the same memory, and then the two run apart;
* any call resumes it first; what cannot be carried through (an open terminal, another user's agent)
  refuses the pause with nothing paused;
* attacks: a command of the session's user kills everything it may (``kill -9 -1``, PID 1 included): the
  container lives on (the keeper is root, another uid); a program forking without pause during the
  checkpoint does not break it; the checkpoint is no bigger than the sandbox's memory limit; a line the
  sandbox forges in its list of held files makes the host look at no file outside the mounts;
* ``idle_pause_seconds``: an idle session pauses itself to disk, the next call resumes it, and one whose
  program spins on the CPU stays up;
* the settings it cannot honour are refused; a session paused on disk whose owner died is reaped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import pytest

from adk_sandbox.executor import (
    ExecRequest,
    InvalidRequestError,
    PolicyNotEnforceableError,
    SandboxFailedError,
)
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from adk_sandbox.executor.backends.docker._reaper import reap_leaked
from adk_sandbox.executor.backends.docker.config import config_from_options
from adk_sandbox.executor.network import NetworkPolicy
from adk_sandbox.executor.types import ResourceLimits
from tests.conftest import require
from tests.integration.test_docker_pause import QUIET_KEEPER, out, start_keeper, token

pytestmark = pytest.mark.docker

MEMORY_MB = 512


def _client() -> docker.DockerClient:
    return docker.from_env()


@pytest.fixture(scope="module", params=["runsc", "runc"])
def backend(request: pytest.FixtureRequest) -> Iterator[DockerBackend]:
    """A checkpointing backend on gVisor (runsc's checkpoint) and on runc (CRIU's): each test runs on both."""
    runtime = request.param
    client = _client()
    try:
        if runtime == "runsc":
            registered = client.info().get("Runtimes") or {}
            require("runsc" in registered, "runsc is not registered (scripts/setup)")
        else:
            require(shutil.which("criu") is not None, "CRIU is not installed (scripts/setup)")
        require(
            bool(client.info().get("ExperimentalBuild")),
            "dockerd runs without --experimental (scripts/setup)",
        )
    finally:
        client.close()
    with DockerBackend(runtime=runtime, checkpoints=True, limits=ResourceLimits(memory_mb=MEMORY_MB)) as made:
        yield made


@pytest.fixture(scope="module")
def session(backend: DockerBackend) -> Iterator[DockerSession]:
    with backend.session() as made:
        start_keeper(made)
        yield made


def _state(session: DockerSession) -> dict[str, object]:
    client = _client()
    try:
        return dict(client.api.inspect_container(session.container_id)["State"])
    finally:
        client.close()


def _host_processes_naming(container_id: str) -> list[str]:
    """Host processes of the container: gVisor's (sandbox, gofer: their command lines name it), runc's (its
    own processes: in its cgroup)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                line = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if container_id in line and "runsc" in line:
            found.append(line[:120])
            continue
        try:
            with open(f"/proc/{pid}/cgroup", encoding="utf-8") as f:
                in_its_cgroup = container_id in f.read()
        except OSError:
            continue
        if in_its_cgroup:  # runc: the container's own processes
            found.append(line[:120])
    return found


def _checkpoints_dir(container_id: str) -> str:
    client = _client()
    try:
        root = client.info()["DockerRootDir"]
    finally:
        client.close()
    return os.path.join(root, "containers", container_id, "checkpoints")


def _size(path: str) -> int:
    total = 0
    for parent, _, files in os.walk(path):
        for name in files:
            total += os.lstat(os.path.join(parent, name)).st_blocks * 512
    return total


def test_every_process_survives_a_checkpoint_on_disk(session: DockerSession) -> None:
    kept = token(session)
    assert len(kept) == 32
    container = session.container_id
    assert _host_processes_naming(container), "the test cannot see the container's processes on this host"
    before = int(out(session, "cat /tmp/ticks"))
    session.pause()
    assert session.paused
    state = _state(session)
    assert not state["Running"] and not state["Paused"], state  # stopped, not frozen
    assert _host_processes_naming(container) == []  # nothing of it holds host memory
    on_disk = _checkpoints_dir(container)
    stored = _size(on_disk)
    assert 0 < stored <= MEMORY_MB * 1024 * 1024, stored  # no bigger than the sandbox's memory limit
    mounts = [m["Source"] for m in _client().api.inspect_container(container)["Mounts"]]
    assert not any(on_disk.startswith(source.rstrip("/") + "/") for source in mounts), mounts
    time.sleep(2.0)  # 40 ticks if it ran
    session.resume()
    assert not session.paused and _state(session)["Running"]
    assert token(session) == kept  # the same program, its memory kept
    during = int(out(session, "cat /tmp/ticks")) - before
    assert during < 8, f"the counter moved {during} ticks while the session was on disk"
    time.sleep(0.5)
    assert int(out(session, "cat /tmp/ticks")) > before + during  # and it runs again
    assert _size(on_disk) == 0  # the restored checkpoint is deleted


def test_any_call_resumes_a_session_on_disk(session: DockerSession) -> None:
    session.pause()
    session.pause()  # idempotent
    assert out(session, "echo ran") == "ran"
    assert not session.paused
    session.pause()
    assert session.files.stat("/tmp/ticks") is not None
    assert not session.paused and _state(session)["Running"]
    assert len(token(session)) == 32


def test_a_fork_carries_every_process_and_then_runs_apart(session: DockerSession) -> None:
    """``fork(processes=True)``: the same program with the same memory in a new container; then apart."""
    kept = token(session)
    out(session, "echo before > /tmp/mark")
    child = session.fork(processes=True)
    try:
        assert child.container_id != session.container_id
        assert token(child) == kept  # the program and its memory, copied
        assert out(child, "cat /tmp/mark") == "before"  # its tmpfs too
        # The kernel's randomness is not part of the copy: a fork never draws what its parent draws.
        draw = "od -An -N16 -tx1 /dev/urandom | tr -d ' \\n'"
        assert out(child, draw) != out(session, draw)
        out(child, "echo child > /tmp/mark")
        out(session, "echo parent > /tmp/mark")
        assert (out(session, "cat /tmp/mark"), out(child, "cat /tmp/mark")) == ("parent", "child")
        ticks = int(out(child, "cat /tmp/ticks"))
        time.sleep(0.5)
        assert int(out(child, "cat /tmp/ticks")) > ticks  # the fork's own counter runs
    finally:
        child.close()
    assert token(session) == kept  # the parent ran on, and the fork's end is not its own
    assert _state(session)["Running"]


def test_an_open_terminal_refuses_the_checkpoint(session: DockerSession) -> None:
    terminal = session.open_pty(["sh"])
    try:
        with pytest.raises(InvalidRequestError, match="terminal"):
            session.pause()
        assert not session.paused and _state(session)["Running"]
    finally:
        terminal.close()
    session.pause()
    session.resume()
    assert len(token(session)) == 32


def test_a_published_port_outlives_the_checkpoint_and_its_connection_resumes(session: DockerSession) -> None:
    """A published port stays on the host while the session is on disk; a connection to it resumes it.

    The host listener is the session's, not the sandbox's; only a live connection is refused (its stream
    cannot be held), and the one a client just closed is waited for: the pause right after it succeeds.
    """
    serve = "cd /tmp && echo served > index.html && nohup python3 -m http.server 8123 >/dev/null 2>&1 &"
    started = session.execute(ExecRequest(argv=("sh", "-c", serve), timeout=30, background=True))
    assert started.exit_code == 0, started
    address = session.publish(8123)
    try:
        assert _wait_for(lambda: _get(address, 5) == b"served\n", 20)
        session.pause()  # the connection above has just been closed by its client
        assert session.paused and not _state(session)["Running"]
        assert _get(address, 60) == b"served\n"  # the connection woke it
        assert not session.paused
        assert len(token(session)) == 32
    finally:
        session.unpublish(8123)
        out(session, "pkill -f 'http[.]server 8123'; true")


def _get(address: str, timeout: float) -> bytes | None:
    try:
        with urllib.request.urlopen(f"http://{address}/index.html", timeout=timeout) as answer:
            return bytes(answer.read())
    except OSError:
        return None


def test_a_fork_storm_during_the_checkpoint_is_contained(session: DockerSession) -> None:
    """A program forks without pause while the checkpoint is taken: it is captured whole, and restored."""
    kept = token(session)
    storm = "while [ ! -e /tmp/calm ]; do (sleep 0.01 &) 2>/dev/null; done"
    out(session, f"rm -f /tmp/calm; nohup sh -c '{storm}' >/dev/null 2>&1 & echo started")
    time.sleep(0.5)
    session.pause()
    session.resume()
    assert token(session) == kept
    out(session, "touch /tmp/calm")
    assert out(session, "echo alive") == "alive"


def test_a_program_runc_could_not_restore_refuses_the_checkpoint(
    backend: DockerBackend, session: DockerSession
) -> None:
    """runc: a program whose session leader ended (``setsid`` and exit) is refused with nothing paused.

    CRIU dumps such a tree but cannot restore it: without the refusal the pause succeeds and the resume
    loses every process. gVisor restores it (checked on the same program).
    """
    kept = token(session)
    orphaned = "setsid sh -c 'sleep 600 & exit' >/dev/null 2>&1 </dev/null"
    started = session.execute(ExecRequest(argv=("sh", "-c", orphaned), timeout=60, background=True))
    assert started.exit_code == 0, started
    assert out(session, "sleep 0.3; pgrep -x sleep >/dev/null && echo up") == "up"
    try:
        if backend.runtime == "runc":
            with pytest.raises(
                PolicyNotEnforceableError, match=r"'sleep' \(pid \d+ inside\) is in a session whose"
            ):
                session.pause()
            assert not session.paused and _state(session)["Running"]
            with pytest.raises(PolicyNotEnforceableError, match="session whose leader has ended"):
                session.fork(processes=True)
        else:
            session.pause()
            session.resume()
            assert out(session, "pgrep -x sleep >/dev/null && echo kept") == "kept"
    finally:
        out(session, "pkill -x sleep; echo done")
    session.pause()
    session.resume()
    assert token(session) == kept


#: Calls clone3(CLONE_NEWUSER) and prints "made" or the errno's name.
CLONE3_NEWUSER = """
import ctypes, errno, os, struct
libc = ctypes.CDLL(None, use_errno=True)
args = ctypes.create_string_buffer(struct.pack("8Q", 0x10000000, 0, 0, 0, 17, 0, 0, 0))
pid = libc.syscall(435, args, 64)
if pid == 0:
    os._exit(0)
if pid > 0:
    os.waitpid(pid, 0)
print("made" if pid > 0 else errno.errorcode[ctypes.get_errno()])
"""


def test_clone3_makes_no_host_namespace_in_a_keeper_container(
    backend: DockerBackend, session: DockerSession
) -> None:
    """On runc the kernel answers the sandbox profile's ENOSYS for ``clone3``, whose namespace flags seccomp
    cannot read: a command cannot make a user namespace. The keeper's profile lets ``clone3`` through only
    under gVisor (runsc answers a refusal with EPERM, which leaves glibc without threads), where the
    namespace is the sentry's own. Fails on runc with gVisor's keeper profile (clone3 made a host user
    namespace)."""
    made = out(session, f"python3 -c '{CLONE3_NEWUSER}'")
    assert made == ("made" if backend.runtime == "runsc" else "ENOSYS")


def test_a_checkpoint_that_cannot_be_restored_loses_only_its_processes(backend: DockerBackend) -> None:
    """A checkpoint damaged on the host (here: its files removed) fails the resume, naming the engine's
    reason; the container and the checkpoint are removed, and the next call gets a fresh sandbox."""
    with backend.session() as session:
        start_keeper(session, QUIET_KEEPER)
        out(session, "echo kept > /tmp/mark")
        session.pause()
        container = session.container_id
        on_disk = _checkpoints_dir(container)
        for parent, _, names in os.walk(on_disk):
            for name in names:
                if name != "config.json":
                    os.remove(os.path.join(parent, name))
        with pytest.raises(SandboxFailedError, match="processes are lost"):
            session.resume()
        assert out(session, "echo fresh") == "fresh"
        assert session.container_id != container
        assert out(session, "cat /tmp/mark 2>/dev/null || echo gone") == "gone"  # the old memory is not back
        client = _client()
        try:
            with pytest.raises(docker.errors.NotFound):
                client.api.inspect_container(container)
        finally:
            client.close()


def test_runc_keeps_a_task_sessions_root_writes_through_a_pause_and_refuses_copies_without_them() -> None:
    """runc's checkpoint keeps the processes and their tmpfs, not the container's layer: a pause (the same
    container) keeps the task profile's root writes; a fork or snapshot with processes, whose copy would
    start from the image's root, is refused with nothing done."""
    require(shutil.which("criu") is not None, "CRIU is not installed (scripts/setup)")
    with DockerBackend(runtime="runc", checkpoints=True, profile="task") as task, task.session() as session:
        out(session, "echo kept > /root-write")
        assert session.capabilities().snapshots == ("files",)  # said beforehand
        session.pause()
        session.resume()
        assert out(session, "cat /root-write") == "kept"
        with pytest.raises(PolicyNotEnforceableError, match="root filesystem writes"):
            session.fork(processes=True)
        with pytest.raises(PolicyNotEnforceableError, match="root filesystem writes"):
            session.snapshot(processes=True)
        assert task.list_snapshots() == []


def test_the_keeper_outlives_the_users_kill_everything(backend: DockerBackend) -> None:
    """``kill -9 -1`` and ``kill -9 1`` as the session's user: the container lives on.

    Under gVisor a namespace's init receives SIGKILL from a process of its own uid (checked: a PID 1
    ``sleep`` of the session's user dies of it). The keeper is root, so the user cannot signal it; its
    agent dies with the rest, and the next command gets a new one. The checkpoint is then refused: that
    agent is not the keeper's.
    """
    with backend.session() as session:
        container = session.container_id
        # The agent dies with the command: it fails at once (not at its timeout), as with any agent killed.
        with pytest.raises(SandboxFailedError, match=r"agent ended \(its keeper says so"):
            session.execute(ExecRequest(argv=("sh", "-c", "kill -9 1; kill -9 -1"), timeout=60))
        assert out(session, "echo after") == "after"
        assert session.container_id == container and _state(session)["Running"]
        with pytest.raises(PolicyNotEnforceableError, match="no longer the container keeper's"):
            session.pause()
        assert not session.paused


def test_another_users_agent_refuses_the_checkpoint(backend: DockerBackend) -> None:
    with backend.session() as session:
        assert session.execute(ExecRequest(argv=("true",), user="4321", timeout=30)).exit_code == 0
        with pytest.raises(PolicyNotEnforceableError, match="4321:4321"):
            session.pause()
        assert not session.paused and _state(session)["Running"]


def _wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_an_idle_session_pauses_itself_and_a_busy_one_does_not() -> None:
    """``idle_pause_seconds``: no call and next to no CPU for that long pause it; a call resumes it."""
    backend = DockerBackend(runtime="runsc", checkpoints=True, idle_pause_seconds=1.0)
    with backend, backend.session() as session:
        start_keeper(session, QUIET_KEEPER)
        kept = token(session)
        assert _wait_for(lambda: session.paused, 20), "an idle session did not pause itself"
        assert not _state(session)["Running"]  # on disk
        assert token(session) == kept  # the call resumed it, the program and its memory kept
        assert not session.paused
        # A program spinning on the CPU keeps the session awake, without any call.
        spin = "nohup sh -c 'while [ ! -e /tmp/calm ]; do :; done' >/dev/null 2>&1 &"
        spun = session.execute(ExecRequest(argv=("sh", "-c", spin), timeout=30, background=True))
        assert spun.exit_code == 0, spun
        time.sleep(5)
        assert not session.paused and _state(session)["Running"]
        out(session, "touch /tmp/calm")


@pytest.mark.parametrize(
    ("options", "refusal"),
    [
        ({"checkpoints": True, "runtime": "kata-runtime"}, "runtime='runsc'"),
        ({"checkpoints": True, "runtime": "runsc", "pool": 1}, "pool="),
        ({"checkpoints": True, "runtime": "runsc", "workspace_transport": "mirror"}, "mirror"),
        ({"checkpoints": True, "runtime": "runsc", "container": "some-service"}, "container="),
        ({"runtime": "runsc", "idle_pause_seconds": 60}, "checkpoints=True"),
    ],
)
def test_what_a_checkpoint_cannot_keep_is_refused(options: dict[str, object], refusal: str) -> None:
    with pytest.raises(PolicyNotEnforceableError, match=refusal):
        config_from_options(options)


def test_without_checkpoints_a_pause_to_disk_is_refused_not_weakened() -> None:
    with DockerBackend(runtime="runsc") as plain, plain.session() as session:
        with pytest.raises(PolicyNotEnforceableError, match="keep_memory=True"):
            session.pause()
        assert not session.paused and _state(session)["Running"]
        with pytest.raises(PolicyNotEnforceableError, match="checkpoints=True"):
            session.fork(processes=True)
        with pytest.raises(PolicyNotEnforceableError, match="checkpoints=True"):
            session.snapshot(processes=True)
        assert plain.list_snapshots() == []


def test_processes_fork_and_snapshot_with_a_copy_of_the_workspace(
    backend: DockerBackend, tmp_path: Path
) -> None:
    """``fork(processes=True)`` of a session with a workspace: the fork's programs go on in a copy of it.

    The copy is its own host directory (the workspace's owner's), bound where the parent's is inside, its
    ``.git`` read-only as the parent's; what either writes stays its own; the fork's close removes it.
    ``snapshot(processes=True)`` keeps a copy of the workspace beside the checkpoint: a session from it
    (after its source closed) goes on with the program, in a copy of its own.
    """
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "held.txt").write_text("parent\n")
    for path in (workspace, workspace / "held.txt"):
        os.chown(path, 1000, 1000)
    with backend.session(workspace) as session:
        inside = session.workspace_inside
        _hold(session, f"{inside}/held.txt")
        child = session.fork(processes=True)
        try:
            copy = child.workspace
            assert copy is not None and copy != session.workspace and child.workspace_inside == inside
            assert os.stat(copy).st_uid == 1000
            held = out(child, "ps -eo args | grep 'held[.]txt'")
            assert f"{inside}/held.txt" in held  # the parent's program, restored in the fork
            assert out(child, "id -u; cat held.txt") == "1000\nparent"
            out(child, "echo child > held.txt")
            assert (workspace / "held.txt").read_text() == "parent\n"  # the parent's is untouched
            assert Path(copy, "held.txt").read_text() == "child\n"
            out(session, "echo parent2 > held.txt")
            assert out(child, "cat held.txt") == "child"
            refused = child.execute(ExecRequest(argv=("sh", "-c", "touch .git/planted"), timeout=30))
            assert refused.exit_code != 0 and not Path(copy, ".git", "planted").exists()
        finally:
            child.close()
        assert not os.path.exists(copy)
        assert session.capabilities().snapshots == ("files", "processes", "memory")
        snap = session.snapshot(processes=True)
    try:  # the source closed: the snapshot holds its workspace and processes
        assert snap.workspace == inside and Path(snap.workspace_dir, "held.txt").read_text() == "parent2\n"
        with backend.session(snapshot=snap) as restored:
            assert restored.workspace_inside == inside and restored.workspace != str(workspace)
            assert f"{inside}/held.txt" in out(restored, "ps -eo args | grep 'held[.]txt'")
            assert out(restored, "id -u; cat held.txt") == "1000\nparent2"
            out(restored, "echo restored > held.txt")
            assert Path(snap.workspace_dir, "held.txt").read_text() == "parent2\n"
            assert (workspace / "held.txt").read_text() == "parent2\n"
            planted = restored.execute(ExecRequest(argv=("sh", "-c", "touch .git/planted"), timeout=30))
            assert planted.exit_code != 0
    finally:
        backend.remove_snapshot(snap)


HOLD = "import sys, time\nf = open(sys.argv[1])\n{after}\nwhile True:\n    time.sleep(1)\n"


def _hold(session: DockerSession, path: str, after: str = "") -> None:
    """A background program holding ``path`` open (then running ``after``), until the session ends."""
    program = HOLD.format(after=after)
    script = 'nohup python3 -c "$HOLD" "$1" >/dev/null 2>&1 & sleep 0.5'
    started = session.execute(
        ExecRequest(
            argv=("sh", "-c", script, "hold", path), env={"HOLD": program}, timeout=30, background=True
        )
    )
    assert started.exit_code == 0, started


def test_a_host_file_held_by_a_paused_program_is_named_when_it_goes(
    backend: DockerBackend, tmp_path: Path
) -> None:
    """A file of the workspace a program holds, removed on the host while paused: the resume is refused by
    name, nothing lost; put back, the session resumes with the program. One deleted while held open before
    the pause cannot be saved: the pause is refused by name and the session runs on."""
    (tmp_path / "held.txt").write_text("kept\n")
    (tmp_path / "gone.txt").write_text("soon gone\n")
    with backend.session(tmp_path) as session:
        inside = session.workspace_inside
        assert inside is not None
        _hold(session, f"{inside}/gone.txt", after="import os; os.unlink(f.name)")
        with pytest.raises(PolicyNotEnforceableError, match=r"gone\.txt"):
            session.pause()
        assert not session.paused and _state(session)["Running"]
        out(session, "pkill -f 'gone[.]txt'; true")
        _hold(session, f"{inside}/held.txt")
        session.pause()
        (tmp_path / "held.txt").unlink()
        with pytest.raises(SandboxFailedError, match=r"held\.txt"):
            session.resume()
        assert session.paused and not _state(session)["Running"]  # nothing was done: still on disk
        (tmp_path / "held.txt").write_text("back\n")
        session.resume()
        assert "held.txt" in out(session, "ps -eo args | grep 'held[.]txt'")


def test_a_held_file_resized_while_paused(backend: DockerBackend, tmp_path: Path) -> None:
    """A workspace file a paused program holds, rewritten on the host to another size (as a file tool
    would): gVisor resumes with the new file; runc's restore (CRIU) would refuse it and lose every
    process, so the resume is refused by name with nothing done, and resumes once the file is back."""
    held = tmp_path / "held.txt"
    held.write_text("kept\n")
    with backend.session(tmp_path) as session:
        _hold(session, f"{session.workspace_inside}/held.txt")
        session.pause()
        held.write_text("a longer text, written while the session was paused\n")
        if backend.runtime == "runc":
            with pytest.raises(SandboxFailedError, match=r"held\.txt.*5 -> 52 bytes"):
                session.resume()
            assert session.paused and not _state(session)["Running"]
            held.write_text("back\n")
        session.resume()
        assert "held.txt" in out(session, "ps -eo args | grep 'held[.]txt'")


def test_the_sandboxs_list_of_held_files_makes_the_host_look_at_nothing_outside(
    backend: DockerBackend, tmp_path: Path
) -> None:
    """Attack: the list of held files comes from inside, so the sandbox writes it. A held file's path with
    a newline names a second, forged path under the workspace, through a symlink the sandbox planted there
    to a host directory outside it. The host must not follow it: before, it checked that outside file at
    the resume and refused the resume when it was gone ("removed while paused"), telling the caller
    whether any host path exists (and, on runc, its size)."""
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (outside / "target").write_text("outside\n")
    with backend.session(workspace) as session:
        inside = session.workspace_inside
        assert inside is not None
        forged = f"/tmp/x\n{inside}/link"  # read back as two lines: "/tmp/x" and "<workspace>/link/target"
        made = f'd="$(printf \'{forged}\')"; mkdir -p "$d" && echo in >"$d/target"'
        out(session, f"ln -s ../outside {inside}/link && {made}")
        _hold(session, f"{forged}/target")
        session.pause()
        (outside / "target").unlink()  # what the forged line names on the host
        session.resume()
        assert "python3" in out(session, "ps -eo args | grep 'import sys[,]'")  # the holder is back


def test_a_snapshot_keeps_every_process_for_each_session_started_from_it(backend: DockerBackend) -> None:
    """``snapshot(processes=True)``: sessions from it go on where each program was, apart from each other.

    The source is closed before they start: the snapshot is all they need. It lives in the host's store,
    outside every mount the sandbox had, so nothing in the sandbox could rewrite it before a restore.
    """
    with backend.session() as source:
        start_keeper(source)
        kept = token(source)
        out(source, "echo before > /tmp/mark")
        assert source.capabilities().snapshots == ("files", "processes", "memory")
        snap = source.snapshot(processes=True)
        assert snap.carries == ("files", "processes", "memory") and snap.processes is not None
        assert 0 < snap.size_bytes <= MEMORY_MB * 1024 * 1024
        out(source, "echo after > /tmp/mark")  # the source ran on: not in the snapshot
        assert token(source) == kept
        mounts = [m["Source"] for m in _client().api.inspect_container(source.container_id)["Mounts"]]
        assert not any(snap.path.startswith(source_dir.rstrip("/") + "/") for source_dir in mounts)
        assert os.stat(snap.path).st_mode & 0o077 == 0
        assert not os.path.realpath(snap.path).startswith("/dev/shm")  # on disk, not host memory
    try:
        first, second = backend.session(snapshot=snap), backend.session(snapshot=snap)
        try:
            assert first.container_id != second.container_id
            assert token(first) == kept == token(second)  # the program and its memory, in each
            draw = "od -An -N16 -tx1 /dev/urandom | tr -d ' \\n'"
            assert len({out(first, draw), out(second, draw)}) == 2  # each draws its own randomness
            assert out(first, "cat /tmp/mark") == out(second, "cat /tmp/mark") == "before"
            out(first, "echo first > /tmp/mark")
            assert out(second, "cat /tmp/mark") == "before"  # apart
            ticks = int(out(second, "cat /tmp/ticks"))
            time.sleep(0.5)
            assert int(out(second, "cat /tmp/ticks")) > ticks  # each one's counter runs
            first.pause()  # and each is a keeper session like any other
            first.resume()
            assert token(first) == kept
        finally:
            first.close()
            second.close()
    finally:
        backend.remove_snapshot(snap)
    assert not os.path.exists(snap.path)


#: Fetches a URL through the proxy its environment names; prints the body, or the HTTP error's status.
FETCH = """
import sys, urllib.error, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=20).read().decode(), end="")
except urllib.error.HTTPError as error:
    print(error.code)
except Exception as error:
    print("FAILED", type(error).__name__)
"""
#: Started under the session's policy: each time /tmp/go appears it fetches $URL through the proxy its
#: environment named then (the port of that moment), into /tmp/got.
FETCHER = (
    'while :; do if [ -e /tmp/go ]; then rm /tmp/go; python3 -c "$FETCH" "$URL" > /tmp/got.new 2>&1; '
    "mv /tmp/got.new /tmp/got; fi; sleep 0.1; done"
)


def _fetched_by_the_program(session: DockerSession) -> str:
    return out(
        session, "rm -f /tmp/got; touch /tmp/go; while [ ! -e /tmp/got ]; do sleep 0.1; done; cat /tmp/got"
    )


def _fetch(session: DockerSession, url: str, *unset: str) -> str:
    argv = ("env", *(f"-u{name}" for name in unset), "python3", "-c", FETCH, url)
    return session.execute(ExecRequest(argv=argv, timeout=60)).stdout.strip()


def test_a_network_policy_goes_with_the_sandbox_through_pause_fork_and_snapshot(
    backend: DockerBackend,
) -> None:
    """The agent's proxy endpoint is in the checkpoint; every restored copy serves it under its own network.

    A program started under the policy keeps the proxy port its environment named. After a pause to disk,
    in a fork and in sessions from a snapshot it and new commands reach the allowed name, a name the
    policy does not allow gets a 403, and with the proxy variables unset nothing reaches out (network
    none). The fork's network is its own (the parent turned off does not turn it off). A session from
    the snapshot on a backend without a policy answers each connection with a 403. Attack on the old
    design: the agent let go for the checkpoint lost its listener, so after a resume every proxied
    connection was closed while the session believed it served them, and a copy left it unserved.
    """
    from tests.integration.egress_servers import Upstream  # noqa: PLC0415

    server, other = Upstream(body=b"from the host"), Upstream(body=b"not for you")
    policy = NetworkPolicy(
        allow=[f"allowed.test:{server.port}"],
        hosts={"allowed.test": ["127.0.0.1"], "denied.test": ["127.0.0.1"]},
    )
    allowed = f"http://allowed.test:{server.port}"
    try:
        with backend.session() as parent:
            parent.set_network(policy)
            started = parent.execute(
                ExecRequest(
                    argv=("sh", "-c", f"nohup sh -c '{FETCHER}' >/dev/null 2>&1 &"),
                    env={"FETCH": FETCH, "URL": f"{allowed}/program"},
                    timeout=60,
                    background=True,
                )
            )
            assert started.exit_code == 0, started
            assert _fetched_by_the_program(parent) == "from the host"
            parent.pause()
            assert parent.paused and not _state(parent)["Running"]
            assert _fetch(parent, f"{allowed}/resumed") == "from the host"
            assert _fetched_by_the_program(parent) == "from the host"
            with parent.fork(processes=True) as fork:
                assert fork.capabilities().network_policy == policy
                assert _fetched_by_the_program(fork) == "from the host"
                assert _fetch(fork, f"http://denied.test:{other.port}/no") == "403"
                direct = _fetch(fork, f"http://127.0.0.1:{other.port}/", "HTTP_PROXY", "http_proxy")
                assert direct.startswith("FAILED"), direct
                assert [entry.decision for entry in fork.network_log().entries] == ["allowed", "refused"]
                parent.set_network(False)
                assert _fetch(parent, f"{allowed}/off") == "403"
                assert _fetched_by_the_program(fork) == "from the host"  # the fork's network is its own
                parent.set_network(policy)
            snap = parent.snapshot(processes=True)
        try:
            with backend.session(snapshot=snap) as closed_off:  # this backend gives no policy
                assert closed_off.capabilities().network_policy is None
                assert _fetched_by_the_program(closed_off) == "403"
                assert _fetch(closed_off, f"{allowed}/x") == "403"
            with (
                DockerBackend(
                    runtime=backend.runtime,
                    checkpoints=True,
                    network=policy,
                    limits=ResourceLimits(memory_mb=MEMORY_MB),
                ) as allowing,
                allowing.session(snapshot=snap) as copy,
            ):
                assert _fetched_by_the_program(copy) == "from the host"
        finally:
            backend.remove_snapshot(snap)
        paths = [head.split(b" ")[1] for head in server.received]
        assert b"/off" not in paths and b"/x" not in paths, paths
        assert paths.count(b"/program") == 5 and b"/resumed" in paths, paths
        assert other.received == [] and other.delivered == 0
    finally:
        server.close()
        other.close()


def test_a_snapshot_over_its_cap_or_of_another_image_is_refused(
    backend: DockerBackend, session: DockerSession
) -> None:
    out(session, "head -c 3000000 /dev/urandom > /tmp/blob")  # in the sandbox's memory: in a checkpoint
    try:
        with pytest.raises(PolicyNotEnforceableError, match="cap of 1 MiB"):
            session.snapshot(processes=True, max_mb=1)
    finally:
        out(session, "rm /tmp/blob")
    assert backend.list_snapshots() == []
    assert not [name for name in os.listdir(backend.snapshots.root) if name.startswith(".partial")]
    assert len(token(session)) == 32  # it ran on
    snap = session.snapshot(processes=True)
    try:
        moved = snap.model_copy(update={"image_id": "sha256:" + "0" * 64})
        with pytest.raises(InvalidRequestError, match="only with the files"):
            backend.session(snapshot=moved)
    finally:
        backend.remove_snapshot(snap)


LEAK = """
import os, signal
from adk_sandbox.executor import ExecRequest
from adk_sandbox.executor.backends.docker import DockerBackend
session = DockerBackend(runtime="runsc", checkpoints=True).session()
session.execute(ExecRequest(argv=("true",), timeout=30))
session.pause()
print(session.container_id, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_session_on_disk_whose_owner_died_is_reaped(session: DockerSession) -> None:
    del session  # the module's backend made: the engine is checked
    done = subprocess.run(
        [sys.executable, "-c", LEAK], capture_output=True, text=True, timeout=180, check=False
    )
    container = done.stdout.strip().splitlines()[-1]
    client = _client()
    try:
        assert not client.api.inspect_container(container)["State"]["Running"]
        reaped = reap_leaked(client)
        assert container in [leaked.id for leaked in reaped]
        with pytest.raises(docker.errors.NotFound):
            client.api.inspect_container(container)
    finally:
        client.close()
