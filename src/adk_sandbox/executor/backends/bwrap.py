"""The bubblewrap enforcer: host processes in fresh Linux namespaces, confined by a SandboxPolicy.

The argument list is a pure function of the policy (:func:`bwrap_arguments`), tested as a table.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from adk_sandbox.executor.backends.enforcer import Confinement, Enforcer
from adk_sandbox.executor.errors import EnforcerUnavailableError, PolicyNotEnforceableError
from adk_sandbox.executor.network.policy import NetworkPolicy
from adk_sandbox.executor.policy import SandboxPolicy

__all__ = ["RUNTIME_READ_ONLY_PATHS", "BubblewrapEnforcer", "BwrapConfig", "bwrap_arguments", "get_enforcer"]

INSTALL_HINT = "install it with `apt install bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap`"

RUNTIME_READ_ONLY_PATHS: tuple[str, ...] = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
)
"""System paths made readable in every bubblewrap sandbox: programs and shared libraries, no user data.

Without them not even ``sh`` could start. They hold what the distribution installed, not the user's files
(``/home``, ``/root``, the rest of ``/etc`` and ``/tmp`` stay invisible). Bound with ``--ro-bind-try`` so
a path this machine lacks is skipped.
"""


def bwrap_arguments(
    policy: SandboxPolicy,
    *,
    workdir: str,
    scratch_dir: str,
    runtime_paths: Sequence[str] = RUNTIME_READ_ONLY_PATHS,
    egress_dir: str | None = None,
) -> list[str]:
    """Return bwrap's options (everything before ``--``) for ``policy``. Pure: no filesystem access.

    Mount order matters: the private ``/tmp`` comes first so that allowed paths and the scratch dir under
    the host's ``/tmp`` are bound on top of it instead of being hidden by it.

    ``egress_dir`` is a network policy's directory (its proxy socket and forwarder,
    ``executor/network/unix_endpoint.py``): bound read-only at its own path, last, and the network stays
    unshared (only loopback). A policy that allows network cannot have one
    (:class:`PolicyNotEnforceableError`).
    """
    if egress_dir is not None and policy.allow_network:
        raise PolicyNotEnforceableError(
            "the SandboxPolicy allows network (a route out) and a NetworkPolicy asks for none but its "
            "proxy: give one or the other"
        )
    args = [
        "--die-with-parent",  # killing bwrap (our process group leader) kills the whole sandbox
        "--unshare-pid",  # the sandbox's processes die with its PID 1, setsid or not
        "--new-session",  # no controlling terminal: no TIOCSTI injection into the caller's tty
        "--unshare-user",
        "--cap-drop",
        "ALL",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
    ]
    if not policy.allow_network:
        args.append("--unshare-net")
    args += ["--tmpfs", "/tmp"]
    for path in runtime_paths:
        args += ["--ro-bind-try", path, path]
    for allowed in policy.allowed_paths:
        flag = "--bind" if allowed.mode == "read_write" else "--ro-bind"
        args += [flag, allowed.path, allowed.path]
    args += ["--bind", scratch_dir, scratch_dir]
    if egress_dir is not None:
        # Read-only: the sandbox can connect() to the socket in it (that works on a read-only mount), but
        # cannot replace the socket, the forwarder or the trust bundle.
        args += ["--ro-bind", egress_dir, egress_dir]
    args += ["--proc", "/proc", "--dev", "/dev"]
    # Writes anywhere not bound read-write fail loudly instead of landing in bwrap's throw-away root tmpfs.
    args += ["--remount-ro", "/"]
    args += ["--chdir", workdir]
    return args


class BubblewrapEnforcer(Enforcer):
    """Runs each command under ``bwrap`` with arguments derived from the policy."""

    name = "bwrap"

    def __init__(self, bwrap_path: str) -> None:
        self.bwrap_path = bwrap_path

    def check_policy(self, policy: SandboxPolicy) -> None:
        """Refuse a policy that denies process spawning: bubblewrap cannot prevent ``fork``/``exec``."""
        if not policy.allow_process_spawn:
            raise PolicyNotEnforceableError(
                "the policy denies process spawning, which bubblewrap cannot enforce (the sandboxed "
                "program could still fork and exec). Call .allow_process_spawn() on the policy to accept "
                "that; its processes remain confined to a private PID namespace and die with it."
            )

    def check_network_policy(self, policy: SandboxPolicy) -> None:
        """Carry a NetworkPolicy (no route out, its socket bound read-only) unless the policy allows network.

        A route out and a policy's names decided on the host do not go together.
        """
        if policy.allow_network:
            raise PolicyNotEnforceableError(
                "the SandboxPolicy allows network (a route out) and network= is a NetworkPolicy (no route "
                "out, names decided on the host): give one or the other"
            )

    def confinement(self, policy: SandboxPolicy) -> Confinement:
        """Network is confined unless allowed; reads and writes are confined to the bound paths."""
        return Confinement(
            network=not policy.allow_network,
            # "/" allowed means the whole host is visible (or writable): then nothing is confined.
            fs_read="/" not in policy.read_only_paths + policy.read_write_paths,
            fs_write="/" not in policy.read_write_paths,
            pids=False,  # bubblewrap sets no process-count limit
        )

    def wrap(
        self,
        argv: Sequence[str],
        *,
        policy: SandboxPolicy,
        workdir: str,
        scratch_dir: str,
        runtime_paths: Sequence[str],
        egress_dir: str | None = None,
    ) -> list[str]:
        """Prefix ``argv`` with bwrap and the policy's arguments."""
        paths = [*RUNTIME_READ_ONLY_PATHS, *runtime_paths]
        options = bwrap_arguments(
            policy, workdir=workdir, scratch_dir=scratch_dir, runtime_paths=paths, egress_dir=egress_dir
        )
        return [self.bwrap_path, *options, "--", *argv]


def get_enforcer() -> BubblewrapEnforcer:
    """Return this platform's enforcer after checking that it really works here.

    Raises ``EnforcerUnavailableError`` with an install hint when ``bwrap`` is missing, or with bwrap's
    own message when it is present but cannot create namespaces (e.g. user namespaces disabled).
    """
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise EnforcerUnavailableError(f"bubblewrap (`bwrap`) was not found on PATH; {INSTALL_HINT}")
    enforcer = BubblewrapEnforcer(bwrap)
    probe_policy = SandboxPolicy(allow_process_spawn=True)
    with tempfile.TemporaryDirectory(prefix="adk-sandbox-probe-") as scratch:
        argv = enforcer.wrap(
            ["/bin/sh", "-c", "exit 0"],
            policy=probe_policy,
            workdir=scratch,
            scratch_dir=scratch,
            runtime_paths=(),
        )
        try:
            probe = subprocess.run(argv, capture_output=True, timeout=30, env={}, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EnforcerUnavailableError(f"bubblewrap at {bwrap} could not be started: {exc}") from exc
    if probe.returncode != 0:
        detail = probe.stderr.decode("utf-8", errors="replace").strip()
        raise EnforcerUnavailableError(
            f"bubblewrap at {bwrap} cannot create a sandbox here (exit {probe.returncode}: {detail}); "
            "unprivileged user namespaces may be disabled (sysctl kernel.unprivileged_userns_clone=1)"
        )
    return enforcer


class BwrapConfig(BaseModel):
    """A :class:`ProcessBackend` under bubblewrap (``OS_ENFORCED``), for the backend factory."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["bwrap"] = "bwrap"
    policy: SandboxPolicy = Field(default_factory=lambda: SandboxPolicy(allow_process_spawn=True))
    """What the commands may reach (default: no host path but the runtime's, no network; spawning
    allowed, which bubblewrap cannot deny)."""
    workdir: str | None = None
    """Every command's working directory; the policy must allow it (default: a scratch directory)."""
    search_path: str | None = None
    """The PATH programs are resolved on (default: the caller's)."""
    network: bool | NetworkPolicy = False
    """As :class:`ProcessBackend`'s ``network``."""
