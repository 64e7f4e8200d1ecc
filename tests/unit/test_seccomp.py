"""The set-id rule: the container profile derived from Docker's default, and the per-command filter."""

from __future__ import annotations

import ctypes
import os
import stat
from pathlib import Path

import pytest

from adk_sandbox.executor.backends.docker._seccomp import (
    MODE_ARGUMENTS,
    derive_profile,
    derive_task_profile,
    docker_default_profile,
    load_profile,
    seccomp_profile_of,
)
from adk_sandbox.executor.channel.setid import SETID_BITS, native_arch, setid_filter


def test_the_committed_profile_is_derived_from_the_vendored_default() -> None:
    assert load_profile() == derive_profile(docker_default_profile())


def test_the_committed_task_profile_is_derived_from_the_vendored_default() -> None:
    assert load_profile(task=True) == derive_task_profile(docker_default_profile())


def test_the_task_profile_is_dockers_default_without_io_uring() -> None:
    def allowed(profile: dict[str, object]) -> set[str]:
        rules = profile["syscalls"]
        assert isinstance(rules, list)
        return {name for rule in rules if rule["action"] == "SCMP_ACT_ALLOW" for name in rule["names"]}

    default, task = docker_default_profile(), load_profile(task=True)
    assert allowed(default) - allowed(task) == {"io_uring_setup", "io_uring_enter", "io_uring_register"}
    assert allowed(task) <= allowed(default)  # nothing Docker refuses is allowed
    assert task["defaultAction"] == "SCMP_ACT_ERRNO"


@pytest.mark.parametrize("task", [False, True])
def test_a_keeper_profile_differs_only_by_letting_clone3_through(task: bool) -> None:
    """A checkpointable gVisor container's profile: clone3 allowed (runsc answers EPERM, not ENOSYS)."""

    def rules(profile: dict[str, object]) -> list[tuple[str, str, str]]:
        listed = profile["syscalls"]
        assert isinstance(listed, list)
        return sorted(
            (name, rule["action"], repr(rule.get("args")))
            for rule in listed
            for name in rule["names"]
            if name != "clone3"
        )

    plain, keeper = load_profile(task=task), load_profile(task=task, keeper=True)
    assert rules(plain) == rules(keeper)
    clone3 = [rule for rule in keeper["syscalls"] if "clone3" in rule["names"]]
    assert {rule["action"] for rule in clone3} == {"SCMP_ACT_ALLOW"}  # refused nowhere
    assert any(not rule["args"] and not rule["includes"] for rule in clone3)  # allowed whatever the caps
    assert any(rule["action"] == "SCMP_ACT_ERRNO" for rule in plain["syscalls"] if "clone3" in rule["names"])


def test_the_profile_allows_mode_calls_only_without_setid_bits() -> None:
    profile = load_profile()
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    unconditional = {
        name
        for rule in profile["syscalls"]
        if rule["action"] == "SCMP_ACT_ALLOW" and not rule.get("args")
        for name in rule["names"]
    }
    for name in [*MODE_ARGUMENTS, "openat2", "io_uring_setup", "io_uring_enter", "io_uring_register"]:
        assert name not in unconditional
    chmod_rules = [rule for rule in profile["syscalls"] if rule["names"] == ["chmod"]]
    assert chmod_rules == [
        {
            "names": ["chmod"],
            "action": "SCMP_ACT_ALLOW",
            "args": [{"index": 1, "value": SETID_BITS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}],
            "comment": "adk-sandbox: no set-id mode",
            "includes": {},
            "excludes": {},
        }
    ]
    # Everything else Docker allows stays allowed: the profile is the default minus the mode calls.
    default = docker_default_profile()
    before = {
        n
        for r in default["syscalls"]
        if r["action"] == "SCMP_ACT_ALLOW" and not r.get("args")
        for n in r["names"]
    }
    newer = {"fchmodat2"}  # not in Docker 20.10's list; allowed here under the set-id condition
    io_uring = {"io_uring_setup", "io_uring_enter", "io_uring_register"}
    assert before - unconditional == (set(MODE_ARGUMENTS) - newer) | {"openat2"} | io_uring


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ([], None),
        (["no-new-privileges"], None),
        (["seccomp=unconfined"], "unconfined"),
        (["seccomp:unconfined"], "unconfined"),
        (['seccomp={"defaultAction": "SCMP_ACT_ALLOW"}'], {"defaultAction": "SCMP_ACT_ALLOW"}),
        (["seccomp=/a/path.json"], "/a/path.json"),
    ],
)
def test_reading_the_seccomp_option_of_an_inspected_container(options: list[str], expected: object) -> None:
    assert seccomp_profile_of(options) == expected


def _install_filter(program: bytes) -> None:
    """Install the classic-BPF ``program`` on the calling process, with no_new_privs, as the agent does."""

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    # PR_SET_NO_NEW_PRIVS (38), then PR_SET_SECCOMP (22) with SECCOMP_MODE_FILTER (2).
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "cannot install the set-id seccomp filter")


def _in_filtered_child(workdir: Path, script: str) -> list[str]:
    """Run ``script`` (Python, appends to ``results``) in a forked child that installed the filter."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read_end)
            _install_filter(setid_filter(native_arch()))
            results: list[str] = []
            os.chdir(workdir)
            exec(script, {"os": os, "results": results})  # noqa: S102 - the test's own source
            os.write(write_end, "\n".join(results).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        output = pipe.read()
    os.waitpid(pid, 0)
    return output.splitlines()


ATTEMPTS = """
def attempt(name, call):
    try:
        call()
        results.append(name + " allowed")
    except OSError as exc:
        results.append(name + " refused " + str(exc.errno))
open("f", "w").close()
attempt("chmod 4755", lambda: os.chmod("f", 0o4755))
attempt("chmod 2755", lambda: os.chmod("f", 0o2755))
attempt("fchmod 4755", lambda: os.fchmod(os.open("f", os.O_RDONLY), 0o4755))
attempt("fchmodat 6755", lambda: os.chmod("f", 0o6755, dir_fd=os.open(".", os.O_RDONLY)))
attempt("open O_CREAT 4755", lambda: os.open("g", os.O_CREAT | os.O_WRONLY, 0o4755))
attempt("mknod 4755", lambda: os.mknod("h", stat.S_IFREG | 0o4755))
attempt("chmod 755", lambda: os.chmod("f", 0o755))
attempt("chmod 1777", lambda: os.chmod("f", 0o1777))
attempt("open O_CREAT 644", lambda: os.open("i", os.O_CREAT | os.O_WRONLY, 0o644))
attempt("open read", lambda: os.open("f", os.O_RDONLY))
"""


def test_the_filter_refuses_setid_modes_and_allows_everything_else(tmp_path: Path) -> None:
    results = _in_filtered_child(tmp_path, "import stat\n" + ATTEMPTS)
    assert results == [
        "chmod 4755 refused 1",
        "chmod 2755 refused 1",
        "fchmod 4755 refused 1",
        "fchmodat 6755 refused 1",
        "open O_CREAT 4755 refused 1",
        "mknod 4755 refused 1",
        "chmod 755 allowed",
        "chmod 1777 allowed",
        "open O_CREAT 644 allowed",
        "open read allowed",
    ]
    assert not any(path.stat().st_mode & (stat.S_ISUID | stat.S_ISGID) for path in tmp_path.iterdir())


def test_the_filter_survives_exec_and_cannot_be_lifted(tmp_path: Path) -> None:
    script = (
        "import subprocess\n"
        "open('f', 'w').close()\n"
        "done = subprocess.run(['sh', '-c', 'chmod 4755 f; echo $?'], capture_output=True, text=True)\n"
        "results.append(done.stdout.strip())\n"
    )
    assert _in_filtered_child(tmp_path, script) == ["1"]
    assert not (tmp_path / "f").stat().st_mode & stat.S_ISUID
