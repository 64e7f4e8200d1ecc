"""bwrap's arguments are a pure function of the policy: tested as a table."""

from __future__ import annotations

import pathlib

import pytest

from adk_sandbox.executor import (
    EnforcerUnavailableError,
    PolicyNotEnforceableError,
    SandboxPolicy,
    bwrap_arguments,
    get_enforcer,
)
from adk_sandbox.executor.backends.bwrap import BubblewrapEnforcer

SCRATCH = "/tmp/adk-sandbox-scratch"
ALWAYS = ["--die-with-parent", "--unshare-pid", "--new-session"]


def _contains_run(args: list[str], run: list[str]) -> bool:
    return any(args[i : i + len(run)] == run for i in range(len(args) - len(run) + 1))


def _policy(**kwargs: object) -> SandboxPolicy:
    return SandboxPolicy.model_validate({"allow_process_spawn": True, **kwargs})


TABLE = [
    pytest.param(
        _policy(),
        [["--unshare-net"], ["--bind", SCRATCH, SCRATCH], ["--chdir", SCRATCH]],
        [["--bind", "/data", "/data"], ["--ro-bind", "/data", "/data"]],
        id="deny-all",
    ),
    pytest.param(
        _policy(allow_network=True),
        [],
        [["--unshare-net"]],
        id="network-allowed",
    ),
    pytest.param(
        _policy(allowed_paths=[{"path": "/data", "mode": "read_only"}]),
        [["--ro-bind", "/data", "/data"], ["--unshare-net"]],
        [["--bind", "/data", "/data"]],
        id="read-only-path",
    ),
    pytest.param(
        _policy(allowed_paths=[{"path": "/data/", "mode": "read_write"}]),
        [["--bind", "/data", "/data"]],
        [["--ro-bind", "/data", "/data"]],
        id="read-write-path-normalised",
    ),
    pytest.param(
        _policy(
            allowed_paths=[{"path": "/src", "mode": "read_only"}, {"path": "/out", "mode": "read_write"}],
            allow_network=True,
        ),
        [["--ro-bind", "/src", "/src"], ["--bind", "/out", "/out"]],
        [["--unshare-net"], ["--bind", "/src", "/src"], ["--ro-bind", "/out", "/out"]],
        id="mixed",
    ),
]


@pytest.mark.parametrize(("policy", "present", "absent"), TABLE)
def test_bwrap_arguments_table(
    policy: SandboxPolicy, present: list[list[str]], absent: list[list[str]]
) -> None:
    args = bwrap_arguments(policy, workdir=SCRATCH, scratch_dir=SCRATCH, runtime_paths=())
    for flag in ALWAYS:
        assert flag in args
    assert _contains_run(args, ["--proc", "/proc"])
    assert _contains_run(args, ["--dev", "/dev"])
    for run in present:
        assert _contains_run(args, run), (run, args)
    for run in absent:
        assert not _contains_run(args, run), (run, args)


def test_exact_arguments_for_a_typical_policy() -> None:
    policy = SandboxPolicy.builder().allow_read("/src").allow_read_write("/out").allow_process_spawn().build()
    args = bwrap_arguments(policy, workdir="/out", scratch_dir=SCRATCH, runtime_paths=("/usr",))
    assert args == [
        "--die-with-parent",
        "--unshare-pid",
        "--new-session",
        "--unshare-user",
        "--cap-drop",
        "ALL",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--unshare-net",
        "--tmpfs",
        "/tmp",
        "--ro-bind-try",
        "/usr",
        "/usr",
        "--ro-bind",
        "/src",
        "/src",
        "--bind",
        "/out",
        "/out",
        "--bind",
        SCRATCH,
        SCRATCH,
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--remount-ro",
        "/",
        "--chdir",
        "/out",
    ]


def test_private_tmp_is_mounted_before_paths_under_tmp() -> None:
    # A later --tmpfs /tmp would hide an allowed path or the scratch dir living under the host's /tmp.
    policy = _policy(allowed_paths=[{"path": "/tmp/project", "mode": "read_write"}])
    args = bwrap_arguments(policy, workdir=SCRATCH, scratch_dir=SCRATCH, runtime_paths=())
    tmpfs_at = args.index("--tmpfs")
    assert tmpfs_at < args.index("/tmp/project")
    assert tmpfs_at < args.index(SCRATCH)


def test_arguments_are_pure() -> None:
    policy = _policy(allowed_paths=[{"path": "/does/not/exist", "mode": "read_only"}])
    first = bwrap_arguments(policy, workdir=SCRATCH, scratch_dir=SCRATCH)
    assert first == bwrap_arguments(policy, workdir=SCRATCH, scratch_dir=SCRATCH)


CONFINEMENT_TABLE = [
    (_policy(), (True, True, True)),
    (_policy(allow_network=True), (False, True, True)),
    (_policy(allowed_paths=[{"path": "/", "mode": "read_only"}]), (True, False, True)),
    (_policy(allowed_paths=[{"path": "/", "mode": "read_write"}]), (True, False, False)),
    (_policy(allowed_paths=[{"path": "/home", "mode": "read_write"}]), (True, True, True)),
]


@pytest.mark.parametrize(("policy", "expected"), CONFINEMENT_TABLE)
def test_confinement_reports_only_what_the_policy_denies(
    policy: SandboxPolicy, expected: tuple[bool, bool, bool]
) -> None:
    confined = BubblewrapEnforcer("/usr/bin/bwrap").confinement(policy)
    assert (confined.network, confined.fs_read, confined.fs_write) == expected
    assert confined.pids is False  # bubblewrap sets no process-count limit


def test_policy_denying_process_spawn_is_refused() -> None:
    with pytest.raises(PolicyNotEnforceableError, match="allow_process_spawn"):
        BubblewrapEnforcer("/usr/bin/bwrap").check_policy(SandboxPolicy())


def test_get_enforcer_without_bwrap_names_the_package(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EnforcerUnavailableError, match="apt install bubblewrap"):
        get_enforcer()


def test_get_enforcer_with_a_broken_bwrap_says_why(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    assert isinstance(tmp_path, pathlib.Path)
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EnforcerUnavailableError, match="No permissions to create new namespace"):
        get_enforcer()


@pytest.mark.parametrize(
    ("allowed", "path", "covered"),
    [
        ("/data", "/data", True),
        ("/data", "/data/sub/file", True),
        ("/data", "/database", False),  # a prefix of the name is not a parent directory
        ("/data", "/", False),
        ("/", "/anything", True),
        ("/data", "/data/../etc", False),
    ],
)
def test_policy_covers(allowed: str, path: str, covered: bool) -> None:
    assert SandboxPolicy.builder().allow_read(allowed).build().covers(path) is covered
