"""Attacks on the container side, as a hostile agent inside would make them (issue 10, items 1-4).

Each test plants or asks for something that would hurt the host, then checks from the host that nothing
got out: host git runs nothing the sandbox wrote, no set-id file the host honours appears, an attached
container that can reach the engine or the host's files is refused or reported as such, and a daemon
that sees a different directory at the workspace path is refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from adk_sandbox.executor import (
    ExecRequest,
    ExecResult,
    Language,
    PolicyNotEnforceableError,
    SandboxFailedError,
)
from adk_sandbox.executor.backends.docker import DockerBackend
from adk_sandbox.executor.backends.docker._seccomp import load_profile, profile_option
from adk_sandbox.executor.channel import static_agent as _static_agent
from tests.conftest import require

pytestmark = pytest.mark.docker

IMAGE = "adk-sandbox/base:latest"
ALLOW = "SCMP_ACT_ALLOW"


def run(session: Any, code: str, timeout: float = 30) -> ExecResult:
    result: ExecResult = session.execute(ExecRequest(language=Language.COMMAND, code=code, timeout=timeout))
    return result


def host_git(workspace: Path, *args: str, uid: int = 1000) -> subprocess.CompletedProcess[str]:
    """Host git as the workspace owner, the way a developer runs it after an agent's session."""
    env = {"PATH": os.environ["PATH"], "HOME": str(workspace), "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "git", *args],
        cwd=workspace, env=env, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip


@pytest.fixture
def reachable_workspace() -> Iterator[Path]:
    """A uid-1000 workspace whose parents uid 1000 can traverse (pytest's tmp dirs are root-only)."""
    root = Path(tempfile.mkdtemp(prefix="adk-attack-", dir="/tmp"))
    os.chown(root, 1000, 1000)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def repo(reachable_workspace: Path) -> Path:
    """A git repository with one commit, owned by uid 1000 like a developer's checkout."""
    owned_workspace = reachable_workspace
    subprocess.run(["git", "init", "-q", str(owned_workspace)], check=True)
    (owned_workspace / "a.txt").write_text("a\n")
    for path in [owned_workspace, *owned_workspace.rglob("*")]:
        os.lchown(path, 1000, 1000)
    assert host_git(owned_workspace, "add", "a.txt").returncode == 0
    committed = host_git(owned_workspace, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    assert committed.returncode == 0, committed.stderr
    return owned_workspace


# -- 1. .git: nothing the container writes makes host git execute code ---------------------------------
FSMONITOR_ATTACK = textwrap.dedent(
    """\
    mkdir -p evil && cp -r .git/objects .git/refs .git/HEAD evil/ 2>/dev/null
    printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = "touch {ran}; false"\\n' > evil/config
    echo ../evil > .git/commondir && echo commondir-written
    """
)
RENAME_ATTACK = textwrap.dedent(
    """\
    mv .git .git-aside && echo renamed
    rm -rf .git 2>/dev/null; mkdir -p .git/hooks && cp -r .git-aside/* .git/ 2>/dev/null
    printf '[core]\\n\\tfsmonitor = "touch {ran}; false"\\n' > .git/config
    printf '#!/bin/sh\\ntouch {ran}\\n' > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit
    git init -q nested-init 2>/dev/null; echo done
    """
)


@pytest.mark.parametrize("attack", [FSMONITOR_ATTACK, RENAME_ATTACK], ids=["commondir", "rename"])
def test_host_git_runs_nothing_the_sandbox_planted(
    docker_backend: DockerBackend, repo: Path, attack: str
) -> None:
    ran = Path(f"/tmp/RAN-{repo.name}")
    with docker_backend.session(workspace=repo) as session:
        result = run(session, attack.format(ran=ran))
        (repo / "a.txt").write_text("changed on the host\n")
        for args in (("status",), ("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "x")):
            host_git(repo, *args)
        assert not ran.exists(), "host git ran a command planted by the sandbox"
        assert "commondir-written" not in result.stdout and "renamed" not in result.stdout, result
        assert "Read-only file system" in result.stderr or "busy" in result.stderr.lower(), result
    assert (repo / ".git" / "HEAD").is_file() and not (repo / ".git" / "commondir").exists()
    assert not (repo / ".git-aside").exists()


def test_a_session_may_read_the_repository_but_not_change_it(
    docker_backend: DockerBackend, repo: Path
) -> None:
    (repo / "a.txt").write_text("changed\n")
    with docker_backend.session(workspace=repo) as session:
        looked = run(session, "git status --short; git log --oneline | wc -l; git diff --stat | tail -1")
        assert looked.exit_code == 0, looked
        assert looked.stdout.splitlines()[:2] == [" M a.txt", "1"]
        commit = run(session, "git -c user.name=s -c user.email=s@s commit -qam inside")
        assert commit.exit_code != 0 and "Read-only file system" in commit.stderr, commit
    assert host_git(repo, "rev-list", "--count", "HEAD").stdout.strip() == "1"


def test_without_a_git_directory_the_sandbox_cannot_create_one(
    docker_backend: DockerBackend, reachable_workspace: Path
) -> None:
    owned_workspace = reachable_workspace
    ran = Path(f"/tmp/RAN-{owned_workspace.name}")
    with docker_backend.session(workspace=owned_workspace) as session:
        result = run(
            session,
            f"git init -q . ; mkdir -p .git/hooks; printf '[core]\\n\\tfsmonitor = \"touch {ran}\"\\n' "
            "> .git/config; ls -A .git | wc -l",
        )
        assert result.stdout.strip() == "0", result
        assert host_git(owned_workspace, "status").returncode != 0  # still not a repository
        assert not ran.exists()
    assert not (owned_workspace / ".git").exists()  # the empty placeholder is gone with the session


def test_a_symlinked_git_directory_is_refused(docker_backend: DockerBackend, owned_workspace: Path) -> None:
    (owned_workspace / ".git").symlink_to(owned_workspace.parent)
    with pytest.raises(PolicyNotEnforceableError, match="symbolic link"):
        docker_backend.session(workspace=owned_workspace)


# -- 2. No set-id file the host honours ----------------------------------------------------------------
SETID_ATTACK = "chmod 4755 tool; chmod 2755 tool; chmod u+s tool; " + (
    "python3 -c \"import os; os.open('t2', os.O_CREAT | os.O_WRONLY, 0o6755)\"; "
    "python3 -c \"import os; os.mknod('t3', 0o106755)\"; "
    "python3 -c \"import os; os.chmod('tool', 0o4755, follow_symlinks=False)\"; ls -l"
)


def _host_view_of_setid(workspace: Path) -> list[str]:
    """Files in the workspace with a set-id bit, and what running the planted tool as nobody gives."""
    found = [str(p) for p in workspace.iterdir() if p.lstat().st_mode & (stat.S_ISUID | stat.S_ISGID)]
    tool = workspace / "tool"
    if tool.exists():
        probe = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(tool), "-p", "-c", "id -u"],
            capture_output=True, text=True, check=False, timeout=30,
        )  # fmt: skip
        if probe.stdout.strip() != "65534":
            found.append(f"tool ran as uid {probe.stdout.strip()}")
    return found


@pytest.mark.parametrize("owner", [1000, 0], ids=["uid-1000-workspace", "root-owned-workspace"])
@pytest.mark.parametrize("runtime", [None, "runsc"], ids=["runc", "gvisor"])
def test_commands_cannot_plant_setid_files_on_the_host(
    docker_backend: DockerBackend, owner: int, runtime: str | None
) -> None:
    if runtime:
        runtimes = docker_backend._client.info().get("Runtimes", {})
        require("runsc" in runtimes, "gVisor's runsc is not registered with the Docker engine")
    workspace = Path(tempfile.mkdtemp(prefix="adk-setid-", dir="/tmp"))  # nobody can reach the tool
    workspace.chmod(0o755)
    os.chown(workspace, owner, owner)
    shutil.copy("/bin/sh", workspace / "tool")  # the host's shell, so the host can run it (dash keeps -p)
    os.chown(workspace / "tool", owner, owner)
    try:
        with DockerBackend(runtime=runtime) as backend, backend.session(workspace=workspace) as session:
            result = run(session, SETID_ATTACK)
            plain = run(session, "touch p && chmod 640 p && chmod 1755 p && echo plain-modes-work")
        assert _host_view_of_setid(workspace) == []  # the host honours nothing set-id
        assert (workspace / "tool").stat().st_uid == owner
        assert result.stdout.count("Operation not permitted") + result.stderr.count("not permitted") >= 3
        assert "-rws" not in result.stdout and "-rwxr-s" not in result.stdout, result
        assert plain.stdout.strip() == "plain-modes-work"
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


#: A seccomp program that allows everything (``RET ALLOW``): the agent installs it and says "refused".
ALLOW_ALL = struct.pack("=HBBI", 0x06, 0, 0, 0x7FFF0000)


def test_a_session_whose_commands_could_set_setid_bits_is_refused(
    docker_backend: DockerBackend, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The start-up probe, not an assumption: without the per-command filter, gVisor lets exec'd commands
    set the bits (runsc applies the container's profile to its first process only), and the session
    must refuse to run."""
    require("runsc" in docker_backend._client.info().get("Runtimes", {}), "gVisor's runsc is not registered")
    # The agent built with a filter that refuses nothing (a cache of its own: a build of other sources).
    monkeypatch.setattr(_static_agent, "setid_filter", lambda arch: ALLOW_ALL)
    monkeypatch.setenv("ADK_SANDBOX_CACHE", str(tmp_path))
    _static_agent._static_or_reason.cache_clear()
    try:
        with (
            DockerBackend(runtime="runsc") as backend,
            pytest.raises(PolicyNotEnforceableError) as refused,
        ):
            backend.session().start()
    finally:
        _static_agent._static_or_reason.cache_clear()  # the next session's agent is the real one
    assert "setuid" in str(refused.value)


# -- 3 and 4. Attach mode refuses engine sockets and weakenings, and reports extra mounts truthfully ------
def _hardened(workspace: Path, **overrides: Any) -> dict[str, Any]:
    """Arguments for a compose-style container with the full sandbox hardening."""
    arguments: dict[str, Any] = {
        "image": IMAGE, "command": ["sleep", "120"], "detach": True, "network_mode": "none",
        "cap_drop": ["ALL"], "security_opt": ["no-new-privileges", profile_option()], "read_only": True,
        "mem_limit": "256m", "memswap_limit": "256m", "pids_limit": 64, "init": True, "cgroupns": "private",
        "tmpfs": {"/tmp": "rw,exec,nosuid,nodev,size=16m,mode=1777"}, "auto_remove": True,
        "labels": {"io.adk-sandbox.test": "attach"},
        "volumes": {
            str(workspace): {"bind": str(workspace), "mode": "rw"},
            str(workspace / ".git"): {"bind": str(workspace / ".git"), "mode": "ro"},
        },
    }  # fmt: skip
    volumes = overrides.pop("extra_volumes", {})
    arguments.update(overrides)
    arguments["volumes"] = {**arguments["volumes"], **volumes}
    return arguments


@contextlib.contextmanager
def attached_container(client: docker.DockerClient, **arguments: Any) -> Iterator[str]:
    container = client.containers.run(**arguments)
    try:
        yield str(container.name)
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)


def test_attaching_to_a_fully_hardened_container_works(docker_backend: DockerBackend, repo: Path) -> None:
    with (
        attached_container(docker_backend._client, **_hardened(repo)) as name,
        DockerBackend(container=name) as backend,
        backend.session(workspace=repo) as session,
    ):
        capabilities = session.capabilities()
        assert capabilities.fs_read and capabilities.fs_write
        assert run(session, "id -u; pwd").stdout.splitlines() == ["1000", str(repo)]


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"extra_volumes": {"/var/run/docker.sock": {"bind": "/run/docker.sock", "mode": "rw"}}}, "socket"),
        ({"extra_volumes": {"/run": {"bind": "/host-run", "mode": "ro"}}}, "socket"),
        ({"extra_volumes": {"/": {"bind": "/host", "mode": "ro"}}}, "socket"),
        ({"security_opt": ["no-new-privileges"]}, "setuid files"),
        ({"security_opt": ["no-new-privileges", "seccomp=unconfined"]}, "seccomp profile is disabled"),
        ({"security_opt": ["no-new-privileges", "seccomp=" + json.dumps({"defaultAction": ALLOW})]},
         "not the sandbox's"),
        ({"security_opt": ["no-new-privileges", profile_option(), "apparmor=unconfined"]}, "AppArmor"),
        ({"cgroupns": "host"}, "cgroup namespace"),
    ],
    ids=["docker-sock", "run-dir", "host-root-ro", "default-seccomp", "seccomp-unconfined",
         "seccomp-allow-all", "apparmor", "cgroupns-host"],
)  # fmt: skip
def test_attaching_to_a_weakened_container_is_refused(
    docker_backend: DockerBackend, repo: Path, overrides: dict[str, Any], problem: str
) -> None:
    with attached_container(docker_backend._client, **_hardened(repo, **overrides)) as name:
        backend = DockerBackend(container=name)
        try:
            with pytest.raises(PolicyNotEnforceableError) as refused:
                backend.session(workspace=repo).start()
        finally:
            backend.close()
    assert problem in str(refused.value)


def test_attaching_to_a_container_without_a_writable_tmp_is_refused(
    docker_backend: DockerBackend, repo: Path
) -> None:
    """No tmpfs on a read-only root (and Docker's /dev/shm is noexec): the agent's loader has nowhere to
    run, and says what it needs."""
    with attached_container(docker_backend._client, **_hardened(repo, tmpfs={})) as name:
        backend = DockerBackend(container=name)
        try:
            with pytest.raises((PolicyNotEnforceableError, SandboxFailedError)) as refused:
                backend.session(workspace=repo).start()
        finally:
            backend.close()
    assert refused.type is SandboxFailedError and "executable /tmp" in str(refused.value)


def test_attaching_to_a_container_with_unmasked_system_paths_is_refused(
    docker_backend: DockerBackend, repo: Path, tmp_path: Path
) -> None:
    """``systempaths=unconfined`` is a CLI option (the API takes empty masked/read-only path lists)."""
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(load_profile()))
    started = subprocess.run(
        ["docker", "run", "-d", "--rm", "--init", "--network", "none", "--cap-drop", "ALL", "--read-only",
         "--security-opt", "no-new-privileges", "--security-opt", f"seccomp={profile}",
         "--security-opt", "systempaths=unconfined", "--cgroupns", "private", "--memory", "256m",
         "--pids-limit", "64", "-v", f"{repo}:{repo}", "-v", f"{repo}/.git:{repo}/.git:ro",
         "--label", "io.adk-sandbox.test=attach", IMAGE, "sleep", "120"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    name = started.stdout.strip()
    try:
        with (
            DockerBackend(container=name) as backend,
            pytest.raises(PolicyNotEnforceableError, match="masked"),
        ):
            backend.session(workspace=repo).start()
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)


PING_ENGINE = (
    "import socket; s = socket.socket(socket.AF_UNIX); s.connect('/var/run/docker.sock'); "
    "s.sendall(b'GET /_ping HTTP/1.0\\r\\n\\r\\n'); print(s.recv(100).split(b'\\r\\n')[0].decode())"
)


def test_an_engine_socket_never_answers_a_command(docker_backend: DockerBackend, repo: Path) -> None:
    """The refusal above is what stands between a command and root on the host: show the socket works."""
    sock = {"/var/run/docker.sock": {"bind": "/var/run/docker.sock", "mode": "rw"}}
    with attached_container(
        docker_backend._client, **_hardened(repo, extra_volumes=sock, user="0:0")
    ) as name:
        probe = docker_backend._client.containers.get(name).exec_run(
            ["python3", "-c", PING_ENGINE],
        )  # fmt: skip
        assert b"200 OK" in probe.output  # reachable: so attaching must be (and is) refused
        with (
            DockerBackend(container=name) as backend,
            pytest.raises(PolicyNotEnforceableError, match="socket"),
        ):
            backend.session(workspace=repo).start()


def test_an_extra_host_mount_is_reported_as_not_confined(
    docker_backend: DockerBackend, repo: Path, tmp_path: Path
) -> None:
    (tmp_path / "etc-copy").mkdir()
    for mode, writes_confined in (("ro", True), ("rw", False)):
        extra = {str(tmp_path / "etc-copy"): {"bind": "/host-etc", "mode": mode}}
        with (
            attached_container(docker_backend._client, **_hardened(repo, extra_volumes=extra)) as name,
            DockerBackend(container=name) as backend,
            backend.session(workspace=repo) as session,
        ):
            capabilities = session.capabilities()
            assert (capabilities.fs_read, capabilities.fs_write) == (False, writes_confined), mode


def test_an_attached_container_that_can_write_git_is_refused(
    docker_backend: DockerBackend, repo: Path
) -> None:
    arguments = _hardened(repo)
    arguments["volumes"] = {str(repo): {"bind": str(repo), "mode": "rw"}}
    with (
        attached_container(docker_backend._client, **arguments) as name,
        DockerBackend(container=name) as backend,
        pytest.raises(PolicyNotEnforceableError, match=r"\.git"),
    ):
        backend.session(workspace=repo).start()


def test_an_attached_container_checks_a_per_request_memory_limit(
    docker_backend: DockerBackend, repo: Path
) -> None:
    with (
        attached_container(docker_backend._client, **_hardened(repo)) as name,
        DockerBackend(container=name) as backend,
        backend.session(workspace=repo) as session,
    ):
        with pytest.raises(PolicyNotEnforceableError, match="memory_limit_mb=64"):
            session.execute(
                ExecRequest(language=Language.COMMAND, code="true", timeout=10, memory_limit_mb=64)
            )
        fits = session.execute(
            ExecRequest(language=Language.COMMAND, code="true", timeout=10, memory_limit_mb=512)
        )
        assert fits.exit_code == 0


def test_the_committed_profile_is_the_one_in_force(
    docker_backend: DockerBackend, owned_workspace: Path
) -> None:
    with docker_backend.session(workspace=owned_workspace) as session:
        options = session._opened().inspect["HostConfig"]["SecurityOpt"]
    assert (
        json.loads(next(o for o in options if o.startswith("seccomp="))[len("seccomp=") :]) == load_profile()
    )


# -- Split brain: a daemon that sees another directory at the workspace path is refused ----------------
SPLIT_BRAIN = textwrap.dedent(
    """\
    import sys
    from adk_sandbox.executor import ExecRequest, PolicyNotEnforceableError
    from adk_sandbox.executor.backends.docker import DockerBackend
    try:
        with DockerBackend(workspace_transport="bind") as forced, forced.session(workspace=sys.argv[1]) as s:
            s.start()
    except PolicyNotEnforceableError as exc:
        print("refused:", exc)
    else:
        print("accepted")
    with DockerBackend() as backend, backend.session(workspace=sys.argv[1]) as session:  # auto: a mirror
        seen = session.execute(ExecRequest(argv=("cat", "hello.txt"), timeout=30)).stdout
        print("auto:", session.workspace_transport, seen.strip())
    """
)


def test_a_daemon_that_sees_another_directory_is_refused_when_bind_is_forced_else_mirrored(
    docker_backend: DockerBackend, tmp_path: Path
) -> None:
    """This process gets its own mount namespace with a tmpfs over the workspace; dockerd does not see it."""
    require(os.geteuid() == 0, "needs root for a private mount namespace")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "hello.txt").write_text("the daemon's copy\n")
    script = (
        f'mount -t tmpfs none "$1" && echo host-copy > "$1/hello.txt" && exec {sys.executable} -c "$2" "$1"'
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private",
         "sh", "-c", script, "split", str(workspace), SPLIT_BRAIN],
        capture_output=True, text=True, check=False, timeout=120, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert done.stdout.startswith("refused:") and "does not see this machine's" in done.stdout, done
    assert "auto: mirror host-copy" in done.stdout, done  # the copy holds this namespace's files
