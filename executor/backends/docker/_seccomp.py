"""The seccomp profile of every sandbox container: Docker's default, minus the ways to make set-id files.

Why: the workspace is bind-mounted, so a file a command creates there is a file on the host. A command
running as the workspace owner could ``chmod 4755`` a binary it wrote and leave a setuid (or setgid)
program owned by that user on the host — or by root, when root owns the workspace. A ``nosuid`` mount
inside the container does not help: the host honours the file's mode through its own mounts. Stripping
the bits after each command is racy. So the kernel refuses them at the source: the profile below is
Docker's own default profile (``seccomp/docker-default-20.10.json``, vendored unchanged from moby
20.10.24, Apache-2.0) with these changes, applied by :func:`derive_profile`:

* ``chmod``, ``fchmod``, ``fchmodat`` are allowed only when the mode has neither ``S_ISUID`` nor
  ``S_ISGID``; the other calls that take a creation mode (``open``, ``openat``, ``creat``, ``mknod``,
  ``mknodat``) likewise, and ``open``/``openat`` without ``O_CREAT``/``O_TMPFILE`` are allowed whatever the
  (then unused) mode argument holds. Refused calls fail with ``EPERM``. ``fchmodat2`` (Linux 6.6; not in
  the 20.10 allowlist) is added under the same condition, so ``chmod -h`` works with a newer libc.
* ``openat2`` (its mode sits in a struct seccomp cannot read) fails with ``ENOSYS``, so libraries fall
  back to ``openat``; ``io_uring_*`` (whose operations bypass seccomp) fail with ``EPERM``.

The derived profile is committed as ``seccomp/adk-sandbox.json`` (compose files reference it with
``security_opt: [seccomp=...]``); a unit test checks it equals :func:`derive_profile` of the vendored
default, so the two cannot drift.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import struct
from importlib import resources
from typing import Any

__all__ = [
    "INSTALL_FILTER_SOURCE",
    "PROFILE_FILE",
    "SETID_BITS",
    "derive_profile",
    "load_profile",
    "native_arch",
    "profile_option",
    "seccomp_profile_of",
    "setid_filter",
]

#: S_ISUID | S_ISGID.
SETID_BITS = 0o6000
#: O_CREAT | __O_TMPFILE (x86-64 and arm64 values): an open with neither creates nothing.
_CREATING_FLAGS = 0o100 | 0o20000000
_ENOSYS = 38

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
                _allow(name, _masked_zero(flags_index, _CREATING_FLAGS), "adk-sandbox: creates nothing")
            )
    rules.append(
        {
            "names": list(REFUSED_ENOSYS),
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": _ENOSYS,
            "args": [],
            "comment": "adk-sandbox: mode in a struct seccomp cannot read; callers fall back to openat",
            "includes": {},
            "excludes": {},
        }
    )
    profile["syscalls"] = rules
    return profile


def _read(name: str) -> dict[str, Any]:
    text = resources.files(__package__).joinpath("seccomp", name).read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


@functools.cache
def _profile_text() -> str:
    return json.dumps(_read(PROFILE_FILE), separators=(",", ":"), sort_keys=True)


def load_profile() -> dict[str, Any]:
    """The sandbox profile, as committed in ``seccomp/adk-sandbox.json``."""
    loaded: dict[str, Any] = json.loads(_profile_text())
    return loaded


def docker_default_profile() -> dict[str, Any]:
    """Docker 20.10's default profile as vendored (the input of :func:`derive_profile`)."""
    return _read(_DOCKER_DEFAULT_FILE)


def profile_option() -> str:
    """The ``security_opt`` entry that installs the sandbox profile."""
    return "seccomp=" + _profile_text()


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


# -- the same rule as a filter each command installs on itself ---------------------------------------------
# Why a second copy of the rule: gVisor's runsc (even with --oci-seccomp) applies the container's profile
# to the container's first process only, not to processes started by `docker exec` — which is how every
# command starts. So the command's supervisor installs this filter on the command before exec'ing it
# (no_new_privs is set, so nothing the command does can remove it). Under runc it stacks on the profile.

_AUDIT_ARCH_X86_64 = 0xC000003E
_AUDIT_ARCH_AARCH64 = 0xC00000B7
_X32_SYSCALL_BIT = 0x40000000
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_EPERM = 1

# BPF opcodes (linux/filter.h): load word absolute, jumps on constant, return constant.
_LD_ABS_W = 0x20
_JEQ = 0x15
_JGE = 0x35
_JSET = 0x45
_RET = 0x06

#: arch -> syscall -> (index of its flags argument or None, index of its mode argument).
_MODE_SYSCALLS: dict[int, dict[int, tuple[int | None, int]]] = {
    _AUDIT_ARCH_X86_64: {
        2: (1, 2),  # open
        85: (None, 1),  # creat
        90: (None, 1),  # chmod
        91: (None, 1),  # fchmod
        133: (None, 1),  # mknod
        257: (2, 3),  # openat
        259: (None, 2),  # mknodat
        268: (None, 2),  # fchmodat
        452: (None, 2),  # fchmodat2
    },
    _AUDIT_ARCH_AARCH64: {
        33: (None, 2),  # mknodat
        52: (None, 1),  # fchmod
        53: (None, 2),  # fchmodat
        56: (2, 3),  # openat
        452: (None, 2),  # fchmodat2
    },
}
_OPENAT2 = 437
_IO_URING = (425, 426, 427)


def _argument_low_word(index: int) -> int:
    """Offset of the low 32 bits of argument ``index`` in ``struct seccomp_data`` (little-endian)."""
    return 16 + 8 * index


def setid_filter(arch: int = _AUDIT_ARCH_X86_64) -> bytes:
    """A classic-BPF seccomp program refusing set-id modes (``struct sock_filter`` array, native order).

    Same rule as the profile: the chmod family and the creating calls fail with EPERM when the mode has
    S_ISUID or S_ISGID (an open without O_CREAT/O_TMPFILE passes whatever its mode), ``openat2`` fails
    with ENOSYS and ``io_uring_*`` with EPERM. Any other architecture (i386 or x32 calls on x86-64)
    is refused outright, so a 32-bit entry point cannot go around the rule. Pure: unit-tested by
    installing it in a child process on the host.
    """
    syscalls = _MODE_SYSCALLS[arch]
    # Jump targets are labels (str) or relative offsets (int), resolved once every label is placed.
    program: list[tuple[int, int | str, int | str, int]] = []
    labels: dict[str, int] = {}

    def emit(code: int, k: int, true: int | str = 0, false: int | str = 0) -> None:
        program.append((code, true, false, k))

    emit(_LD_ABS_W, 4)  # arch
    emit(_JEQ, arch, 0, "deny")
    emit(_LD_ABS_W, 0)  # syscall number
    if arch == _AUDIT_ARCH_X86_64:
        emit(_JGE, _X32_SYSCALL_BIT, "deny", 0)
    emit(_JEQ, _OPENAT2, "enosys", 0)
    for number in _IO_URING:
        emit(_JEQ, number, "deny", 0)
    for number in syscalls:
        emit(_JEQ, number, f"check-{number}", 0)
    emit(_RET, _RET_ALLOW)
    for number, (flags_index, mode_index) in syscalls.items():
        labels[f"check-{number}"] = len(program)
        if flags_index is not None:
            emit(_LD_ABS_W, _argument_low_word(flags_index))
            emit(_JSET, _CREATING_FLAGS, 0, "allow")
        emit(_LD_ABS_W, _argument_low_word(mode_index))
        emit(_JSET, SETID_BITS, "deny", "allow")
    for label, action in (
        ("allow", _RET_ALLOW),
        ("deny", _RET_ERRNO | _EPERM),
        ("enosys", _RET_ERRNO | _ENOSYS),
    ):
        labels[label] = len(program)
        emit(_RET, action)

    def offset(index: int, target: int | str) -> int:
        # Offsets count from the next instruction and must fit in a byte (struct.pack checks).
        return labels[target] - index - 1 if isinstance(target, str) else target

    resolved = [(code, offset(i, jt), offset(i, jf), k) for i, (code, jt, jf, k) in enumerate(program)]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in resolved)


#: Python source, run inside the container by a command's supervisor in the child before exec:
#: ``install_setid_filter(bytes.fromhex(...))``. Needs only ctypes and the C library.
INSTALL_FILTER_SOURCE = """
def install_setid_filter(program):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    # PR_SET_NO_NEW_PRIVS (38), then PR_SET_SECCOMP (22) with SECCOMP_MODE_FILTER (2).
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "cannot install the set-id seccomp filter")
"""


def native_arch() -> int:
    """The AUDIT_ARCH value of this machine (the container's architecture is the host's)."""
    machine = os.uname().machine
    if machine in ("x86_64", "amd64"):
        return _AUDIT_ARCH_X86_64
    if machine in ("aarch64", "arm64"):
        return _AUDIT_ARCH_AARCH64
    raise OSError(f"no set-id seccomp filter for the architecture {machine}")
