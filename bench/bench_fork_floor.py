"""Issue 24: what a 150 ms fork needs, measured on this machine (a study: the library's part is the copy).

Run (root: it mounts tmpfs, loop devices and overlays, all removed at the end):

    .venv/bin/python bench/bench_fork_floor.py [--repeat N] [--quick] [--no-engine]

The state is the fork bench's (``bench/bench_fork.py``): 2,000 files of 8 KiB (16 MB) and one 50 MiB file,
in a directory on ``/dev/shm`` (where snapshots live). Each timed step, p50 of ``--repeat`` interleaved
samples (set-up and removal untimed):

0. open + read of every file of the state (the system calls' floor on this machine);
1. the fork's own safe copy (``copy_workspace`` → ``walk_copy``) of the state into a fresh directory of a
   tmpfs (``nosuid,nodev``, as a forkable member's volume is); the workspace alone as well;
2. ``cp -a`` of the same (the kernel's floor for a copy file by file, through a process);
3. the same state held in an ext4 image (a sparse file on ``/dev/shm``, loop-mounted ``nosuid,nodev``):
   (a) a snapshot: ``fsfreeze -f`` + a sparse copy of the image file + ``fsfreeze -u``; (b) a fork's state
   ready: a sparse copy of the snapshot image + a loop device + ``mount -o nosuid,nodev``; each by the
   commands (``cp --sparse=always``, ``losetup``, ``mount``) and by the system calls (``copy_file_range``
   over the data extents, ``LOOP_CTL_GET_FREE`` + ``LOOP_SET_FD``, ``mount(2)``); the images' sizes;
4. an overlay over the snapshot directory (lower) with an empty tmpfs upper: its mounts (a fork by
   layering), and the first write to the 50 MiB file in it (the copy-up a fork pays later);
5. (with the engine) whether a mount made on the host after a container started reaches it through a bind
   mount with ``bind-propagation=rslave``, on the bound directory itself and on a subdirectory, and keeps
   ``nosuid,nodev`` and its size there (read in the container's ``/proc/self/mountinfo``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from _timing import Stats, load_note, parser
from bench_mirror import make_tree

from adk_sandbox.executor.snapshots.copy import copy_workspace

TREE_FILES = 2000
BIG_MIB = 50
IMAGE_MIB = 128
CAP = 1 << 30
MS_NOSUID, MS_NODEV = 2, 4
LOOP_SET_FD, LOOP_CLR_FD, LOOP_CTL_GET_FREE = 0x4C00, 0x4C01, 0x4C82
IMAGE_BASE = "adk-sandbox/base:latest"

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]

#: (set up, timed, undo): one sample is ``timed(set_up())``, then ``undo`` of what it returned.
Step = tuple[Callable[[], object], Callable[[object], object], Callable[[object], None]]


def run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def sys_mount(source: str, target: str, fstype: str, flags: int, data: str) -> None:
    if libc.mount(source.encode(), target.encode(), fstype.encode(), flags, data.encode()) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount {fstype} on {target}: {os.strerror(code)}")


def sys_umount(target: str) -> None:
    if libc.umount2(target.encode(), 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"umount {target}: {os.strerror(code)}")


def sparse_copy(source: str, dest: str) -> None:
    """Copy ``source`` to the new file ``dest`` extent by extent (``SEEK_DATA``/``SEEK_HOLE``), holes kept."""
    fd_in = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
    fd_out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        size = os.fstat(fd_in).st_size
        os.ftruncate(fd_out, size)
        offset = 0
        while offset < size:
            try:
                start = os.lseek(fd_in, offset, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:
                    break  # only a hole is left
                raise
            end = os.lseek(fd_in, start, os.SEEK_HOLE)
            position = start
            while position < end:
                position += os.copy_file_range(fd_in, fd_out, end - position, position, position)
            offset = end
    finally:
        os.close(fd_in)
        os.close(fd_out)


def loop_attach(image: str) -> str:
    """A free loop device bound to ``image`` (``LOOP_CTL_GET_FREE`` + ``LOOP_SET_FD``); its path."""
    control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    try:
        number = fcntl.ioctl(control, LOOP_CTL_GET_FREE)
    finally:
        os.close(control)
    device = f"/dev/loop{number}"
    backing = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    loop = os.open(device, os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.ioctl(loop, LOOP_SET_FD, backing)
    finally:
        os.close(loop)
        os.close(backing)
    return device


def loop_detach(device: str) -> None:
    loop = os.open(device, os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.ioctl(loop, LOOP_CLR_FD)
    finally:
        os.close(loop)


def remove_file(result: object) -> None:
    os.unlink(str(result))


def allocated(path: str) -> int:
    return os.stat(path).st_blocks * 512


def sample(steps: dict[str, Step], repeat: int) -> dict[str, Stats]:
    """Milliseconds of each step's timed part, interleaved (each round starts one step later), one warm-up."""
    samples: dict[str, list[float]] = {name: [] for name in steps}
    order = list(steps.items())
    for round_number in range(repeat + 1):
        shift = round_number % len(order)
        for name, (set_up, timed, undo) in order[shift:] + order[:shift]:
            prepared = set_up()
            started = time.perf_counter()
            result = timed(prepared)
            elapsed = (time.perf_counter() - started) * 1000
            undo(result)
            if round_number:
                samples[name].append(elapsed)
    return {name: Stats(tuple(values)) for name, values in samples.items()}


class Floor(contextlib.ExitStack):
    """The state, the mounts and the images of the measurements; everything undone on exit."""

    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="adk-bench-floor-", dir="/dev/shm")
        self.callback(shutil.rmtree, self.root, True)
        self.counter = 0

    def path(self, *parts: str) -> str:
        """A path in this run's directory."""
        return os.path.join(self.root, *parts)

    def fresh(self, under: str) -> str:
        """A new empty directory in ``under``."""
        self.counter += 1
        made = os.path.join(under, str(self.counter))
        os.mkdir(made, 0o755)
        return made

    def tmpfs(self, where: str, mib: int) -> str:
        """A tmpfs of ``mib`` MiB mounted ``nosuid,nodev`` at ``where`` (unmounted on exit)."""
        os.makedirs(where, exist_ok=True)
        sys_mount("adk-bench-floor", where, "tmpfs", MS_NOSUID | MS_NODEV, f"size={mib}m,mode=0755")
        self.callback(sys_umount, where)
        return where


def build_state(floor: Floor) -> str:
    state = floor.path("snapshot")
    os.mkdir(state)
    (Path(state) / "workspace").mkdir()
    make_tree(Path(state) / "workspace", TREE_FILES)
    (Path(state) / "tmp").mkdir()
    with open(os.path.join(state, "tmp", "blob"), "wb") as blob:
        for _ in range(BIG_MIB):
            blob.write(os.urandom(1 << 20))
    return state


def copies(floor: Floor, state: str) -> dict[str, Step]:
    """Steps 1 and 2: a fork's safe copy and ``cp -a`` into a tmpfs."""
    target = floor.tmpfs(floor.path("dst"), 512)

    def walk(prepared: object) -> str:
        copy_workspace(state, str(prepared), CAP, "bench")
        return str(prepared)

    def walk_workspace(prepared: object) -> str:
        copy_workspace(os.path.join(state, "workspace"), str(prepared), CAP, "bench")
        return str(prepared)

    def cp_a(prepared: object) -> str:
        run("cp", "-a", "--", state + "/.", str(prepared))
        return str(prepared)

    def remove(result: object) -> None:
        shutil.rmtree(str(result))

    def read_all(prepared: object) -> str:  # the system calls' floor: open and read every file once
        for directory, _, names in os.walk(state):
            for name in names:
                with open(os.path.join(directory, name), "rb") as handle:
                    handle.read()
        return ""

    return {
        "read": (lambda: "", read_all, lambda result: None),
        "walk": (lambda: floor.fresh(target), walk, remove),
        "walk-ws": (lambda: floor.fresh(target), walk_workspace, remove),
        "cp-a": (lambda: floor.fresh(target), cp_a, remove),
    }


def parent_image(floor: Floor, state: str) -> tuple[str, str, str, dict[str, int]]:
    """The state in a mounted ext4 image and a frozen copy of it: (store, image, mount point, sizes)."""
    store = floor.path("images")
    os.mkdir(store, 0o700)
    parent = os.path.join(store, "parent.img")
    with open(parent, "wb") as image:
        image.truncate(IMAGE_MIB << 20)
    # 4 KiB blocks, a 4 MiB journal (an ext4 without one scans recently freed inodes on every create),
    # inode tables and journal left unzeroed: the sparse file reads as zeros already; noinit_itable below
    # keeps the kernel from zeroing them after the mount, so the image stays sparse.
    run("mkfs.ext4", "-q", "-F", "-b", "4096", "-I", "256", "-J", "size=4", "-m", "0",
        "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", parent)  # fmt: skip
    sizes = {"empty": allocated(parent)}
    mounted = floor.path("parent")
    os.mkdir(mounted)
    device = loop_attach(parent)
    floor.callback(loop_detach, device)
    sys_mount(device, mounted, "ext4", MS_NOSUID | MS_NODEV, "noinit_itable")
    floor.callback(sys_umount, mounted)
    run("cp", "-a", "--", state + "/.", mounted)
    run("sync", "-f", mounted)
    sizes["parent"] = allocated(parent)
    snapshot = os.path.join(store, "snapshot.img")
    run("fsfreeze", "-f", mounted)
    try:
        sparse_copy(parent, snapshot)
    finally:
        run("fsfreeze", "-u", mounted)
    sizes["snapshot"] = allocated(snapshot)
    cp_copy = os.path.join(store, "cp.img")
    run("cp", "--sparse=always", snapshot, cp_copy)
    sizes["cp-sparse"] = allocated(cp_copy)
    os.unlink(cp_copy)
    return store, parent, mounted, sizes


def images(floor: Floor, state: str) -> tuple[dict[str, Step], dict[str, int]]:
    """Step 3: the state in an ext4 image; its snapshot, and a fork's state from it."""
    store, parent, mounted, sizes = parent_image(floor, state)
    snapshot = os.path.join(store, "snapshot.img")

    def new_name() -> str:
        floor.counter += 1
        return os.path.join(store, f"{floor.counter}.img")

    def snap_commands(prepared: object) -> str:
        run("fsfreeze", "-f", mounted)
        try:
            run("cp", "--sparse=always", parent, str(prepared))
        finally:
            run("fsfreeze", "-u", mounted)
        return str(prepared)

    def snap_calls(prepared: object) -> str:
        frozen = os.open(mounted, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.ioctl(frozen, 0xC0045877, 0)  # FIFREEZE
            try:
                sparse_copy(parent, str(prepared))
            finally:
                fcntl.ioctl(frozen, 0xC0045878, 0)  # FITHAW
        finally:
            os.close(frozen)
        return str(prepared)

    def fork_set_up() -> tuple[str, str]:
        floor.counter += 1
        where = os.path.join(floor.root, f"fork{floor.counter}")
        os.mkdir(where)
        return new_name(), where

    def fork_commands(prepared: object) -> tuple[str, str, str]:
        image, where = prepared  # type: ignore[misc]
        run("cp", "--sparse=always", snapshot, image)
        device = run("losetup", "-f", "--show", image).strip()
        run("mount", "-o", "nosuid,nodev", device, where)
        return image, where, device

    def fork_calls(prepared: object) -> tuple[str, str, str]:
        image, where = prepared  # type: ignore[misc]
        sparse_copy(snapshot, image)
        device = loop_attach(image)
        sys_mount(device, where, "ext4", MS_NOSUID | MS_NODEV, "noinit_itable")
        return image, where, device

    def fork_copy_only(prepared: object) -> tuple[str, str, str]:
        image, where = prepared  # type: ignore[misc]
        sparse_copy(snapshot, image)
        return image, where, ""

    def fork_undo(result: object) -> None:
        image, where, device = result  # type: ignore[misc]
        if device:
            sys_umount(where)
            loop_detach(device)
        os.rmdir(where)
        os.unlink(image)

    steps: dict[str, Step] = {
        "snap-cmd": (new_name, snap_commands, remove_file),
        "snap-sys": (new_name, snap_calls, remove_file),
        "fork-cmd": (fork_set_up, fork_commands, fork_undo),
        "fork-sys": (fork_set_up, fork_calls, fork_undo),
        "fork-copy": (fork_set_up, fork_copy_only, fork_undo),
    }
    return steps, sizes


def overlays(floor: Floor, state: str) -> dict[str, Step]:
    """Step 4: an overlay over the snapshot directory, an empty tmpfs as its upper layer."""

    def set_up() -> tuple[str, str]:
        floor.counter += 1
        where = os.path.join(floor.root, f"ovl{floor.counter}")
        os.makedirs(os.path.join(where, "upper"))
        os.mkdir(os.path.join(where, "merged"))
        return where, ""

    def layered(prepared: object) -> tuple[str, str]:
        where, _ = prepared  # type: ignore[misc]
        upper = os.path.join(where, "upper")
        sys_mount("adk-bench-floor", upper, "tmpfs", MS_NOSUID | MS_NODEV, "size=256m,mode=0755")
        os.mkdir(os.path.join(upper, "u"))
        os.mkdir(os.path.join(upper, "w"))
        options = f"lowerdir={state},upperdir={upper}/u,workdir={upper}/w"
        sys_mount("adk-bench-floor", os.path.join(where, "merged"), "overlay", MS_NOSUID | MS_NODEV, options)
        return where, ""

    def layered_then_write(prepared: object) -> tuple[str, str]:
        where, _ = layered(prepared)
        with open(os.path.join(where, "merged", "tmp", "blob"), "ab") as blob:  # the copy-up of 50 MiB
            blob.write(b"x")
        return where, ""

    def undo(result: object) -> None:
        where, _ = result  # type: ignore[misc]
        with contextlib.suppress(OSError):
            sys_umount(os.path.join(where, "merged"))
            sys_umount(os.path.join(where, "upper"))
        shutil.rmtree(where)

    return {"overlay": (set_up, layered, undo), "overlay-write": (set_up, layered_then_write, undo)}


def propagation(floor: Floor) -> list[str]:
    """Step 5: do host mounts made after the start reach a container through an rslave bind? (yes/no)."""
    bound = floor.path("bound")
    os.makedirs(os.path.join(bound, "sub"))
    lines = [
        f"`mount --bind {bound} {bound} && mount --make-shared {bound}` (the engine refuses rslave on a "
        "private mount)",
    ]
    run("mount", "--bind", bound, bound)
    floor.callback(run, "umount", bound)
    run("mount", "--make-shared", bound)
    container = run(
        "docker", "run", "-d", "--rm", "--label", "adk-bench-floor=1", "--mount",
        f"type=bind,source={bound},target=/tmp/x,bind-propagation=rslave", IMAGE_BASE, "sleep", "300",
    ).strip()  # fmt: skip
    floor.callback(run, "docker", "rm", "-f", container)
    lines.append(
        "`docker run -d --mount type=bind,source=DIR,target=/tmp/x,bind-propagation=rslave "
        f"{IMAGE_BASE} sleep 300`"
    )

    def inside(target: str) -> str:
        info = run("docker", "exec", container, "cat", "/proc/self/mountinfo")
        found = [line for line in info.splitlines() if line.split()[4] == target]
        return found[-1] if found else ""

    for label, target, seen in (
        ("on DIR itself", bound, "/tmp/x"),
        ("on DIR/sub", f"{bound}/sub", "/tmp/x/sub"),
    ):
        run("mount", "-t", "tmpfs", "-o", "size=8m,nosuid,nodev,mode=1777", "adk-bench-floor-probe", target)
        try:
            line = inside(seen)
        finally:
            run("umount", target)
        shown = line.split(" - ")[0].split()[5] if line else ""
        size = line.split(" - ")[1].split()[2] if line else ""
        ok = (
            "adk-bench-floor-probe" in line
            and "nosuid" in shown
            and "nodev" in shown
            and "size=8192k" in size
        )
        lines.append(
            f"`mount -t tmpfs -o size=8m,nosuid,nodev tmpfs {label}` after the start: "
            f"{'**yes**' if ok else '**no**'}, inside: `{line.strip() or 'not seen'}`"
        )
        after = inside(seen)
        gone = "adk-bench-floor-probe" not in after
        lines.append(f"  unmounted on the host: gone inside too: {'yes' if gone else 'no'}")
    return lines


def main() -> None:
    """Print the floor of a fork's state on this machine."""
    args = parser(__doc__)
    args.add_argument("--repeat", type=int, default=10)
    args.add_argument("--no-engine", action="store_true", help="skip step 5 (needs the Docker engine)")
    options = args.parse_args()
    repeat = 3 if options.quick else options.repeat
    if os.geteuid() != 0:
        raise SystemExit("needs root: it mounts tmpfs, loop devices and overlays")
    with Floor() as floor:
        state = build_state(floor)
        print(f"start: {load_note()}")
        steps = copies(floor, state)
        image_steps, sizes = images(floor, state)
        steps.update(image_steps)
        steps.update(overlays(floor, state))
        stats = sample(steps, repeat)
        print(f"end: {load_note()}\n")
        walk = stats["walk"].p50
        print("| step | p50 ms | p90 ms | / safe copy |\n|---|---|---|---|")
        for name, values in stats.items():
            print(f"| {name} | {values.p50:.1f} | {values.p90:.1f} | {values.p50 / walk:.2f}x |")
        print()
        for name, size in sizes.items():
            print(f"* image {name}: {size / 1e6:.1f} MB allocated (apparent {IMAGE_MIB} MiB)")
        if not options.no_engine:
            print()
            for line in propagation(floor):
                print(f"* {line}")
    with contextlib.suppress(FileNotFoundError):
        left = run("docker", "ps", "-aq", "--filter", "label=adk-bench-floor=1").split()
        print(f"* containers left: {len(left)}")


def _mounts_left() -> Iterator[str]:
    with open("/proc/self/mountinfo", encoding="utf-8") as info:
        yield from (line for line in info if "adk-bench-floor" in line)


if __name__ == "__main__":
    main()
    print(f"* mounts left: {len(list(_mounts_left()))}")
