"""The seccomp profile of every sandbox container: Docker's default, minus the ways to make set-id files.

:func:`derive_profile` makes the hardened profile (committed as ``seccomp/adk-sandbox.json``) from the
vendored moby 20.10.24 default; :func:`derive_task_profile` the task profile's (``io_uring`` refused only).
Why and what exactly: docs/docker/hardening.md, "Set-id files"; the task profile: docs/docker/profiles.md.
"""

from __future__ import annotations

import copy
import functools
import json
from importlib import resources
from typing import Any

from adk_sandbox.executor.channel.setid import CREATING_FLAGS, ENOSYS, SETID_BITS

__all__ = [
    "PROFILE_FILE",
    "SETID_BITS",
    "TASK_PROFILE_FILE",
    "derive_keeper_profile",
    "derive_profile",
    "derive_task_profile",
    "load_profile",
    "profile_option",
    "seccomp_profile_of",
]

#: syscall -> (index of its flags argument or None, index of its mode argument).
MODE_ARGUMENTS: dict[str, tuple[int | None, int]] = {
    "chmod": (None, 1),
    "fchmod": (None, 1),
    "fchmodat": (None, 2),
    "fchmodat2": (None, 2),
    "creat": (None, 1),
    "mknod": (None, 1),
    "mknodat": (None, 2),
    "open": (1, 2),
    "openat": (2, 3),
}
REFUSED_ENOSYS = ("openat2",)
REFUSED_EPERM = ("io_uring_setup", "io_uring_enter", "io_uring_register")

PROFILE_FILE = "adk-sandbox.json"
TASK_PROFILE_FILE = "adk-sandbox-task.json"
_DOCKER_DEFAULT_FILE = "docker-default-20.10.json"


def _masked_zero(index: int, mask: int) -> dict[str, Any]:
    return {"index": index, "value": mask, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}


def _allow(name: str, condition: dict[str, Any], comment: str) -> dict[str, Any]:
    return {
        "names": [name],
        "action": "SCMP_ACT_ALLOW",
        "args": [condition],
        "comment": comment,
        "includes": {},
        "excludes": {},
    }


def derive_profile(docker_default: dict[str, Any]) -> dict[str, Any]:
    """Docker's default profile with set-id modes refused (see the module docstring). Pure."""
    profile = copy.deepcopy(docker_default)
    removed = set(MODE_ARGUMENTS) | set(REFUSED_ENOSYS) | set(REFUSED_EPERM)
    rules = []
    for rule in profile["syscalls"]:
        unconditional = rule["action"] == "SCMP_ACT_ALLOW" and not rule.get("args")
        if unconditional and not rule.get("includes") and not rule.get("excludes"):
            rule["names"] = [name for name in rule["names"] if name not in removed]
        rules.append(rule)
    for name, (flags_index, mode_index) in MODE_ARGUMENTS.items():
        rules.append(_allow(name, _masked_zero(mode_index, SETID_BITS), "adk-sandbox: no set-id mode"))
        if flags_index is not None:
            rules.append(
                _allow(name, _masked_zero(flags_index, CREATING_FLAGS), "adk-sandbox: creates nothing")
            )
    rules.append(
        {
            "names": list(REFUSED_ENOSYS),
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": ENOSYS,
            "args": [],
            "comment": "adk-sandbox: mode in a struct seccomp cannot read; callers fall back to openat",
            "includes": {},
            "excludes": {},
        }
    )
    profile["syscalls"] = rules
    return profile


def derive_task_profile(docker_default: dict[str, Any]) -> dict[str, Any]:
    """The task profile's filter: Docker's default with ``io_uring_*`` refused (``EPERM``, the default). Pure.

    Set-id modes stay allowed: a task container's workspace is a copy whose pull-back strips them, and
    dpkg installs set-uid programs (``sudo``, ``ssh-keysign``). ``io_uring`` is refused in both profiles:
    its queued operations are never seen by seccomp, so every other rule here would not apply to them.
    """
    profile = copy.deepcopy(docker_default)
    rules = []
    for rule in profile["syscalls"]:
        if rule["action"] == "SCMP_ACT_ALLOW":
            rule["names"] = [name for name in rule["names"] if name not in REFUSED_EPERM]
        if rule["names"]:
            rules.append(rule)
    profile["syscalls"] = rules
    return profile


def derive_keeper_profile(profile: dict[str, Any]) -> dict[str, Any]:
    """``profile`` for a checkpointable gVisor container (docs/pause.md): ``clone3`` allowed. Pure.

    There every command descends from the container's first process, to which runsc applies the profile
    (not to exec'd processes), and runsc 20240729 answers a refused call with ``EPERM`` whatever its
    ``errnoRet``: Docker's ``ENOSYS`` for ``clone3`` (so that libc falls back to ``clone``, whose
    namespace flags seccomp can read) became ``EPERM``, and glibc then starts no thread at all. Under
    gVisor a namespace is the sentry's own, made by no host kernel, and the container has no
    ``CAP_SYS_ADMIN``: ``clone3`` is let through.
    """
    derived = copy.deepcopy(profile)
    rules = []
    for rule in derived["syscalls"]:
        if rule["action"] != "SCMP_ACT_ALLOW":
            rule["names"] = [name for name in rule["names"] if name != "clone3"]
        if rule["names"]:
            rules.append(rule)
    rules.append(
        {
            "names": ["clone3"],
            "action": "SCMP_ACT_ALLOW",
            "args": [],
            "comment": "adk-sandbox: runsc answers EPERM, not ENOSYS, and glibc then starts no thread",
            "includes": {},
            "excludes": {},
        }
    )
    derived["syscalls"] = rules
    return derived


def _read(name: str) -> dict[str, Any]:
    text = resources.files(__package__).joinpath("seccomp", name).read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


@functools.cache
def _profile_text(task: bool = False, keeper: bool = False) -> str:
    profile = _read(TASK_PROFILE_FILE if task else PROFILE_FILE)
    if keeper:
        profile = derive_keeper_profile(profile)
    return json.dumps(profile, separators=(",", ":"), sort_keys=True)


def load_profile(*, task: bool = False, keeper: bool = False) -> dict[str, Any]:
    """The sandbox profile as committed: ``seccomp/adk-sandbox.json``, or ``adk-sandbox-task.json``.

    ``keeper``: as a checkpointable gVisor container gets it (:func:`derive_keeper_profile`).
    """
    loaded: dict[str, Any] = json.loads(_profile_text(task, keeper))
    return loaded


def docker_default_profile() -> dict[str, Any]:
    """Docker 20.10's default profile as vendored (the input of :func:`derive_profile`)."""
    return _read(_DOCKER_DEFAULT_FILE)


def profile_option(*, task: bool = False, keeper: bool = False) -> str:
    """The ``security_opt`` entry that installs the sandbox profile (the task profile's with ``task``)."""
    return "seccomp=" + _profile_text(task, keeper)


def seccomp_profile_of(security_options: list[str]) -> dict[str, Any] | str | None:
    """The seccomp setting of an inspected container: a parsed profile, ``"unconfined"``, or None (default).

    An entry that is not valid JSON (e.g. a path the daemon did not expand) is returned as its text.
    """
    for option in security_options:
        key, sep, value = option.partition("=")
        if not sep:
            key, sep, value = option.partition(":")
        if key != "seccomp":
            continue
        if value == "unconfined":
            return "unconfined"
        try:
            parsed: dict[str, Any] = json.loads(value)
        except ValueError:
            return value
        return parsed
    return None
