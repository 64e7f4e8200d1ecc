"""DockerBackend against the real engine: hardening in force, tree kills, limits, leaks, honesty.

Each containment claim is tested as an attack: the test tries to break it and checks that nothing got
out and nothing leaked. The session fixture's backend is shared; most tests open their own session.
What every backend owes (results, tree kills, caps, limits, a closed session leaving no container) is
checked by the conformance suite too, tests/conformance/test_conformance_docker.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import docker
import pytest

from adk_sandbox.executor import (
    BackendUnavailableError,
    ExecRequest,
    IsolationClass,
    Language,
    PolicyNotEnforceableError,
    ResourceLimits,
    SandboxPolicy,
)
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from adk_sandbox.executor.backends.docker._seccomp import profile_option
from tests.conftest import project_containers, require

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]


def run(session: DockerSession, code: str, timeout: float = 20, **kwargs: object):  # type: ignore[no-untyped-def]
    return session.execute(ExecRequest(language=Language.COMMAND, code=code, timeout=timeout, **kwargs))


def user_processes(session: DockerSession) -> list[str]:
    """`ps` inside the container, minus the init, the keeper and ps's own command."""
    listing = run(session, "ps -eo pid=,user=,args=").stdout.splitlines()
    return [
        line
        for line in listing
        if "docker-init" not in line
        and "sleep 43200" not in line
        and "ps -eo" not in line
        and "adk-sandbox" not in line  # the wrapper running ps
    ]


@pytest.fixture
def session(docker_backend: DockerBackend, owned_workspace: Path):  # type: ignore[no-untyped-def]
    with docker_backend.session(workspace=owned_workspace) as opened:
        yield opened


# -- hardening in force ------------------------------------------------------------------------------


def test_capabilities_are_all_dropped_and_no_new_privileges(session: DockerSession) -> None:
    status = dict(
        line.split(":\t", 1)
        for line in run(session, "cat /proc/self/status").stdout.splitlines()
        if ":\t" in line
    )
    assert status["CapEff"] == "0000000000000000"
    assert status["CapPrm"] == "0000000000000000"
    assert status["NoNewPrivs"] == "1"
    assert status["Seccomp"] == "2"  # runc applies Docker's default seccomp filter


def test_ulimits_init_logging_and_owner_labels_are_in_force(
    docker_backend: DockerBackend, session: DockerSession
) -> None:
    rows = run(session, "cat /proc/self/limits").stdout.splitlines()
    soft_hard = {row[:26].strip(): row[26:].split()[:2] for row in rows[1:]}
    limits = ResourceLimits()
    assert soft_hard["Max open files"] == [str(limits.nofile)] * 2
    assert soft_hard["Max core file size"] == ["0", "0"]
    assert soft_hard["Max file size"] == [str(limits.file_size_mb * 1024 * 1024)] * 2  # bytes
    # PID 1 is the init that reaps orphans, not the keeper.
    assert run(session, "cat /proc/1/comm").stdout == "docker-init\n"
    inspect = docker_backend._client.api.inspect_container(session.container_id)
    assert inspect["HostConfig"]["LogConfig"]["Type"] == "none"
    labels = inspect["Config"]["Labels"]
    assert labels["io.adk-sandbox.owner-pid"] == str(os.getpid())
    assert int(labels["io.adk-sandbox.expires"]) > time.time()
    assert inspect["Config"]["Entrypoint"] == ["sleep"]  # the keeper's life is bounded (and auto-removed)
    assert inspect["HostConfig"]["AutoRemove"] is True


def test_only_loopback_exists(session: DockerSession) -> None:
    interfaces = [
        line.split(":")[0].strip() for line in run(session, "cat /proc/net/dev").stdout.splitlines()[2:]
    ]
    assert interfaces == ["lo"]
    result = run(
        session, "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), timeout=2)'"
    )
    assert result.exit_code != 0
    assert "unreachable" in result.stderr.lower()


def test_root_filesystem_is_read_only_and_tmp_is_writable(session: DockerSession) -> None:
    result = run(
        session, "touch /usr/evil; echo $?; echo data > /tmp/f && cat /tmp/f; echo x > $HOME/h && cat $HOME/h"
    )
    assert "Read-only file system" in result.stderr
    assert result.stdout.splitlines() == ["1", "data", "x"]


def test_commands_run_as_the_workspace_owner_in_its_host_path(
    session: DockerSession, owned_workspace: Path
) -> None:
    result = run(session, "id -u; id -g; pwd; touch made-inside")
    assert result.stdout.splitlines() == ["1000", "1000", str(owned_workspace)]
    made = (owned_workspace / "made-inside").stat()
    assert (made.st_uid, made.st_gid) == (1000, 1000)


def test_host_environment_does_not_enter(session: DockerSession, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADK_TEST_SECRET", "hunter2")
    result = run(session, "env", env={"GIVEN": "yes"})
    assert "hunter2" not in result.stdout
    assert "GIVEN=yes" in result.stdout
    assert "HOME=/home/sandbox" in result.stdout


def test_policy_env_is_below_request_env(docker_backend: DockerBackend, owned_workspace: Path) -> None:
    policy = SandboxPolicy.builder().allow_process_spawn().env("A", "policy").env("B", "policy").build()
    with DockerBackend(policy=policy) as backend, backend.session(workspace=owned_workspace) as session:
        result = run(session, 'echo "$A $B"', env={"B": "request"})
    assert result.stdout == "policy request\n"


def test_the_container_is_reused_across_commands(session: DockerSession) -> None:
    first = session.container_id
    run(session, "echo kept > /tmp/state")
    assert run(session, "cat /tmp/state").stdout == "kept\n"
    assert session.container_id == first


def test_the_whole_git_directory_is_read_only(docker_backend: DockerBackend, owned_workspace: Path) -> None:
    (owned_workspace / ".git" / "hooks").mkdir(parents=True)
    (owned_workspace / ".git" / "config").write_text("[core]\n")
    for path in (
        owned_workspace / ".git",
        owned_workspace / ".git" / "hooks",
        owned_workspace / ".git" / "config",
    ):
        os.chown(path, 1000, 1000)
    with docker_backend.session(workspace=owned_workspace) as session:
        result = run(
            session,
            "echo evil > .git/hooks/pre-commit; echo '[core] fsmonitor = evil' >> .git/config; "
            "echo ok > .git/HEAD && echo head-written",
        )
    assert result.stderr.count("Read-only file system") == 3
    assert "head-written" not in result.stdout
    assert not (owned_workspace / ".git" / "hooks" / "pre-commit").exists()
    assert (owned_workspace / ".git" / "config").read_text() == "[core]\n"


def test_stdin_output_and_exit_codes(session: DockerSession) -> None:
    result = run(session, "cat; echo err >&2; exit 3", stdin="from stdin\n")
    assert (result.stdout, result.stderr, result.exit_code) == ("from stdin\n", "err\n", 3)
    assert run(session, "cat").stdout == ""  # no stdin given: /dev/null, not a hang
    python = session.execute(ExecRequest(language=Language.PYTHON, code="print(6 * 7)", timeout=20))
    assert python.stdout == "42\n"


def test_output_streams_line_by_line_while_running(session: DockerSession) -> None:
    seen: list[tuple[str, float]] = []
    started = time.monotonic()
    result = session.execute(
        ExecRequest(language=Language.COMMAND, code="echo first; sleep 2; echo second", timeout=20),
        on_output=lambda stream, chunk: seen.append((chunk, time.monotonic() - started)),
    )
    assert [chunk for chunk, _ in seen] == ["first\n", "second\n"]
    assert seen[0][1] < result.duration_ms / 1000 - 1.5  # the first line arrived long before the end


# -- process trees die -------------------------------------------------------------------------------


def test_timeout_kills_setsid_escapees_and_term_ignorers(session: DockerSession) -> None:
    result = run(
        session,
        "setsid sh -c 'sleep 1000' & (trap '' TERM; exec sleep 1001) & "
        "sh -c 'sh -c \"sleep 1002\" &' ; echo started; sleep 1003",
        timeout=2,
    )
    assert result.timed_out and result.exit_code is None
    assert result.stdout == "started\n"
    assert user_processes(session) == []


def test_timeout_kills_a_child_that_cleared_its_environment(session: DockerSession) -> None:
    result = run(session, "env -i setsid sleep 1004 & sleep 1005", timeout=2)
    assert result.timed_out
    assert user_processes(session) == []


def test_leftovers_die_after_a_normal_exit(session: DockerSession) -> None:
    result = run(session, "setsid sleep 1006 & echo bye")
    assert result.exit_code == 0
    assert user_processes(session) == []


def test_cancel_kills_the_tree_and_keeps_output(session: DockerSession) -> None:
    cancel = threading.Event()
    threading.Timer(1.0, cancel.set).start()
    result = session.execute(
        ExecRequest(
            language=Language.COMMAND, code="echo before; setsid sleep 1007 & sleep 1008", timeout=60
        ),
        cancel=cancel,
    )
    assert result.cancelled and not result.timed_out and result.exit_code is None
    assert result.stdout == "before\n"
    assert user_processes(session) == []


# -- limits contain bombs, and the session keeps working ---------------------------------------------


def test_fork_bomb_is_contained_by_the_pids_limit(owned_workspace: Path) -> None:
    with (
        DockerBackend(limits=ResourceLimits(pids=64)) as backend,
        backend.session(workspace=owned_workspace) as s,
    ):
        result = run(s, "bomb() { bomb | bomb & }; bomb; sleep 30", timeout=5)
        assert result.timed_out
        after = run(s, "echo alive")
        assert after.stdout == "alive\n"
        assert user_processes(s) == []


def test_memory_bomb_is_oom_killed_and_reported(owned_workspace: Path) -> None:
    with (
        DockerBackend(limits=ResourceLimits(memory_mb=128)) as backend,
        backend.session(workspace=owned_workspace) as s,
    ):
        result = s.execute(
            ExecRequest(
                language=Language.PYTHON, code="b = b'x' * (600 * 1024 * 1024); print('survived')", timeout=60
            )
        )
        assert result.oom_killed
        assert result.exit_code is None
        assert "survived" not in result.stdout
        assert run(s, "echo alive").stdout == "alive\n"
        assert not run(s, "true").oom_killed  # the flag belongs to the command that hit the limit


def test_output_flood_is_capped_without_host_memory_growth(session: DockerSession) -> None:
    def rss_peak_kib() -> int:
        with open("/proc/self/status") as handle:
            return next(int(line.split()[1]) for line in handle if line.startswith("VmHWM"))

    before = rss_peak_kib()
    result = run(
        session,
        "head -c 300000000 /dev/zero | tr '\\0' a; echo done >&2",
        timeout=120,
        max_output_bytes=65536,
    )
    grown_mib = (rss_peak_kib() - before) / 1024
    assert result.exit_code == 0 and result.stderr == "done\n"
    assert len(result.stdout) == 65536 and result.stdout_truncated
    assert grown_mib < 32, f"host peak RSS grew by {grown_mib:.0f} MiB"


def test_filling_tmp_hits_the_tmpfs_size(owned_workspace: Path) -> None:
    with (
        DockerBackend(limits=ResourceLimits(tmpfs_mb=16)) as backend,
        backend.session(workspace=owned_workspace) as s,
    ):
        result = run(s, "dd if=/dev/zero of=/tmp/fill bs=1M count=100")
        assert result.exit_code != 0
        assert "No space left on device" in result.stderr
        assert run(s, "rm /tmp/fill && echo alive").stdout == "alive\n"


def test_file_size_limit_applies_in_the_workspace(owned_workspace: Path) -> None:
    with (
        DockerBackend(limits=ResourceLimits(file_size_mb=1)) as backend,
        backend.session(workspace=owned_workspace) as s,
    ):
        result = run(s, "dd if=/dev/zero of=big bs=1M count=5")
    assert result.exit_code != 0
    assert (owned_workspace / "big").stat().st_size <= 1024 * 1024


# -- nothing leaks -----------------------------------------------------------------------------------


def test_throwaway_execute_leaves_nothing(docker_backend: DockerBackend) -> None:
    before = set(project_containers(docker_backend._client, os.getpid()))
    result = docker_backend.execute(ExecRequest(language=Language.COMMAND, code="id -u; pwd", timeout=20))
    assert result.stdout == "65534\n/tmp\n"
    assert set(project_containers(docker_backend._client, os.getpid())) <= before


def test_a_killed_owners_container_is_reaped_by_the_next_backend(owned_workspace: Path) -> None:
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import sys, time
            from adk_sandbox.executor.backends.docker import DockerBackend
            session = DockerBackend().session(workspace={str(owned_workspace)!r})
            print(session.container_id, flush=True)
            time.sleep(600)
        """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert owner.stdout is not None
    container_id = owner.stdout.readline().strip()
    client = docker.from_env()
    assert container_id in project_containers(client)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    assert container_id in project_containers(client)  # a SIGKILL gives no chance to clean up
    with DockerBackend() as backend:
        assert container_id in [leaked.id for leaked in backend.reaped]
    assert container_id not in project_containers(client)


# -- honesty -----------------------------------------------------------------------------------------


def test_isolation_is_read_from_the_running_container(session: DockerSession) -> None:
    capabilities = session.capabilities()
    assert capabilities.isolation is IsolationClass.CONTAINER
    assert capabilities.network and capabilities.memory and capabilities.pids and capabilities.cpu
    assert Language.PYTHON in capabilities.languages
    # The defaults of Capabilities, true for a container: its image's filesystem and programs, no host env.
    assert not (capabilities.host_filesystem or capabilities.host_environment or capabilities.host_programs)


def test_gvisor_session_reports_gvisor(owned_workspace: Path) -> None:
    runtimes = docker.from_env().info().get("Runtimes", {})
    require(
        "runsc" in runtimes, "gVisor's runsc is not registered with the Docker daemon (scripts/setup does it)"
    )
    with DockerBackend(runtime="runsc") as backend, backend.session(workspace=owned_workspace) as session:
        assert session.isolation() is IsolationClass.GVISOR
        result = run(session, "dmesg 2>/dev/null | head -1; id -u; pwd")
        assert "gVisor" in result.stdout
        assert result.stdout.splitlines()[-2:] == ["1000", str(owned_workspace)]
        timed_out = run(session, "setsid sleep 1009 & sleep 1010", timeout=2)
        assert timed_out.timed_out
        assert user_processes(session) == []


def test_an_unknown_runtime_is_refused(owned_workspace: Path) -> None:
    with DockerBackend(runtime="no-such-runtime") as backend:
        with pytest.raises(PolicyNotEnforceableError, match="no-such-runtime"):
            backend.session(workspace=owned_workspace).start()
        assert not project_containers(backend._client) or all(
            "no-such-runtime" not in c.attrs["HostConfig"].get("Runtime", "")
            for c in backend._client.containers.list(all=True)
        )


def test_attaching_to_an_unhardened_container_is_refused(docker_backend: DockerBackend) -> None:
    client = docker_backend._client
    loose = client.containers.run(
        "adk-sandbox/base:latest", ["sleep", "60"], detach=True, network_mode="none", auto_remove=True,
        labels={"io.adk-sandbox.test": "loose"},
    )  # fmt: skip
    try:
        with pytest.raises(PolicyNotEnforceableError) as refused:
            DockerBackend(container=loose.name).session().start()
        message = str(refused.value)
        assert "capabilities are not all dropped" in message
        assert "root filesystem is writable" in message
        assert "no-new-privileges" in message
    finally:
        loose.remove(force=True)


def test_attaching_to_a_hardened_container_works_and_leaves_it(
    docker_backend: DockerBackend, owned_workspace: Path
) -> None:
    client = docker_backend._client
    hardened = client.containers.run(
        "adk-sandbox/base:latest", ["sleep", "120"], detach=True, network_mode="none", cap_drop=["ALL"],
        security_opt=["no-new-privileges", profile_option()], read_only=True, mem_limit="256m", pids_limit=64,
        init=True, cgroupns="private",
        tmpfs={"/tmp": "rw,exec,nosuid,nodev,size=16m,mode=1777", "/home/sandbox": "rw,size=16m,mode=1777"},
        volumes={str(owned_workspace): {"bind": str(owned_workspace), "mode": "rw"},
                 str(owned_workspace / ".git"): {"bind": str(owned_workspace / ".git"), "mode": "ro"}},
        auto_remove=True,
    )  # fmt: skip
    try:
        with DockerBackend(container=hardened.name) as b, b.session(workspace=owned_workspace) as s:
            assert s.isolation() is IsolationClass.CONTAINER
            result = run(s, "id -u; pwd")
            assert result.stdout.splitlines() == ["1000", str(owned_workspace)]
        hardened.reload()
        assert hardened.status == "running"
    finally:
        hardened.remove(force=True)


def test_a_tighter_per_request_memory_limit_is_refused(session: DockerSession) -> None:
    with pytest.raises(PolicyNotEnforceableError, match="memory_limit_mb"):
        run(session, "true", memory_limit_mb=64)


def test_an_unreachable_daemon_says_how_to_start_docker(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no.sock")
    with pytest.raises(BackendUnavailableError, match="dockerd"):
        DockerBackend()


def test_a_leaked_container_dies_by_itself_when_its_lifetime_ends(owned_workspace: Path) -> None:
    backend = DockerBackend(lifetime_seconds=3)
    session = backend.session(workspace=owned_workspace)
    container_id = session.container_id  # never closed: as if the owner had crashed
    client = backend._client
    deadline = time.monotonic() + 30
    while container_id in project_containers(client) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert container_id not in project_containers(client)
    # The session notices and carries on in a fresh container (said in the log and in `restarts`).
    assert run(session, "echo again").stdout == "again\n"
    assert session.restarts == 1
    session.close()
