"""ProcessBackend under the real bubblewrap: each containment claim is tried as an attack.

What every backend owes (timeouts and escapees killed, the output caps, ...) is checked by the conformance
suite, tests/conformance/test_conformance_host.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adk_sandbox.executor import (
    BubblewrapEnforcer,
    ExecRequest,
    ExecResult,
    IsolationClass,
    Language,
    PolicyNotEnforceableError,
    ProcessBackend,
    SandboxPolicy,
)
from tests.conftest import (
    kill_all,
    live_processes_with_args,
    require,
    unique_sleep_seconds,
    wait_until_gone,
)

pytestmark = pytest.mark.bwrap


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, Path]:
    """Host directories: one read-write, one read-only, one not allowed at all (with a secret in it)."""
    layout = {name: tmp_path / name for name in ("rw", "ro", "outside")}
    for path in layout.values():
        path.mkdir()
    (layout["ro"] / "data.txt").write_text("read-only data\n")
    (layout["outside"] / "secret.txt").write_text("top secret\n")
    return layout


def sandbox(enforcer: BubblewrapEnforcer, dirs: dict[str, Path], **extra: object) -> ProcessBackend:
    builder = (
        SandboxPolicy.builder().allow_read(dirs["ro"]).allow_read_write(dirs["rw"]).allow_process_spawn()
    )
    policy = builder.build().model_copy(update=extra)
    return ProcessBackend.with_sandbox(enforcer, policy)


def sh(backend: ProcessBackend, code: str, **kw: object) -> ExecResult:
    request = ExecRequest.model_validate({"language": "command", "code": code, "timeout": 60, **kw})
    return backend.execute(request)


def test_isolation_is_reported_as_os_enforced(
    bwrap_enforcer: BubblewrapEnforcer, dirs: dict[str, Path]
) -> None:
    backend = sandbox(bwrap_enforcer, dirs)
    caps = backend.capabilities()
    assert backend.isolation() is IsolationClass.OS_ENFORCED
    assert caps.network and caps.fs_read and caps.fs_write and caps.env and caps.timeout
    assert not (caps.memory or caps.cpu or caps.pids)
    assert not sandbox(bwrap_enforcer, dirs, allow_network=True).capabilities().network
    assert (caps.host_filesystem, caps.host_environment, caps.host_programs) == (False, False, True)


def test_host_filesystem_is_true_only_when_the_host_root_is_bound(
    bwrap_enforcer: BubblewrapEnforcer, tmp_path: Path
) -> None:
    secret = tmp_path / "outside.txt"
    secret.write_text("host file\n")
    spawn = SandboxPolicy.builder().allow_process_spawn()
    request = ExecRequest(language=Language.COMMAND, code=f"cat {secret}", timeout=30)
    with ProcessBackend.with_sandbox(bwrap_enforcer, spawn.build()) as confined:
        assert not confined.capabilities().host_filesystem
        assert confined.execute(request).exit_code != 0  # the host's file is not there
    with ProcessBackend.with_sandbox(bwrap_enforcer, spawn.allow_read("/").build()) as whole:
        assert whole.capabilities().host_filesystem
        assert whole.execute(request).stdout == "host file\n"


def test_writes_outside_allowed_paths_fail_and_leave_the_host_untouched(
    bwrap_enforcer: BubblewrapEnforcer, dirs: dict[str, Path]
) -> None:
    backend = sandbox(bwrap_enforcer, dirs)
    attempts = {
        "rw": dirs["rw"] / "new.txt",
        "ro": dirs["ro"] / "data.txt",
        "ro-new": dirs["ro"] / "new.txt",
        "outside": dirs["outside"] / "new.txt",
        "outside-secret": dirs["outside"] / "secret.txt",
        "home": Path(os.path.expanduser("~")) / f"adk-sandbox-escape-{os.getpid()}",
        "etc": Path(f"/etc/adk-sandbox-escape-{os.getpid()}"),
        "usr": Path(f"/usr/local/adk-sandbox-escape-{os.getpid()}"),
    }
    script = "; ".join(
        f"if echo pwned > '{path}' 2>/dev/null; then echo {name}=written; else echo {name}=refused; fi"
        for name, path in attempts.items()
    )
    result = sh(backend, script)
    outcome = dict(line.split("=") for line in result.stdout.split())
    assert outcome == {name: ("written" if name == "rw" else "refused") for name in attempts}
    # What the host sees afterwards: only the allowed write landed.
    assert (dirs["rw"] / "new.txt").read_text() == "pwned\n"
    assert (dirs["ro"] / "data.txt").read_text() == "read-only data\n"
    assert (dirs["outside"] / "secret.txt").read_text() == "top secret\n"
    assert sorted(p.name for p in dirs["outside"].iterdir()) == ["secret.txt"]
    for name in ("ro-new", "home", "etc", "usr"):
        assert not attempts[name].exists(), name


def test_reads_are_confined_to_allowed_and_system_paths(
    bwrap_enforcer: BubblewrapEnforcer, dirs: dict[str, Path]
) -> None:
    backend = sandbox(bwrap_enforcer, dirs)
    result = sh(
        backend,
        f"cat '{dirs['ro']}/data.txt'; cat '{dirs['outside']}/secret.txt'; ls {os.path.expanduser('~')}; "
        "cat /etc/shadow /etc/passwd; ls /usr/bin/env",
    )
    assert "read-only data" in result.stdout
    assert "top secret" not in result.stdout
    assert "root:" not in result.stdout  # neither shadow nor passwd: /etc is not bound
    assert "/usr/bin/env" in result.stdout  # system programs stay usable


def test_symlink_inside_an_allowed_dir_cannot_reach_outside(
    bwrap_enforcer: BubblewrapEnforcer, dirs: dict[str, Path]
) -> None:
    (dirs["rw"] / "link").symlink_to(dirs["outside"])
    (dirs["rw"] / "secret-link").symlink_to(dirs["outside"] / "secret.txt")
    backend = sandbox(bwrap_enforcer, dirs)
    rw = dirs["rw"]
    result = sh(backend, f"echo pwned > '{rw}/link/planted'; cat '{rw}/secret-link'; ls '{rw}/link/'")
    assert "top secret" not in result.stdout and "secret.txt" not in result.stdout
    assert not (dirs["outside"] / "planted").exists()


def test_symlink_relative_paths_use_the_allowed_dir_as_cwd(
    bwrap_enforcer: BubblewrapEnforcer, dirs: dict[str, Path]
) -> None:
    (dirs["rw"] / "link").symlink_to(dirs["outside"])
    policy = SandboxPolicy.builder().allow_read_write(dirs["rw"]).allow_process_spawn().build()
    backend = ProcessBackend.with_sandbox(bwrap_enforcer, policy, workdir=dirs["rw"])
    result = sh(backend, "pwd; echo pwned > link/planted; cat link/secret.txt")
    assert result.stdout.splitlines()[0] == str(dirs["rw"])
    assert "top secret" not in result.stdout
    assert not (dirs["outside"] / "planted").exists()


def test_network_is_denied_only_loopback_exists(
    bwrap_enforcer: BubblewrapEnforcer, dirs: dict[str, Path]
) -> None:
    result = sh(sandbox(bwrap_enforcer, dirs), "cat /proc/net/dev")
    interfaces = [line.split(":")[0].strip() for line in result.stdout.splitlines()[2:]]
    assert interfaces == ["lo"]


def test_network_allowed_shows_the_hosts_interfaces(
    bwrap_enforcer: BubblewrapEnforcer, dirs: dict[str, Path]
) -> None:
    def interfaces(text: str) -> set[str]:
        return {line.split(":")[0].strip() for line in text.splitlines()[2:]}

    host = interfaces(Path("/proc/net/dev").read_text())
    result = sh(sandbox(bwrap_enforcer, dirs, allow_network=True), "cat /proc/net/dev")
    assert interfaces(result.stdout) == host


def test_policy_env_reaches_the_child_and_request_env_overrides_it(
    bwrap_enforcer: BubblewrapEnforcer, dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ADK_TEST_HOST_SECRET", "hunter2")
    policy = SandboxPolicy.builder().allow_process_spawn().env("A", "policy").env("B", "policy").build()
    backend = ProcessBackend.with_sandbox(bwrap_enforcer, policy)
    result = sh(backend, "env", env={"B": "request"})
    variables = dict(line.split("=", 1) for line in result.stdout.splitlines())
    assert variables["A"] == "policy" and variables["B"] == "request"
    assert "ADK_TEST_HOST_SECRET" not in variables and "hunter2" not in result.stdout


def test_processes_see_a_private_pid_namespace(
    bwrap_enforcer: BubblewrapEnforcer, dirs: dict[str, Path]
) -> None:
    result = sh(sandbox(bwrap_enforcer, dirs), "ls /proc | grep -c '^[0-9]'")
    assert int(result.stdout) < 10  # the host has hundreds


@pytest.mark.parametrize(
    "escape",
    [
        "(sleep {m}) &",
        "setsid sleep {m} &",
        "(setsid sh -c 'sleep {m} &' &)",  # double fork into a new session
        "nohup sleep {m} >/dev/null 2>&1 &",
    ],
)
def test_escapees_die_with_the_sandbox(
    bwrap_enforcer: BubblewrapEnforcer, dirs: dict[str, Path], escape: str
) -> None:
    marker = unique_sleep_seconds()
    result = sh(sandbox(bwrap_enforcer, dirs), escape.format(m=marker) + "\necho started")
    assert result.stdout == "started\n"
    alive = wait_until_gone("sleep", marker)
    kill_all(alive)
    assert alive == [], "a process escaped the sandbox's lifetime"


def test_python_runs_under_bwrap(bwrap_enforcer: BubblewrapEnforcer, dirs: dict[str, Path]) -> None:
    request = ExecRequest(language=Language.PYTHON, code="import os; print(os.getcwd() != '/')", timeout=60)
    result = sandbox(bwrap_enforcer, dirs).execute(request)
    assert result.stdout == "True\n", result.stderr


def test_rust_compile_step_is_confined_too(bwrap_enforcer: BubblewrapEnforcer, dirs: dict[str, Path]) -> None:
    # include_str! reads at compile time: if rustc ran outside the sandbox it would embed the secret.
    require(shutil.which("rustc") is not None, "rustc is not installed")
    secret = dirs["outside"] / "secret.txt"
    code = f'fn main() {{ print!("{{}}", include_str!("{secret}")); }}'
    request = ExecRequest(language=Language.RUST, code=code, timeout=120)
    confined = sandbox(bwrap_enforcer, dirs).execute(request)
    assert confined.exit_code not in (0, None)
    assert "top secret" not in confined.stdout
    assert "couldn't read" in confined.stderr
    # Control: the same program on the bare host does read it, so the refusal above is the sandbox's.
    assert ProcessBackend().execute(request).stdout == "top secret\n"


def test_rust_runs_under_bwrap(bwrap_enforcer: BubblewrapEnforcer, dirs: dict[str, Path]) -> None:
    require(shutil.which("rustc") is not None, "rustc is not installed")
    request = ExecRequest(language=Language.RUST, code='fn main() { println!("ok"); }', timeout=120)
    result = sandbox(bwrap_enforcer, dirs).execute(request)
    assert result.stdout == "ok\n", result.stderr


def test_policy_denying_spawn_is_refused_before_running(bwrap_enforcer: BubblewrapEnforcer) -> None:
    with pytest.raises(PolicyNotEnforceableError, match="process spawning"):
        ProcessBackend.with_sandbox(bwrap_enforcer, SandboxPolicy())


def test_workdir_outside_the_policy_is_refused(
    bwrap_enforcer: BubblewrapEnforcer, dirs: dict[str, Path]
) -> None:
    policy = SandboxPolicy.builder().allow_read_write(dirs["rw"]).allow_process_spawn().build()
    backend = ProcessBackend.with_sandbox(bwrap_enforcer, policy, workdir=dirs["outside"])
    with pytest.raises(PolicyNotEnforceableError, match="workdir"):
        sh(backend, f"touch '{dirs['outside']}/x'")
    assert not (dirs["outside"] / "x").exists()


def test_killing_the_owner_process_kills_the_sandbox(bwrap_enforcer: BubblewrapEnforcer) -> None:
    # The Python process running the sandbox is SIGKILLed mid-command (no finally blocks run): bwrap's
    # --die-with-parent must still take the sandboxed processes, setsid ones included, down with it.
    marker = unique_sleep_seconds()
    owner_code = (
        "from executor import *\n"
        "policy = SandboxPolicy(allow_process_spawn=True)\n"
        "backend = ProcessBackend.with_sandbox(get_enforcer(), policy)\n"
        f"code = 'setsid sleep {marker} & echo started; sleep {marker}'\n"
        "backend.execute(ExecRequest(language='command', code=code, timeout=600),\n"
        "                on_output=lambda stream, line: print(line, end='', flush=True))\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", owner_code], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        assert owner.stdout.readline() == "started\n"
        deadline = time.monotonic() + 10
        while len(live_processes_with_args("sleep", marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(live_processes_with_args("sleep", marker)) == 2  # both are running now
        owner.kill()
        owner.wait(timeout=30)
        alive = wait_until_gone("sleep", marker)
        kill_all(alive)
        assert alive == [], "sandboxed processes outlived their owner"
    finally:
        owner.kill()
        owner.wait(timeout=30)


def test_isolation_agrees_with_capabilities(bwrap_enforcer: BubblewrapEnforcer) -> None:
    plain = ProcessBackend()
    sandboxed = ProcessBackend.with_sandbox(bwrap_enforcer, SandboxPolicy(allow_process_spawn=True))
    assert plain.isolation() is plain.capabilities().isolation is IsolationClass.SUBPROCESS_ONLY
    assert sandboxed.isolation() is sandboxed.capabilities().isolation is IsolationClass.OS_ENFORCED
