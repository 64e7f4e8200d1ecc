"""The start-up check run inside every new sandbox, through its command transport (any engine).

:func:`verify_from_inside` proves, exactly as a command runs, what ``docker inspect`` cannot show: the
workspace is the host's (a nonce file must be visible inside, else :class:`WorkspaceNotSharedError`) and
set-id modes are refused (or allowed, when asked). See docs/docker/hardening.md, sections "Honest
isolation" and the set-id probe.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import uuid
from dataclasses import dataclass

from adk_sandbox.executor._output import OutputCapture
from adk_sandbox.executor.channel.transport import CommandTransport, PreparedCommand
from adk_sandbox.executor.errors import PolicyNotEnforceableError, SandboxFailedError

__all__ = ["PROBE_SECONDS", "WorkspaceNotSharedError", "split_brain_message", "verify_from_inside"]

#: How long the start-up check may take.
PROBE_SECONDS = 30.0
# Prints "setid-allowed" when a set-id mode can be set in the container, "setid-refused" when it cannot
# (see .setid; which one must come depends on what the session asked for).
# Shell builtins but chmod: each process costs the runtime a fork and an exec (gVisor: several ms each,
# every session start pays them), so the scratch file is made by a noclobber redirection (which refuses an
# existing regular file; the name is 128 random bits, where mktemp would put it) rather than by mktemp,
# the nonce is read by the read builtin rather than by cat, and rm replaces the shell.
# ``{token}``: see _probe_script.
_PROBE_SETID = (
    'set -C; f="${{TMPDIR:-/tmp}}/.adk-sandbox-probe-{token}"; '
    'if {{ : >"$f"; }} 2>/dev/null; then '
    'if chmod 4755 "$f" 2>/dev/null; then echo setid-allowed; else echo setid-refused; fi; fi'
)

# The capability sets a command holds (hexadecimal masks): both must be 0 when all are dropped.
_PROBE_CAPS = "grep -E '^Cap(Bnd|Eff):' /proc/self/status"
# The workspace nonce, read by the read builtin (its file has no newline: read then fails but sets t).
_PROBE_NONCE = '{ t=; IFS= read -r t <"$1"; echo "$t"; } 2>/dev/null'
# Last, in place of the shell (no fork): the scratch file is removed whatever came before.
_PROBE_CLEAN_UP = 'exec rm -f -- "$f"'


class WorkspaceNotSharedError(PolicyNotEnforceableError):
    """The engine does not see this machine's workspace at its path (``"auto"`` then mirrors it)."""


def split_brain_message(workspace: str | None, evidence: object) -> str:
    """The error for a daemon that mounts another machine's (or namespace's) directory at the path."""
    return (
        f"the Docker daemon does not see this machine's {workspace} ({evidence}): it mounts a different "
        "directory at that path (a daemon in another mount namespace: rootless Docker, Docker Desktop, a "
        "remote or DinD engine). Commands would run against other files; use a daemon that shares this "
        "machine's filesystem"
    )


def _probe_script(token: str, *, capabilities: bool, nonce: bool) -> str:
    """The start-up check's ``sh -c`` script: set-id, then capabilities and the nonce if asked, clean-up."""
    parts = [_PROBE_SETID.format(token=token)]
    parts += [_PROBE_CAPS] if capabilities else []
    parts += [_PROBE_NONCE] if nonce else []
    return "; ".join([*parts, _PROBE_CLEAN_UP])


def verify_from_inside(
    transport: CommandTransport,
    base_env: dict[str, str],
    user: str,
    workspace: str | None,
    *,
    no_capabilities: bool = False,
    setid_allowed: bool = False,
    inside: str | None = None,
) -> None:
    """Raise :class:`PolicyNotEnforceableError` unless the container sees ``workspace`` and refuses set-id.

    ``inside``: where the container sees the host directory ``workspace`` when it binds it elsewhere (a
    fork's copy at its parent's path); None: at the same path.

    ``no_capabilities`` also requires the bounding and effective capability sets to be empty, as a
    command sees them (for an engine whose inspect does not say ``CapDrop: ALL``: Podman).
    ``setid_allowed`` turns the set-id check around: a command must be *able* to set a set-id mode (the
    transport was asked to start commands without the set-id filter, and the container's profile must
    allow it too); the default requires it refused.
    """
    nonce = _IdentityNonce.create(workspace) if workspace else None
    try:
        script = _probe_script(uuid.uuid4().hex, capabilities=no_capabilities, nonce=nonce is not None)
        seen = (
            () if nonce is None else (os.path.join(inside or workspace or "", os.path.basename(nonce.path)),)
        )
        argv = ("/bin/sh", "-c", script, "adk-sandbox-probe", *seen)
        probe = PreparedCommand(
            argv=argv, env=dict(base_env), user=user, workdir="/", stdin=None, marker=uuid.uuid4().hex
        )
        capture = OutputCapture(64 * 1024)
        outcome = transport.run(probe, capture, deadline=time.monotonic() + PROBE_SECONDS, cancel=None)
        output = capture.finish()["stdout"].text
    finally:
        if nonce:
            nonce.remove()
    if outcome.exit_code is None:
        raise SandboxFailedError("the sandbox container did not answer its start-up check in time")
    words = output.split()
    if "setid-refused" not in words and "setid-allowed" not in words:
        what = "can" if setid_allowed else "cannot"
        raise PolicyNotEnforceableError(
            f"could not check that commands {what} create setuid files: the start-up probe found no "
            f"writable /tmp in the container (it printed {output[:200]!r}); give it a /tmp tmpfs"
        )
    if setid_allowed and "setid-allowed" not in words:
        raise PolicyNotEnforceableError(
            "commands in this container cannot create setuid/setgid files although the session asked for "
            "them (package managers installing set-uid programs would fail): the container's seccomp "
            "profile or the command's own set-id filter refuses them"
        )
    if not setid_allowed and "setid-refused" not in words:
        raise PolicyNotEnforceableError(
            "commands in this container can create setuid/setgid files: neither the sandbox seccomp "
            "profile nor the command's own set-id filter is in force (docs/DOCKER.md, Set-id files)"
        )
    if no_capabilities:
        sets = dict(re.findall(r"^(Cap\w+):\s*([0-9a-f]+)$", output, re.MULTILINE))
        held = {name: value for name, value in sets.items() if int(value, 16)}
        if set(sets) != {"CapBnd", "CapEff"} or held:
            raise PolicyNotEnforceableError(
                "a command in this container holds capabilities "
                f"({held or 'its capability sets could not be read'}): they are not all dropped"
            )
    if nonce and nonce.token not in output:
        raise WorkspaceNotSharedError(
            split_brain_message(workspace, "a probe file written here is not there")
        )


@dataclass(frozen=True)
class _IdentityNonce:
    """A random file in the workspace root, briefly, to prove the container sees the same directory."""

    path: str
    token: str

    @classmethod
    def create(cls, workspace: str) -> _IdentityNonce:
        token = uuid.uuid4().hex
        path = os.path.join(workspace, f".adk-sandbox-identity-{token}")
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            raise PolicyNotEnforceableError(
                f"cannot write a probe file into the workspace {workspace} ({exc.strerror}) to check that "
                "the Docker daemon sees the same directory"
            ) from exc
        with os.fdopen(descriptor, "w") as handle:
            handle.write(token)
        return cls(path, token)

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
