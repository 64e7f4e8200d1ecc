"""The task profile (issue 22): an evaluation's image as it is, root and a writable root, inside a boundary.

What a task needs works (root by default, user names, writes anywhere, ``adduser``, a capped root), and
the boundary is shown by attacks made as root in the sandbox, each checked from the host. Every attack
also runs in a *naive* task container -- the shape other harnesses use: a writable root, Docker's default
capabilities and seccomp, network none -- and the test says which of them get through there: those are the
ones the profile's own choices (the capability subset, the cap on the root, the copied workspace) stop.

The checks themselves (``check_*``, :data:`ATTACKS`) take their session or backend as arguments: the
modern engine's module (:mod:`tests.integration.test_docker_modern_engine`) runs them there too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from adk_sandbox.executor import ExecRequest, ExecResult, Language
from adk_sandbox.executor.backends.docker import DockerBackend
from adk_sandbox.executor.errors import InvalidRequestError, SandboxFailedError
from adk_sandbox.executor.types import ResourceLimits
from tests.conftest import require

pytestmark = pytest.mark.docker

IMAGE = "adk-sandbox/base:latest"
LIMITS = ResourceLimits(memory_mb=512, pids=128)
RUNTIMES = ["runc", "runsc"]


def run(session: Any, code: str, timeout: float = 60, user: str | None = None) -> ExecResult:
    request = ExecRequest(language=Language.COMMAND, code=code, timeout=timeout, user=user)
    result: ExecResult = session.execute(request)
    return result


def _runtime_ready(runtime: str) -> None:
    client = docker.from_env()
    try:
        runtimes = client.info().get("Runtimes") or {}
    finally:
        client.close()
    require(runtime in runtimes, f"the Docker engine does not list the runtime {runtime} (scripts/setup)")


@pytest.fixture(scope="module", params=RUNTIMES)
def backend(request: pytest.FixtureRequest) -> Iterator[DockerBackend]:
    runtime = str(request.param)
    _runtime_ready(runtime)
    with DockerBackend(IMAGE, limits=LIMITS, runtime=None if runtime == "runc" else runtime,
                       profile="task") as made:  # fmt: skip
        yield made


@pytest.fixture(scope="module")
def session(backend: DockerBackend) -> Iterator[Any]:
    """One task session per runtime, shared by the attacks that leave nothing behind."""
    with backend.session() as opened:
        yield opened


@pytest.fixture(scope="module")
def naive() -> Iterator[Any]:
    """A naive task container: writable root, Docker's default capabilities and seccomp, network none."""
    client = docker.from_env()
    options = {"network_mode": "none", "user": "0:0", "pids_limit": LIMITS.pids, "mem_limit": "512m"}
    container = client.containers.run(IMAGE, ["sleep", "600"], detach=True, **options)
    try:
        yield container
    finally:
        with contextlib.suppress(docker.errors.DockerException):
            container.remove(force=True)
        client.close()


def naive_run(container: Any, code: str) -> str:
    _, output = container.exec_run(["sh", "-c", code], user="0:0")
    return bytes(output).decode(errors="replace")


# -- what a task needs ------------------------------------------------------------------------------------
def check_writable_root(session: Any) -> None:
    """Commands run as the image's user (root) and write anywhere in the root filesystem."""
    result = run(session, "id -u; echo patched > /etc/motd && cat /etc/motd; mkdir -p /testbed && "
                          "echo x > /testbed/f && sed -i s/x/y/ /testbed/f && cat /testbed/f")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split() == ["0", "patched", "y"]


def test_commands_run_as_the_images_user_with_a_writable_root(session: Any) -> None:
    check_writable_root(session)


def test_users_are_added_and_named(backend: DockerBackend) -> None:
    # A session of its own: each new user starts an agent of its own, and "taskuser:root" gives up
    # taskuser's (the same uid). Under gVisor that give-up once stopped the whole sandbox (an agent that
    # exited while its spare was dying; see docs/docker/agent-channel.md "Leaving"); the module's shared
    # session, which the attack tests use, stays out of whatever a new user's agent may still bring.
    with backend.session() as session:
        made = run(session, "id -u taskuser >/dev/null 2>&1 || useradd -m taskuser; id -u taskuser")
        assert made.exit_code == 0, made.stderr
        uid = made.stdout.strip()
        assert run(session, "id -u", user="taskuser").stdout.strip() == uid
        assert run(session, "id -g", user="taskuser:root").stdout.strip() == "0"
        assert run(session, "id -u", user="root").stdout.strip() == "0"
        with pytest.raises(InvalidRequestError, match="'nosuchuser' is not in"):
            run(session, "true", user="nosuchuser")


def test_capabilities_report_the_profile(backend: DockerBackend) -> None:
    capabilities = backend.capabilities()
    assert capabilities.profile == "task"
    assert capabilities.root_cap == ("memory" if backend.runtime == "runsc" else "watched")
    assert capabilities.network and capabilities.fs_write and capabilities.pids


def test_the_root_layer_is_discarded_at_close(backend: DockerBackend) -> None:
    with backend.session() as first:
        assert run(first, "echo left > /etc/left-behind").exit_code == 0
    with backend.session() as second:
        assert run(second, "cat /etc/left-behind").exit_code != 0


# -- attacks, as root -------------------------------------------------------------------------------------
#: name -> (a command that prints ESCAPED when the attack works, whether it works in a naive container).
ATTACKS: dict[str, tuple[str, bool]] = {
    "mount": ("mount -t tmpfs t /mnt 2>/dev/null && echo ESCAPED", False),
    "unshare": (
        "unshare -m -U true 2>/dev/null && echo ESCAPED; unshare -m true 2>/dev/null && echo ESCAPED",
        False,
    ),
    "proc-sys": ("echo 1 > /proc/sys/kernel/sysrq 2>/dev/null && echo ESCAPED", False),
    "core-pattern": ("echo '|/tmp/x' > /proc/sys/kernel/core_pattern 2>/dev/null && echo ESCAPED", False),
    "cgroup-release-agent": (
        # The real files live in the hierarchies (a file of that name on the tmpfs above them is nothing).
        "for f in /sys/fs/cgroup/*/release_agent /sys/fs/cgroup/*/notify_on_release "
        "/sys/fs/cgroup/*/cgroup.procs; do [ -e $f ] && { echo 1 > $f; } 2>/dev/null && echo ESCAPED; done; "
        "mkdir -p /tmp/cg; "
        "mount -t cgroup -o memory cgroup /tmp/cg 2>/dev/null && echo ESCAPED",
        False,
    ),
    "keyring": (
        "python3 -c 'import ctypes,sys; l=ctypes.CDLL(None, use_errno=True); "
        'sys.exit(0 if l.syscall(248, b"user", b"k", b"v", 1, -4) >= 0 else 1)\' && echo ESCAPED',
        False,
    ),
    "raw-socket": (
        "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)' 2>/dev/null "
        "&& echo ESCAPED",
        True,
    ),
    "mknod-block-device": ("mknod /tmp/sda$$ b 8 0 2>/dev/null && echo ESCAPED", True),
    "chroot": ("chroot / true 2>/dev/null && echo ESCAPED", True),
    "setfcap": (
        'cp /bin/true /tmp/t && python3 -c \'import os; os.setxattr("/tmp/t", '
        '"security.capability", bytes.fromhex("0100000200200000000000000000000000000000"))\' '
        "2>/dev/null && echo ESCAPED",
        True,
    ),
}


#: What gVisor's own kernel (the sentry) lets root do *inside* it, with no host object behind: a device node
#: it never opens on the host, a mount or user namespace of its own, its emulated cgroupfs. The hardened
#: profile under gVisor allows the same (no capability needed there). Checked strictly, so a change shows.
GVISOR_INSIDE = {"cgroup-release-agent", "mknod-block-device", "unshare"}


def check_attack(runtime: str | None, session: Any, attack: str) -> None:
    """The profile's side of ``attack`` (a name in :data:`ATTACKS`), made as root in ``session``: nowhere,
    or under gVisor (``runtime``) only as far as the sentry's own objects (:data:`GVISOR_INSIDE`)."""
    code, _ = ATTACKS[attack]
    result = run(session, code)
    if runtime == "runsc" and attack in GVISOR_INSIDE:
        assert "ESCAPED" in result.stdout, f"gVisor now refuses {attack}: take it off GVISOR_INSIDE"
        # The node is the sentry's: reading it reaches no host disk.
        device = run(session, "mknod /tmp/sdz b 8 0 2>/dev/null; head -c 512 /tmp/sdz | wc -c")
        assert device.stdout.strip() in ("", "0"), device
    else:
        assert "ESCAPED" not in result.stdout, f"{attack} worked in the task profile: {result.stdout}"


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_attacks_as_root_get_nowhere(backend: DockerBackend, session: Any, naive: Any, attack: str) -> None:
    check_attack(backend.runtime, session, attack)
    code, naive_breaks = ATTACKS[attack]
    # The same attack in a naive task container: the test can tell (or Docker's defaults stop it too).
    assert ("ESCAPED" in naive_run(naive, code)) is naive_breaks, attack


def test_another_session_is_out_of_sight(backend: DockerBackend, session: Any) -> None:
    marker = "adk-task-neighbour-" + os.urandom(4).hex()
    with backend.session() as other:
        code = f"bash -c 'exec -a {marker} sleep 120' >/dev/null 2>&1 &"
        request = ExecRequest(language=Language.COMMAND, code=code, timeout=10, background=True)
        started = other.execute(request)
        assert started.exit_code == 0, started
        wait = f"for i in $(seq 50); do grep -q ^{marker} /proc/[0-9]*/cmdline && break; sleep 0.1; done; "
        assert run(other, wait + f"grep -l ^{marker} /proc/[0-9]*/cmdline | wc -l").stdout.strip() == "1"
        # ptrace, signals and /proc need a pid in sight; the neighbour's are in none of this sandbox's.
        seen = run(session, f"grep -l ^{marker} /proc/[0-9]*/cmdline 2>/dev/null | wc -l")
        assert seen.stdout.strip() == "0"


def test_a_fork_bomb_is_contained(backend: DockerBackend, session: Any) -> None:
    # Its own sandbox may die of it (gVisor's sentry sometimes does, at the pids limit): contained is about
    # everything else.
    with backend.session() as bombed, contextlib.suppress(SandboxFailedError):
        run(bombed, "b() { b | b & }; b", timeout=10)
    assert run(session, "echo alive").stdout.strip() == "alive"  # the neighbour and the host go on


#: Files of 32 MiB (each within the fsize limit) until the disk or the session gives out; exit 3 when a write
#: fails.
DISK_BOMB = (
    "i=0; while [ $i -lt 40 ]; do dd if=/dev/zero of=/bomb$i bs=1M count=32 2>/dev/null || exit 3; "
    "i=$((i+1)); done; sleep 5"
)


def check_disk_bomb(
    backend: DockerBackend, client: docker.DockerClient, bomb: str = DISK_BOMB, **options: Any
) -> None:
    """A disk bomb (``bomb``) in a task session like ``backend``'s (``options``: more of its arguments, e.g.
    its engine, which ``client`` reaches) stops at the root cap, however this engine holds it (``root_cap``):
    gVisor's memory, the storage driver's quota, or the watch on the layer; and the container is gone
    after."""
    runtime = backend.runtime
    capped = DockerBackend(IMAGE, limits=LIMITS, runtime=runtime, profile="task",
                           root_size_mb=None if runtime == "runsc" else 64, **options)  # fmt: skip
    with capped, capped.session() as session:
        container_id = session.container_id
        assert capped.root_cap is not None
        cap = capped.root_cap[0]
        if cap == "quota":  # the engine refuses the write past the cap (ENOSPC); the session goes on
            assert run(session, bomb, timeout=120).exit_code == 3
            assert run(session, "echo again").stdout.strip() == "again"
        else:
            with pytest.raises(SandboxFailedError) as info:
                for _ in range(3):
                    run(session, bomb, timeout=120)
            if cap == "watched":
                assert "root_size_mb" in str(info.value)
                with pytest.raises(SandboxFailedError):
                    run(session, "echo again")  # stopped, not silently replaced by a fresh container
            else:  # memory: the whole sandbox died of it (an OOM): a next call fails or gets a fresh sandbox
                with contextlib.suppress(SandboxFailedError):
                    assert run(session, "ls /bomb0").exit_code != 0
    for _ in range(120):  # its layer is gone with it (an OOM-killed sandbox may take a moment)
        try:
            client.containers.get(container_id)
        except docker.errors.NotFound:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"the container {container_id[:12]} is still there")


def test_a_disk_bomb_stops_the_session_at_the_root_cap(backend: DockerBackend) -> None:
    client = docker.from_env()
    try:
        check_disk_bomb(backend, client)
    finally:
        client.close()


# -- the host workspace travels as a copy; set-id bits and file capabilities never come back ---------------
@pytest.fixture
def workspace() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="adk-task-", dir="/tmp"))
    (root / "README").write_text("hello\n")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def check_set_id_files_come_back_plain(backend: DockerBackend, workspace: Path) -> None:
    """Inside, the set-id modes are really set (a task sandbox allows them); on the host they are gone.

    Fails on a pull-back that keeps the mode it lists (the host would get a set-uid root shell), and the
    inside check fails if the sandbox still filtered set-id modes (the pull-back would be untested)."""
    with backend.session(workspace) as session:
        assert session.workspace_transport == "mirror"
        result = run(session, "cp /bin/sh ./rootshell && chmod 4755 ./rootshell && chmod 2755 ./README && "
                              "stat -c '%a %n' rootshell README && cp /bin/true ./capped && "
                              "python3 -c 'import os; os.setxattr(\"capped\", \"security.capability\", "
                              "bytes(20))' 2>/dev/null; echo done")  # fmt: skip
        assert "4755 rootshell" in result.stdout and "2755 README" in result.stdout, result
        assert "done" in result.stdout
    for name in ("rootshell", "README", "capped"):
        path = workspace / name
        if path.exists():
            assert path.stat().st_mode & (stat.S_ISUID | stat.S_ISGID) == 0, name
            assert "security.capability" not in os.listxattr(path), name
    assert (workspace / "rootshell").exists()


def test_a_host_workspace_is_a_copy_and_set_id_files_come_back_plain(
    backend: DockerBackend, workspace: Path
) -> None:
    check_set_id_files_come_back_plain(backend, workspace)


def _setuid_package(directory: Path) -> Path:
    """A .deb holding one set-uid root program, as a package like sudo ships, built on the host."""
    root = directory / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        "Package: adk-setuid-probe\nVersion: 1.0\nArchitecture: all\n"
        "Maintainer: tests <tests@example.invalid>\nDescription: a set-uid program\n"
    )
    (root / "usr" / "local" / "bin").mkdir(parents=True)
    program = root / "usr" / "local" / "bin" / "probe-suid"
    shutil.copy("/bin/true", program)
    program.chmod(0o4755)
    deb = directory / "adk-setuid-probe.deb"
    import subprocess  # noqa: PLC0415 - only this test builds a package

    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)], check=True,
                   capture_output=True)  # fmt: skip
    shutil.rmtree(root)
    return deb


def check_dpkg_installs_a_set_uid_program(backend: DockerBackend, workspace: Path) -> None:
    """What a task does (apt/dpkg installing sudo, passwd, ...) works: the set-uid file is made in the
    sandbox's root. Under the per-command set-id filter (the hardened channel) dpkg fails at its chmod."""
    require(shutil.which("dpkg-deb") is not None, "dpkg-deb is needed to build the test package")
    _setuid_package(workspace)
    with backend.session(workspace) as session:
        program = "/usr/local/bin/probe-suid"
        result = run(
            session,
            f"dpkg -i adk-setuid-probe.deb >/dev/null && stat -c '%a %U' {program} && {program} && echo ran",
        )
        assert result.exit_code == 0, result
        assert result.stdout.split() == ["4755", "root", "ran"]


def test_dpkg_installs_a_set_uid_program(backend: DockerBackend, workspace: Path) -> None:
    check_dpkg_installs_a_set_uid_program(backend, workspace)


def test_a_forced_bind_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="only as a copy"):
        DockerBackend(IMAGE, profile="task", workspace_transport="bind")


# -- an image with a named USER ---------------------------------------------------------------------------
NAMED_USER_IMAGE = "adk-sandbox-test/named-user:latest"


@pytest.fixture(scope="module")
def named_user_image() -> str:
    """``FROM`` the base image with ``USER app`` (a name, not a number), as many task images are made."""
    client = docker.from_env()
    try:
        with tempfile.TemporaryDirectory() as context:
            dockerfile = f"FROM {IMAGE}\nRUN useradd -m -u 4321 app\nUSER app\nWORKDIR /home/app\n"
            Path(context, "Dockerfile").write_text(dockerfile)
            client.images.build(path=context, tag=NAMED_USER_IMAGE, rm=True, network_mode="none")
    finally:
        client.close()
    return NAMED_USER_IMAGE


def test_an_images_named_user_is_who_commands_run_as(backend: DockerBackend, named_user_image: str) -> None:
    """``USER app`` is looked up in the image's own /etc/passwd; root stays reachable by ``user=``."""
    runtime = backend.runtime
    with DockerBackend(named_user_image, limits=LIMITS, runtime=runtime, profile="task") as made:  # noqa: SIM117
        with made.session() as session:
            assert run(session, "id -un; id -u; pwd").stdout.split() == ["app", "4321", "/home/app"]
            assert (
                run(session, "touch /etc/app-cannot 2>&1 || echo refused").stdout.strip().endswith("refused")
            )
            assert run(session, "touch /etc/root-can && echo made", user="root").stdout.strip() == "made"
