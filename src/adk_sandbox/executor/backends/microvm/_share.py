"""The workspace of a microVM session: which host directory is shared, at which guest path, as whom.

:func:`plan_share` maps the command user in the guest to the workspace's owner (or this process's user)
on the host, never root; :func:`check_guest_path` refuses mount points that would hide the guest's own.
Depth: docs/MICROVM.md, "The workspace (virtiofs)".
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from adk_sandbox.executor._layout import HOME_DIR, KERNEL_PATHS
from adk_sandbox.executor.backends.microvm._qemu import Share
from adk_sandbox.executor.errors import InvalidRequestError, PolicyNotEnforceableError

__all__ = ["GUEST_MOUNTS", "MAX_PATH_BYTES", "check_guest_path", "plan_share"]

#: The guest's own file systems (tmpfs, kernel): a workspace is never one of them nor above one.
GUEST_MOUNTS = ("/tmp", HOME_DIR, "/run", "/dev/shm", *KERNEL_PATHS)
#: The path travels hex-encoded on the kernel command line (2048 bytes in all on x86).
MAX_PATH_BYTES = 400


def check_guest_path(path: str) -> str:
    """``path`` if the guest can mount a workspace there, else :class:`InvalidRequestError` saying why."""
    encoded = os.fsencode(path)
    if len(encoded) > MAX_PATH_BYTES or b"\n" in encoded:
        raise InvalidRequestError(
            f"a microVM workspace path must be at most {MAX_PATH_BYTES} bytes without a newline: {path!r}"
        )
    for reserved in GUEST_MOUNTS:
        if path in ("/", reserved) or reserved.startswith(path + "/"):
            raise InvalidRequestError(
                f"the workspace {path!r} would hide the microVM's own {reserved}; share a directory "
                "below it or elsewhere"
            )
        if reserved in (*KERNEL_PATHS, "/run") and path.startswith(reserved + "/"):
            raise InvalidRequestError(f"a workspace cannot be under {reserved} (the guest's own): {path!r}")
    return path


def plan_share(
    workspace: str | os.PathLike[str], user: str, euid: int | None = None, guest_path: str | None = None
) -> Share:
    """The share of ``workspace`` for commands running as ``user`` (``"uid:gid"``); refusals as above.

    The guest mounts it at ``guest_path`` (default: the workspace's own absolute path).
    """
    path = os.path.abspath(os.fspath(workspace))
    guest_path = check_guest_path(path if guest_path is None else guest_path)
    try:
        info = os.stat(path)
    except FileNotFoundError as exc:
        raise InvalidRequestError(f"the workspace {path!r} does not exist") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise InvalidRequestError(f"the workspace {path!r} is not a directory")
    uid, _, gid = user.partition(":")
    inner = (int(uid), int(gid or uid))
    me = os.geteuid() if euid is None else euid
    if me not in (0, info.st_uid):
        raise PolicyNotEnforceableError(
            f"the workspace {path!r} is owned by uid {info.st_uid}, not by this process's user ({me}): what "
            "the microVM creates there would be owned by this user, which the directory's owner did not "
            "choose; share a directory of your own"
        )
    outer = (info.st_uid, info.st_gid) if me == 0 else (me, os.getegid())
    if 0 in outer:
        raise PolicyNotEnforceableError(
            f"the workspace {path!r} is owned by root (uid:gid {info.st_uid}:{info.st_gid}): what the "
            "microVM creates in its workspace is owned by the workspace's owner, and the VM is never "
            "allowed to make root-owned files on the host. chown the directory to the (non-root) user "
            "who should own what the sandbox writes"
        )
    return Share(host_dir=Path(path), guest_path=guest_path, inner=inner, outer=outer)
