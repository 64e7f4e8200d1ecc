"""The adk-sandbox command against the real engine, run as a user would (a real subprocess)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import docker
import docker.errors
import pytest

from adk_sandbox.executor import ExecRequest, IsolationClass, Language, ResourceLimits
from adk_sandbox.executor.backends.docker import BASE_IMAGE, DockerBackend
from tests.conftest import containers_mounting

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]
REPO = Path(__file__).resolve().parents[2]


def adk(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adk_sandbox", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_run_streams_output_and_exits_with_the_commands_code(
    docker_backend: DockerBackend, owned_workspace: Path
) -> None:
    done = adk("run", "--workspace", str(owned_workspace), "--", "sh", "-c", "echo hi; echo oops >&2; exit 3")
    assert (done.stdout, done.stderr, done.returncode) == ("hi\n", "oops\n", 3)


def test_run_timeout_exits_124_and_leaves_nothing(
    docker_backend: DockerBackend, owned_workspace: Path
) -> None:
    done = adk(
        "run",
        "--workspace",
        str(owned_workspace),
        "--timeout",
        "2",
        "--",
        "sh",
        "-c",
        "setsid sleep 300 & sleep 200",
    )
    assert done.returncode == 124
    assert "timed out" in done.stderr
    assert containers_mounting(docker_backend._client, owned_workspace) == []  # its container is gone


def test_run_without_a_workspace_shows_the_bundled_example(docker_backend: DockerBackend) -> None:
    done = adk("run")
    assert done.returncode == 0, done.stderr
    assert "first 20 primes: 2 3 5 7" in done.stdout
    assert "network interfaces: lo" in done.stdout
    assert "root filesystem: read-only" in done.stdout


def test_run_errors_are_one_line(docker_backend: DockerBackend) -> None:
    done = adk("run", "--workspace", "/no/such/dir", "--", "true")
    assert done.returncode != 0
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("adk-sandbox: error: ")


@pytest.mark.parametrize("command", [[], ["run"], ["doctor"], ["cleanup"], ["images"], ["images", "build"]])
def test_help_everywhere(command: list[str]) -> None:
    done = adk(*command, "--help")
    assert done.returncode == 0 and "usage: adk-sandbox" in done.stdout


def test_doctor_lists_every_class_and_exits_zero_when_docker_works(docker_backend: DockerBackend) -> None:
    done = adk("doctor", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line and not line.startswith(" ")}
    assert "container" in rows["docker/runc"]
    assert "gvisor" in rows["docker/runsc"]
    assert "subprocess_only" in rows["process"]
    assert "os_enforced" in rows["process+bwrap"]
    assert rows["wasm"].split()[1] == "wasm"
    # The default "auto" is said as such, with what a directory of this machine gets (the engine sees it).
    assert "workspace: auto, decided per workspace; a fresh temporary directory here: bind" in done.stdout
    task = [line.split("task: ", 1)[1] for line in done.stdout.splitlines() if "profiles: hardened" in line]
    assert task == [  # runc, then gVisor (scripts/setup registers its memory overlay)
        "root writes capped at 4096 MiB: the session stops once its layer passes the cap",
        f"root writes capped at {ResourceLimits().memory_mb} MiB: held in memory, within the memory limit",
    ], task
    images = [line for line in done.stdout.splitlines() if line.startswith("image ")]
    assert len(images) == 2 and all(line.split()[2] == "current" for line in images), images


def test_cleanup_removes_a_deliberately_leaked_container(docker_backend: DockerBackend) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    with open("/proc/sys/kernel/random/boot_id") as handle:
        boot = handle.read().strip()
    name = f"adk-sandbox-leak-{uuid.uuid4().hex[:8]}"
    docker_backend._client.containers.create(
        BASE_IMAGE, ["sleep", "300"], name=name, network_mode="none",
        labels={"io.adk-sandbox.project": "adk-sandbox", "io.adk-sandbox.owner-pid": str(dead.pid),
                "io.adk-sandbox.owner-start": "1", "io.adk-sandbox.owner-boot": boot,
                "io.adk-sandbox.expires": str(int(time.time()) + 3600)},
    )  # fmt: skip
    unlabelled = docker_backend._client.containers.create(
        BASE_IMAGE, ["sleep", "300"], name=name + "-not-ours"
    )
    try:
        done = adk("cleanup")
        assert done.returncode == 0, done.stderr
        assert f"removed {name}" in done.stdout and "owner process" in done.stdout
        names = [c.name for c in docker_backend._client.containers.list(all=True)]
        assert name not in names
        assert unlabelled.name in names  # a name prefix is never a reason to remove
    finally:
        unlabelled.remove(force=True)


def test_compose_sandbox_service_can_be_attached_to(owned_workspace: Path) -> None:
    project = f"adk-test-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "ADK_WORKSPACE": str(owned_workspace)}
    compose = ["docker", "compose", "-f", str(REPO / "compose.yaml"), "-p", project]
    up = subprocess.run(
        [*compose, "up", "-d", "sandbox"], env=env, capture_output=True, text=True, check=False
    )
    assert up.returncode == 0, up.stderr
    try:
        container = subprocess.run(
            [*compose, "ps", "-q", "sandbox"], env=env, capture_output=True, text=True, check=True
        ).stdout.strip()
        with (
            DockerBackend(container=container) as backend,
            backend.session(workspace=owned_workspace) as session,
        ):
            assert session.isolation() is IsolationClass.CONTAINER
            capabilities = session.capabilities()
            assert capabilities.network and capabilities.memory and capabilities.pids
            result = session.execute(
                ExecRequest(language=Language.COMMAND, code="id -u; pwd; touch made", timeout=30)
            )
            assert result.stdout.splitlines() == ["1000", str(owned_workspace)]
        assert (owned_workspace / "made").stat().st_uid == 1000
        done = adk("run", "--container", container, "--", "sh", "-c", "pwd; exit 5")
        assert (done.stdout, done.returncode) == (f"{owned_workspace}\n", 5)
        assert docker.from_env().containers.get(container).status == "running"  # attached, never removed
    finally:
        subprocess.run([*compose, "down", "-t", "1"], env=env, capture_output=True, check=False)


def test_ctrl_c_kills_the_command_and_removes_the_container(
    docker_backend: DockerBackend, owned_workspace: Path
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "adk_sandbox", "run", "--workspace", str(owned_workspace), "--",
         "sh", "-c", "echo started; setsid sleep 301 & sleep 302"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline() == "started\n"  # streamed live, before the command ends
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    assert containers_mounting(docker_backend._client, owned_workspace) == []
