"""The guest parts of a microVM, built once and cached: kernel, initramfs, root disk.

:func:`guest_parts` / :func:`build_guest` return a :class:`GuestParts`, building what is missing under
:func:`microvm_cache` (each part in a directory named by its inputs' digest, renamed into place when
complete); :func:`main` is ``scripts/setup``'s entry. Depth: docs/MICROVM.md, "How a VM is made".
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import cast

from adk_sandbox.executor.channel.static_agent import cache_root
from adk_sandbox.executor.errors import BackendUnavailableError

__all__ = ["GuestParts", "build_guest", "fsjail", "guest_parts", "main", "virtiofsd"]

KERNEL_PACKAGE = "linux-image-cloud-amd64"
#: The modules the guest loads, in the order they load (dependencies first).
MODULES = (
    "drivers/virtio/virtio_ring.ko",
    "drivers/virtio/virtio.ko",
    "drivers/virtio/virtio_mmio.ko",
    "drivers/block/virtio_blk.ko",
    "drivers/char/virtio_console.ko",
    "fs/fuse/fuse.ko",
    "fs/fuse/virtiofs.ko",
    "fs/overlayfs/overlay.ko",
)
_VMINIT_FLAGS = ("-static", "-O2", "-s", "-Wall", "-Wextra")
# (magic, decompressor) of the payloads a Debian vmlinuz may carry.
_PAYLOADS = (
    (b"\x02\x21\x4c\x18", ("lz4", "-dc")),
    (b"\x28\xb5\x2f\xfd", ("zstd", "-dc")),
    (b"\xfd7zXZ\x00", ("xz", "-dc")),
    (b"\x1f\x8b\x08", ("gzip", "-dc")),
)
_TOOL_SECONDS = 300.0


@dataclasses.dataclass(frozen=True)
class GuestParts:
    """The files a microVM boots from."""

    kernel: Path
    initramfs: Path
    rootfs: Path
    kernel_release: str
    """The guest kernel's ``uname -r``."""


def microvm_cache() -> Path:
    """Where the guest parts are kept."""
    return cache_root() / "microvm"


def _run(argv: list[str], what: str, *, cwd: Path | None = None, stdin: bytes | None = None) -> bytes:
    try:
        done = subprocess.run(
            argv, cwd=cwd, input=stdin, capture_output=True, timeout=_TOOL_SECONDS, check=False
        )
    except FileNotFoundError as exc:
        raise BackendUnavailableError(
            f"{what}: {argv[0]} is missing (scripts/setup installs it; Debian: apt install qemu-system-x86 "
            "kmod cpio busybox-static e2fsprogs lz4 zstd)"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise BackendUnavailableError(f"{what}: {argv[0]} did not finish in {_TOOL_SECONDS:g} s") from exc
    if done.returncode != 0:
        raise BackendUnavailableError(
            f"{what} failed ({' '.join(argv[:3])}...): {done.stderr.decode(errors='replace').strip()[-800:]}"
        )
    return done.stdout


@contextlib.contextmanager
def _building(final: Path) -> Iterator[Path]:
    """A scratch directory next to ``final``, renamed to it when the block succeeds."""
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        yield work
        with contextlib.suppress(OSError):
            shutil.rmtree(final)
        try:
            os.rename(work, final)
        except OSError:
            if not (final / "done").exists():  # not another process that built it meanwhile
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -- kernel --------------------------------------------------------------------------------------------
def _kernel_package() -> tuple[str, str]:
    """The cloud kernel package the metapackage points at, and its version (apt-cache, no download)."""
    depends = _run(["apt-cache", "depends", KERNEL_PACKAGE], "finding the cloud kernel").decode()
    for line in depends.splitlines():
        name = line.strip().removeprefix("Depends:").strip()
        if line.strip().startswith("Depends:") and name.startswith("linux-image-"):
            break
    else:
        raise BackendUnavailableError(
            f"apt-cache names no kernel for {KERNEL_PACKAGE} (apt-get update first)"
        )
    policy = _run(["apt-cache", "policy", name], "finding the cloud kernel's version").decode()
    version = next(
        (
            line.split(":", 1)[1].strip()
            for line in policy.splitlines()
            if line.strip().startswith("Candidate:")
        ),
        "",
    )
    return name, version


def extract_vmlinux(vmlinuz: bytes) -> bytes:
    """The ELF kernel inside a compressed ``vmlinuz`` (the first payload that decompresses to an ELF)."""
    for magic, tool in _PAYLOADS:
        at = vmlinuz.find(magic)
        while at >= 0:
            try:
                done = subprocess.run(
                    list(tool), input=vmlinuz[at:], capture_output=True, timeout=120, check=False
                )
            except FileNotFoundError:
                break  # this decompressor is not installed: try the next format
            if done.stdout[:4] == b"\x7fELF":
                return done.stdout
            at = vmlinuz.find(magic, at + 1)
    raise BackendUnavailableError(
        "no kernel found inside the vmlinuz (none of lz4, zstd, xz, gzip gave an ELF image); install lz4 "
        "and zstd"
    )


def _kernel_dir() -> Path:
    """The unpacked cloud kernel (vmlinux, its release, its modules), downloaded once."""
    pointer = microvm_cache() / "kernel-current"
    modules_tag = hashlib.sha256("\0".join(MODULES).encode()).hexdigest()[:8]
    with contextlib.suppress(OSError):
        current = microvm_cache() / pointer.read_text().strip()
        if current.name.endswith(f"-{modules_tag}") and (current / "done").exists():
            return current  # the one made last, with these modules (no apt-cache call)
    name, version = _kernel_package()
    final = microvm_cache() / f"kernel-{name}-{version}-{modules_tag}".replace(":", "_").replace("~", "_")
    if not (final / "done").exists():
        with _building(final) as work:
            _run(
                ["apt-get", "download", f"{name}={version}" if version else name],
                "downloading the kernel",
                cwd=work,
            )
            deb = next(work.glob("linux-image-*.deb"))
            _run(["dpkg-deb", "-x", str(deb), str(work / "x")], "unpacking the kernel")
            vmlinuz = next((work / "x" / "boot").glob("vmlinuz-*"))
            release = vmlinuz.name.removeprefix("vmlinuz-")
            (work / "vmlinux").write_bytes(extract_vmlinux(vmlinuz.read_bytes()))
            modules = work / "x" / "lib" / "modules" / release
            keep = work / "modules" / release
            for module in MODULES:
                (keep / "kernel" / module).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(modules / "kernel" / module, keep / "kernel" / module)
            for name_ in ("modules.builtin", "modules.builtin.modinfo", "modules.order"):
                if (modules / name_).exists():
                    shutil.copy2(modules / name_, keep / name_)
            (work / "release").write_text(release)
            deb.unlink()
            shutil.rmtree(work / "x")
            (work / "done").write_text("")
    pointer.write_text(final.name)
    return final


# -- initramfs -----------------------------------------------------------------------------------------
def _guest_source(name: str) -> bytes:
    return resources.files(__package__).joinpath("guest", name).read_bytes()


def _busybox() -> Path:
    found = shutil.which("busybox") or "/bin/busybox"
    path = Path(found)
    if not path.exists():
        raise BackendUnavailableError("busybox is missing (Debian: apt install busybox-static)")
    if b"ld-linux" in path.read_bytes()[:8192]:
        raise BackendUnavailableError(f"{path} is not static (Debian: apt install busybox-static)")
    return path


def _compiler() -> str:
    for name in (os.environ.get("CC"), "gcc", "cc"):
        if name and shutil.which(name):
            return str(shutil.which(name))
    raise BackendUnavailableError(
        "no C compiler to build the guest's init (Debian: apt install gcc libc6-dev)"
    )


def _cpio_newc(root: Path) -> bytes:
    """The ``newc`` cpio archive of ``root`` (made by cpio itself, file names sorted)."""
    names = sorted(str(path.relative_to(root)) for path in root.rglob("*"))
    listing = ("\n".join([".", *names]) + "\n").encode()
    return _run(
        ["cpio", "-o", "-H", "newc", "--quiet", "--reproducible"],
        "packing the initramfs",
        cwd=root,
        stdin=listing,
    )


def _initramfs(kernel: Path) -> Path:
    release = (kernel / "release").read_text().strip()
    busybox = _busybox()
    compiler = _compiler()
    digest = hashlib.sha256()
    for part in (_guest_source("init.sh"), _guest_source("vminit.c"), release.encode(), busybox.read_bytes(),
                 " ".join(_VMINIT_FLAGS).encode(), os.path.basename(compiler).encode(),
                 " ".join(MODULES).encode(), kernel.name.encode()):  # fmt: skip
        digest.update(part + b"\0")
    final = microvm_cache() / f"initramfs-{digest.hexdigest()[:24]}"
    if (final / "done").exists():
        return final / "initramfs.gz"
    with _building(final) as work:
        tree = work / "tree"
        (tree / "bin").mkdir(parents=True)
        shutil.copy2(busybox, tree / "bin" / "busybox")
        (work / "vminit.c").write_bytes(_guest_source("vminit.c"))
        _run(
            [compiler, *_VMINIT_FLAGS, "-o", str(tree / "vminit"), str(work / "vminit.c")], "building vminit"
        )
        (tree / "init").write_bytes(_guest_source("init.sh"))
        (tree / "init").chmod(0o755)
        shutil.copytree(kernel / "modules", tree / "lib" / "modules")
        _run(["depmod", "-b", str(tree), release], "indexing the guest's modules")
        (work / "initramfs.gz").write_bytes(gzip.compress(_cpio_newc(tree), compresslevel=1, mtime=0))
        shutil.rmtree(tree)
        (work / "done").write_text("")
    return final / "initramfs.gz"


# -- the workspace share's server, on the host ---------------------------------------------------------
#: The C virtiofsd of QEMU 7.2 (Debian bookworm's qemu-system-common); ``$ADK_SANDBOX_VIRTIOFSD`` overrides.
VIRTIOFSD = "/usr/lib/qemu/virtiofsd"
_FSJAIL_FLAGS = ("-O2", "-s", "-Wall", "-Wextra")


def virtiofsd() -> Path:
    """The virtiofsd binary (the C one: its ``-o source=`` options are used)."""
    path = Path(os.environ.get("ADK_SANDBOX_VIRTIOFSD") or VIRTIOFSD)
    if not os.access(path, os.X_OK):
        raise BackendUnavailableError(
            f"virtiofsd is not at {path}: a microVM's workspace is shared through it (Debian bookworm: apt "
            "install qemu-system-common; or set ADK_SANDBOX_VIRTIOFSD to QEMU 7's C virtiofsd)"
        )
    return path


def fsjail() -> Path:
    """The host launcher of virtiofsd (``host/fsjail.c``: user namespace, seccomp filter), built once."""
    source = resources.files(__package__).joinpath("host", "fsjail.c").read_bytes()
    compiler = _compiler()
    digest = hashlib.sha256(source + b"\0" + " ".join(_FSJAIL_FLAGS).encode() + b"\0" + compiler.encode())
    final = microvm_cache() / f"fsjail-{digest.hexdigest()[:24]}"
    if (final / "done").exists():
        return final / "fsjail"
    with _building(final) as work:
        (work / "fsjail.c").write_bytes(source)
        _run(
            [compiler, *_FSJAIL_FLAGS, "-o", str(work / "fsjail"), str(work / "fsjail.c")], "building fsjail"
        )
        (work / "fsjail.c").unlink()
        (work / "done").write_text("")
    return final / "fsjail"


# -- root disk -----------------------------------------------------------------------------------------
def _image_id(image: str) -> str:
    import docker  # noqa: PLC0415 - docker-py only when a root disk is needed

    try:
        client = docker.from_env(timeout=30)
        try:
            return str(client.images.get(image).id)
        finally:
            client.close()
    except docker.errors.ImageNotFound as exc:
        raise BackendUnavailableError(
            f"the image {image} is not on the Docker engine (adk-sandbox images build); the microVM's root "
            "disk is made from it"
        ) from exc
    except docker.errors.DockerException as exc:
        raise BackendUnavailableError(
            f"the Docker engine is needed once, to export {image} as the microVM's root disk: {exc}"
        ) from exc


def _export(image: str, into: Path) -> None:
    import docker  # noqa: PLC0415 - docker-py only when a root disk is needed

    client = docker.from_env(timeout=300)
    container = client.containers.create(image, ["true"], network_disabled=True)
    try:
        tar = subprocess.Popen(["tar", "-x", "-C", str(into)], stdin=subprocess.PIPE)
        assert tar.stdin is not None  # noqa: S101 - stdin=PIPE
        try:
            for chunk in container.export(chunk_size=1 << 20):
                tar.stdin.write(cast(bytes, chunk))  # bytes (the stubs say str)
        finally:
            tar.stdin.close()
            if tar.wait() != 0:
                raise BackendUnavailableError(f"unpacking the export of {image} failed")
    finally:
        container.remove(force=True)
        client.close()


def _rootfs(image: str) -> Path:
    pointer = microvm_cache() / f"rootfs-of-{hashlib.sha256(image.encode()).hexdigest()[:16]}"
    try:
        image_id = _image_id(image)
    except BackendUnavailableError:
        # No engine now: the disk made last time from this image name, if there is one.
        with contextlib.suppress(OSError):
            last = microvm_cache() / pointer.read_text().strip()
            if (last / "done").exists():
                return last / "root.ext4"
        raise
    final = microvm_cache() / f"rootfs-{image_id.removeprefix('sha256:')[:24]}"
    if not (final / "done").exists():
        if os.geteuid() != 0:
            raise BackendUnavailableError(
                f"making the microVM's root disk from {image} needs root once (to keep the owners of the "
                "image's files); run scripts/setup as root"
            )
        with _building(final) as work:
            tree = work / "tree"
            tree.mkdir()
            _export(image, tree)
            # Mount points of the guest (the disk is read-only there).
            for directory in ("proc", "sys", "dev", "tmp", "run", "home/sandbox"):
                (tree / directory).mkdir(parents=True, exist_ok=True)
            size_mb = (
                sum(f.stat().st_size for f in tree.rglob("*") if f.is_file() and not f.is_symlink()) >> 20
            )
            size_mb = size_mb * 5 // 4 + 64
            _run(["mkfs.ext4", "-q", "-F", "-d", str(tree), "-L", "adk-root", "-O", "^has_journal", "-m", "0",
                  str(work / "root.ext4"), f"{size_mb}M"], "making the root disk")  # fmt: skip
            shutil.rmtree(tree)
            (work / "done").write_text(image_id)
    pointer.write_text(final.name)
    return final / "root.ext4"


def guest_parts(image: str) -> GuestParts:
    """The guest's kernel, initramfs and root disk of ``image``, built into the cache if missing."""
    kernel = _kernel_dir()
    return GuestParts(
        kernel=kernel / "vmlinux",
        initramfs=_initramfs(kernel),
        rootfs=_rootfs(image),
        kernel_release=(kernel / "release").read_text().strip(),
    )


def build_guest(image: str) -> GuestParts:
    """Build every guest part now, and the host's virtiofsd launcher (``scripts/setup``)."""
    fsjail()
    return guest_parts(image)


def main(argv: list[str] | None = None) -> int:
    """``scripts/setup``: build the guest parts of the base image (a no-op when cached); print where."""
    from adk_sandbox.executor.backends.docker.images import BASE_IMAGE  # noqa: PLC0415

    args = sys.argv[1:] if argv is None else argv
    image = args[0] if args else BASE_IMAGE
    try:
        parts = build_guest(image)
    except BackendUnavailableError as exc:
        print(f"microvm guest: {exc}", file=sys.stderr)
        return 1
    out = io.StringIO()
    print(f"kernel {parts.kernel_release}: {parts.kernel}", file=out)
    print(f"initramfs: {parts.initramfs}", file=out)
    print(f"root disk of {image}: {parts.rootfs}", file=out)
    print(out.getvalue(), end="")
    return 0
