"""A private Docker engine whose data root is an XFS filesystem in a loop file (the storage-quota tests).

:class:`XfsEngine` is a :class:`~tests.integration.private_engine.PrivateEngine` whose ``--data-root`` is
an XFS filesystem made in a sparse file (2 GiB by default) on a loop device, mounted with project quotas
(``pquota``, what overlay2's ``--storage-opt size=`` needs) or without. :meth:`XfsEngine.destroy` stops the
engine as its parent does, then unmounts the filesystem, detaches the loop device and deletes the file; a
failed construction undoes what it did. Needs root, ``mkfs.xfs`` (xfsprogs) and ``losetup``; XFS quotas need
a kernel built with ``CONFIG_XFS_QUOTA`` (:func:`xfs_quota_in_kernel`).
"""

from __future__ import annotations

import contextlib
import gzip
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.integration.private_engine import PrivateEngine, PrivateEngineError

__all__ = ["MKFS_XFS", "XfsEngine", "xfs_quota_in_kernel"]

MKFS_XFS = shutil.which("mkfs.xfs") or "/usr/sbin/mkfs.xfs"


def xfs_quota_in_kernel() -> bool | None:
    """Whether the running kernel has XFS quotas (``CONFIG_XFS_QUOTA``); None when its config is not found."""
    candidates = [Path("/proc/config.gz"), Path(f"/boot/config-{platform.release()}")]
    for path in candidates:
        try:
            text = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        except OSError:
            continue
        lines = text.decode(errors="replace").splitlines()
        return any(line.startswith("CONFIG_XFS_QUOTA=") for line in lines)
    return None


def _run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise PrivateEngineError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout.strip()


class XfsEngine(PrivateEngine):
    """A private dockerd on an XFS data root in a loop file, with project quotas (``pquota``) or without."""

    def __init__(self, *, pquota: bool, size_mb: int = 2048) -> None:
        super().__init__()
        self.pquota = pquota
        # The file lives outside the engine's directory: the parent's destroy removes that directory.
        self.image_dir = Path(tempfile.mkdtemp(prefix="adk-xfs-", dir="/tmp"))
        self.image_file = self.image_dir / "data.xfs"
        self.loop_device: str | None = None
        try:
            with open(self.image_file, "wb") as image:
                image.truncate(size_mb * 1024 * 1024)  # sparse: blocks are taken as the filesystem fills
            _run(MKFS_XFS, "-q", str(self.image_file))
            self.loop_device = _run("losetup", "--find", "--show", str(self.image_file))
            self.data_root.mkdir()
            options = "pquota" if pquota else "defaults"
            _run("mount", "-t", "xfs", "-o", options, self.loop_device, str(self.data_root))
        except BaseException:
            self.destroy()
            raise

    def used_bytes(self) -> int:
        """The bytes in use on the data root's filesystem (all of the engine's images, layers, state)."""
        found = os.statvfs(self.data_root)
        return (found.f_blocks - found.f_bfree) * found.f_frsize

    def mounted(self) -> bool:
        """Whether the XFS data root is still mounted (anywhere this process sees)."""
        with open("/proc/self/mounts") as handle:
            return any(line.split()[1] == str(self.data_root) for line in handle)

    def destroy(self) -> None:
        """The engine's :meth:`PrivateEngine.destroy`, then the mount, the loop device and the file."""
        try:
            super().destroy()  # unmounts everything under its root (lazily), the data root included
        finally:
            if self.mounted():
                with contextlib.suppress(PrivateEngineError):
                    _run("umount", str(self.data_root))
            if self.mounted():
                subprocess.run(["umount", "-l", str(self.data_root)], capture_output=True, check=False)
            if self.loop_attached():
                subprocess.run(["losetup", "-d", str(self.loop_device)], capture_output=True, check=False)
            shutil.rmtree(self.image_dir, ignore_errors=True)
            shutil.rmtree(self.root, ignore_errors=True)

    def loop_attached(self) -> bool:
        """Whether the loop device this engine set up still backs its file."""
        if self.loop_device is None:
            return False
        backing = Path("/sys/block") / Path(self.loop_device).name / "loop" / "backing_file"
        try:
            return backing.read_text().strip().startswith(str(self.image_file))
        except OSError:
            return False
