"""A current Docker engine (Debian trixie's docker.io, 26.x) beside the machine's own, for tests.

The machines this project is tested on install Debian bookworm's engine (20.10, API 1.41); users run 24 to
28. ``scripts/modern-engine`` builds trixie's ``docker.io`` into a directory once (an image made from the
project's own trixie base, exported; ``~/.cache/adk-sandbox/docker26/rootfs``). :class:`ModernEngine`
runs the ``dockerd`` of that directory as a :class:`~tests.integration.private_engine.PrivateEngine` does
the system's (its own data root on a tmpfs, exec root, pidfile, socket and cgroup parent, no network
changes, the system daemon's runtimes), but with that directory as its root filesystem: inside ``unshare
--mount --propagation private`` the directory is bound onto itself read-only, ``/proc``, ``/sys`` and
``/dev`` are bound in, a tmpfs goes over its ``/run`` and ``/tmp``, the engine's own directory
(:attr:`root`, in /tmp) is bound in at the same path, and the daemon's root becomes the directory
(``pivot_root``). Its socket, data and exec roots then have the same paths inside and outside, and it sees
none of this machine's other files: a workspace travels to it as the mirror, as to an engine on another
machine.

``pivot_root`` rather than ``chroot``: the kernel refuses a new user namespace to a chrooted process
(``unshare --user`` there fails with EPERM), and gVisor's ``runsc`` makes one for its sandbox
(``fork/exec /proc/self/exe: operation not permitted`` under a chroot). After ``pivot_root`` the directory
is the root of the engine's mount namespace, not a chroot, and runsc works there.

Runtimes (gVisor's ``runsc``): each runtime of ``/etc/docker/daemon.json`` whose binary exists on this
machine is bound into :attr:`root` (``runtimes/NAME``) and registered under that path.

Images travel without a registry: ``docker save IMAGE | docker -H ENGINE load`` (:meth:`load_image`).
:meth:`destroy` removes its containers, stops the daemon (its containerd and shims with it: the mount
namespace and everything mounted in it go with the last of its processes), kills anything left of it,
unmounts its data tmpfs and removes its cgroups and directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from adk_sandbox.executor.backends.docker import BASE_IMAGE
from adk_sandbox.executor.backends.docker.engine import Engine
from tests.conftest import require
from tests.integration.private_engine import PrivateEngine, PrivateEngineError

__all__ = ["ROOTFS", "ModernEngine", "modern_engine"]

#: Where ``scripts/modern-engine`` builds the engine's root filesystem.
ROOTFS = Path(
    os.environ.get(
        "ADK_SANDBOX_MODERN_ENGINE_ROOT", Path.home() / ".cache" / "adk-sandbox" / "docker26" / "rootfs"
    )
)
#: dockerd's path in that filesystem.
DOCKERD_INSIDE = "/usr/sbin/dockerd"

# Run by /bin/sh in the new mount namespace: $1 the root filesystem, $2 the engine's directory, then pairs
# of (host file, file under the engine's directory) to bind, then "--" and dockerd's command line.
_ENTER = r"""set -e
R=$1 H=$2
shift 2
while [ "$1" != -- ]; do mount --bind "$1" "$2"; shift 2; done
shift
mount --bind "$R" "$R"
mount -o remount,bind,ro "$R"
mount --bind /proc "$R/proc"
mount --rbind /sys "$R/sys"
mount --rbind /dev "$R/dev"
mount -t tmpfs -o size=64m,mode=0755 adk-me-run "$R/run"
mount -t tmpfs -o size=256m,mode=1777 adk-me-tmp "$R/tmp"
mkdir -p "$R$H"
mount --rbind "$H" "$R$H"
cd "$R"
pivot_root . .
umount -l .
cd /
exec "$@"
"""


class ModernEngine(PrivateEngine):
    """The ``dockerd`` of a root filesystem built by ``scripts/modern-engine``, in a namespace of its own."""

    prefix = "adk-me-"

    def __init__(self, rootfs: Path = ROOTFS, *, data_in_memory: bool = True) -> None:
        """``rootfs``: the directory holding the engine (``usr/sbin/dockerd``)."""
        if not (rootfs / DOCKERD_INSIDE.lstrip("/")).is_file():
            raise PrivateEngineError(f"no dockerd in {rootfs} (scripts/modern-engine builds it)")
        self.rootfs = rootfs
        #: (host binary, the file under :attr:`root` it is bound onto): the runtimes.
        self.binds: list[tuple[Path, Path]] = []
        super().__init__(data_in_memory=data_in_memory)

    def _config(self) -> dict[str, object]:
        """The system daemon's runtimes, each at the path it is bound to under :attr:`root`."""
        config = super()._config()
        runtimes = config.get("runtimes")
        if not isinstance(runtimes, dict):
            return config
        bound = {}
        for name, runtime in runtimes.items():
            found = shutil.which(str(runtime.get("path") or "")) if isinstance(runtime, dict) else None
            if found is None:
                continue  # its binary is not on this machine: the system daemon cannot run it either
            inside = self.root / "runtimes" / name
            inside.parent.mkdir(exist_ok=True)
            inside.touch()
            self.binds.append((Path(found).resolve(), inside))
            bound[name] = {**runtime, "path": str(inside)}
        return {**config, "runtimes": bound}

    def _launch_argv(self) -> list[str]:
        binds = [str(path) for pair in self.binds for path in pair]
        return [
            "unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", _ENTER, "modern-engine",
            str(self.rootfs), str(self.root), *binds, "--",
            *self._dockerd_argv(DOCKERD_INSIDE),
        ]  # fmt: skip

    def local_engine(self) -> Engine:
        """The :class:`Engine` of its Unix socket (a local engine by its address, another machine's files)."""
        return Engine(host=self.host)

    def version(self) -> dict[str, str]:
        """The daemon's ``Version`` and ``ApiVersion``."""
        client = self.client()
        try:
            answer = client.version()
        finally:
            client.close()
        return {"Version": str(answer["Version"]), "ApiVersion": str(answer["ApiVersion"])}


@pytest.fixture(scope="session")
def modern_engine() -> Iterator[ModernEngine]:
    """One modern engine for the whole test run, with the base image; destroyed at the end.

    Shared by every test that asks for it (tests/conftest.py registers this module as a plugin): starting
    it and loading the base image take about 10 s.
    """
    require(
        os.geteuid() == 0 and shutil.which("unshare") is not None, "a modern engine needs root and unshare"
    )
    try:
        engine = ModernEngine(ROOTFS)
    except PrivateEngineError as exc:
        require(False, str(exc))
        raise
    try:
        engine.start()
        engine.load_image(BASE_IMAGE)
    except (PrivateEngineError, subprocess.CalledProcessError) as exc:
        engine.destroy()
        require(False, f"the modern Docker engine could not start: {exc}")
    try:
        yield engine
        assert engine.containers() == [], "a container was left on the modern engine"
    finally:
        engine.destroy()
        assert engine.leftover_processes() == []
