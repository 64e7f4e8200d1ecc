"""Snapshots and forks (issue 24), side by side with a cold copy and with ``docker commit`` + a new container.

Run: .venv/bin/python bench/bench_fork.py [--repeat N] [--quick] [--runtime runsc]

The parent: a session from a pool of copies at a fixed path (``PoolConfig(size=8, workspace="mirror",
path=...)``) holding a 2,000-file workspace (8 KiB files of random bytes, 16 MB) and 50 MB in ``/tmp``
(50 files of 1 MiB). Rows, each interleaved sample by sample with its anchors (sessions closed untimed):

* ``parent.fork()`` (snapshot: the workspace, /tmp and HOME copied on the host; then a session from the
  forkable pool taking it: the workspace copied on the host into the member's directory and its mirror
  volume, /tmp and HOME into their volumes; ``--archives``: archived and pushed through the channel) + the
  fork's first ``true``, against a cold ``session(copy_of=tree)`` of
  a backend without a pool + first ``true`` (which carries the workspace only, not /tmp), and against
  ``docker commit`` of the parent's container + create + start of a container from that image (which
  carries neither the mirrored workspace nor /tmp: a commit sees neither a volume nor a tmpfs);
* the same fork by layer (``PoolConfig(..., fork_by="layer")``, a parent of its own from that pool: the
  snapshot's safe copy, then overlays over it mounted into a pool member), against the cold ``copy_of``
  and against the fork by copy;
* the split of a fork: the snapshot alone, the session from it alone;
* eight forks at once (one snapshot, eight sessions from it in threads), by copy and by layer, against
  eight cold ``copy_of`` sessions at once, total time until all eight ran ``true``;
* the snapshot's size on disk;
* the task profile's root layer (20 MB written under /opt): ``docker commit`` against an archive of the
  changed paths (``docker diff``, then ``tar`` of them inside over the channel), to say which is faster.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
from _fixtures import TRUE, containers_of_this_process, owned_workspace, runtime_name
from _timing import Row, Stats, parser, print_section
from bench_mirror import make_tree

from adk_sandbox.executor import ExecRequest, Language, ResourceLimits
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession, PoolConfig
from adk_sandbox.executor.backends.docker._spec import ContainerSpec, host_config_arguments
from adk_sandbox.executor.snapshots import SnapshotStore

TREE_FILES = 2000
TMP_MB = 50
REPO = "/work/repo"
FORKS = 8
TARGET_MS = 150.0
#: A directory on disk for the disk-store row (the temporary directory is a tmpfs on some machines).
DISK = str(Path.home() / ".cache")


def command(code: str, timeout: float = 120) -> ExecRequest:
    return ExecRequest(language=Language.COMMAND, code=code, timeout=timeout)


def first(session: DockerSession) -> DockerSession:
    """``session`` after its first ``true`` ran."""
    assert session.execute(TRUE).exit_code == 0
    return session


def commit_and_start(client: docker.DockerClient, container_id: str, runtime: str | None) -> tuple[str, str]:
    """``docker commit`` of the container (paused) and a hardened container started from it: (image, id)."""
    image = str(client.api.commit(container_id, repository="adk-bench-commit", pause=True)["Id"])
    spec = ContainerSpec(image=image, limits=ResourceLimits(), runtime=runtime)
    arguments = {**host_config_arguments(spec), "auto_remove": False}
    created = client.api.create_container(
        image, entrypoint=["sleep"], command=["600"], host_config=client.api.create_host_config(**arguments)
    )
    client.api.start(created["Id"])
    return image, str(created["Id"])


def forks_side_by_side(
    *,
    parent: DockerSession,
    pooled: DockerBackend,
    cold: DockerBackend,
    layered: tuple[DockerBackend, DockerSession],
    tree: Path,
    runtime: str | None,
    repeat: int,
) -> tuple[dict[str, Stats], dict[str, Stats]]:
    """Milliseconds of each way to a second session holding the parent's state (see the docstring)."""
    client = pooled.client
    samples: dict[str, list[float]] = {"fork": [], "fork-shm": [], "layer": [], "copy": [], "commit": []}
    split: dict[str, list[float]] = {
        **{"snapshot": [], "session": [], "snapshot-shm": [], "session-shm": []},
        **{"snapshot-layer": [], "session-layer": []},
    }
    disk = SnapshotStore(tempfile.mkdtemp(prefix="adk-bench-snapshots-", dir=DISK))

    def forking(
        store: SnapshotStore, suffix: str, source: tuple[DockerBackend, DockerSession] = (pooled, parent)
    ) -> Callable[[], Callable[[], None]]:
        backend, origin = source

        def fork() -> Callable[[], None]:
            started = time.perf_counter()
            snap = origin.snapshot(store=store)
            taken = time.perf_counter()
            session = first(backend.session(snapshot=snap))
            split["snapshot" + suffix].append((taken - started) * 1000)
            split["session" + suffix].append((time.perf_counter() - taken) * 1000)

            def undo() -> None:
                session.close()
                store.remove(snap.id)

            return undo

        return fork

    def copy() -> Callable[[], None]:
        return first(cold.session(copy_of=tree)).close

    def commit() -> Callable[[], None]:
        image, container = commit_and_start(client, parent.container_id, runtime)

        def undo() -> None:
            client.api.remove_container(container, force=True)
            client.api.remove_image(image, force=True)

        return undo

    fns = {
        "fork": forking(pooled.snapshots, ""),
        "fork-shm": forking(disk, "-shm"),
        "layer": forking(layered[0].snapshots, "-layer", layered),
        "copy": copy,
        "commit": commit,
    }
    order = list(fns)
    assert pooled.pool is not None
    assert layered[0].pool is not None
    for i in range(repeat + 1):  # the first round is the warm-up
        for name in order[i % len(order) :] + order[: i % len(order)]:
            assert pooled.pool.wait_ready(120)
            assert layered[0].pool.wait_ready(120)
            started = time.perf_counter()
            undo = fns[name]()
            elapsed = (time.perf_counter() - started) * 1000
            undo()
            if i:
                samples[name].append(elapsed)
        if i == 0:
            split = {name: [] for name in split}
    shutil.rmtree(disk.root, ignore_errors=True)
    return (
        {name: Stats(tuple(values)) for name, values in samples.items()},
        {name: Stats(tuple(values)) for name, values in split.items()},
    )


def eight_at_once(
    parent: DockerSession, pooled: DockerBackend, cold: DockerBackend | None, tree: Path, rounds: int
) -> tuple[Stats, Stats]:
    """FORKS forks of one snapshot at once, total; and (with ``cold``) FORKS cold ``copy_of`` sessions."""
    forked: list[float] = []
    copied: list[float] = []
    assert pooled.pool is not None
    for i in range(rounds + 1):
        pooled.pool.wait_ready(120)
        started = time.perf_counter()
        snap = parent.snapshot()
        with ThreadPoolExecutor(FORKS) as threads:
            sessions = list(threads.map(lambda _, s=snap: first(pooled.session(snapshot=s)), range(FORKS)))
        elapsed = (time.perf_counter() - started) * 1000
        for session in sessions:
            session.close()
        pooled.snapshots.remove(snap.id)
        if i:
            forked.append(elapsed)
        if cold is None:
            continue
        started = time.perf_counter()
        with ThreadPoolExecutor(FORKS) as threads:
            sessions = list(threads.map(lambda _: first(cold.session(copy_of=tree)), range(FORKS)))
        elapsed = (time.perf_counter() - started) * 1000
        for session in sessions:
            session.close()
        if i:
            copied.append(elapsed)
    return Stats(tuple(forked)), Stats(tuple(copied) or (0.0,))


def root_layer(runtime: str | None, repeat: int) -> tuple[Stats, Stats, int]:
    """The task profile's 20 MB of root writes: docker commit against a tar of the changed paths."""
    with DockerBackend(profile="task", runtime=runtime) as task, task.session() as session:
        code = (
            "mkdir -p /opt/data && for i in $(seq 200); do head -c 102400 /dev/urandom > /opt/data/f$i; done"
        )
        assert session.execute(command(code)).exit_code == 0
        client = task.client
        commits: list[float] = []
        archives: list[float] = []
        size = 0
        for _ in range(repeat):
            started = time.perf_counter()
            image = client.api.commit(session.container_id, repository="adk-bench-commit", pause=True)["Id"]
            commits.append((time.perf_counter() - started) * 1000)
            client.api.remove_image(image, force=True)
            started = time.perf_counter()
            changed = [c["Path"] for c in client.api.diff(session.container_id) if c["Kind"] in (0, 1)]
            listing = "\n".join(changed)
            archive = session.execute(
                ExecRequest(
                    language=Language.COMMAND,
                    code="tar -c -f - --no-recursion -T - | wc -c",
                    stdin=listing,
                    timeout=120,
                )
            )
            archives.append((time.perf_counter() - started) * 1000)
            size = int(archive.stdout.strip() or 0)
        return Stats(tuple(commits)), Stats(tuple(archives)), size


def main() -> None:
    """Print the issue 24 fork table."""
    args = parser(__doc__)
    args.add_argument("--repeat", type=int, default=20)
    args.add_argument("--runtime", default=None, help="e.g. runsc")
    args.add_argument(
        "--archives", action="store_true", help="a pool without forkable=True (/tmp, HOME archived inside)"
    )
    options = args.parse_args()
    repeat = 3 if options.quick else options.repeat
    rt = runtime_name(options.runtime)
    client = docker.from_env()
    tree = Path(owned_workspace("adk-bench-fork-tree-"))
    make_tree(tree, TREE_FILES)
    pooled = DockerBackend(
        runtime=options.runtime,
        pool=PoolConfig(size=FORKS, workspace="mirror", path=REPO, forkable=not options.archives),
    )
    cold = DockerBackend(runtime=options.runtime)
    # Forks by layer: a pool of its own (FORKS members: for the forks at once too), its own parent.
    layering = PoolConfig(size=FORKS, workspace="mirror", path=REPO, forkable=True, fork_by="layer")
    layered = DockerBackend(runtime=options.runtime, pool=layering)
    try:
        parent = pooled.session(copy_of=tree)
        layered_parent = layered.session(copy_of=tree)
        fill = f"for i in $(seq {TMP_MB}); do head -c 1048576 /dev/urandom > /tmp/blob$i; done"
        assert parent.execute(command(fill)).exit_code == 0
        assert layered_parent.execute(command(fill)).exit_code == 0
        sizes = parent.snapshot()
        du = subprocess.run(
            ["du", "-sb", sizes.path], capture_output=True, text=True, check=True
        ).stdout.split()[0]
        pooled.snapshots.remove(sizes.id)
        stats, split = forks_side_by_side(
            parent=parent,
            pooled=pooled,
            cold=cold,
            layered=(layered, layered_parent),
            tree=tree,
            runtime=options.runtime,
            repeat=repeat,
        )
        eight, eight_cold = eight_at_once(parent, pooled, cold, tree, max(2, repeat // 4))
        eight_layered, _ = eight_at_once(layered_parent, layered, None, tree, max(2, repeat // 4))
        commit, archive, archived = root_layer(options.runtime, max(3, repeat // 4))
        parent.close()
        layered_parent.close()
    finally:
        layered.close()
        pooled.close()
        cold.close()
        shutil.rmtree(tree, ignore_errors=True)
    fork = stats["fork"]
    rows = [
        Row.latency(
            f"{rt}: `parent.fork()` from a pool (snapshot + session) + first `true`",
            fork,
            "cold `session(copy_of=tree)` + first `true` (workspace only)",
            stats["copy"],
        ),
        Row.latency(
            f"{rt}: `parent.fork()` by layer (`fork_by='layer'`: snapshot + overlays) + first `true`",
            stats["layer"],
            "cold `session(copy_of=tree)` + first `true` (workspace only)",
            stats["copy"],
        ),
        Row.latency(
            f"{rt}: the fork by layer",
            stats["layer"],
            "the fork by copy (`parent.fork()` above, the default store)",
            fork,
        ),
        Row.latency(
            f"{rt}: the session part of a fork by layer",
            split["session-layer"],
            "the session part of a fork by copy",
            split["session"],
        ),
        Row.latency(
            f"{rt}: the same fork, a store on disk (`SnapshotStore(path)`: every snapshot on disk)",
            stats["fork-shm"],
            "cold `session(copy_of=tree)` + first `true` (workspace only)",
            stats["copy"],
        ),
        Row.latency(
            f"{rt}: the fork (the default store)",
            fork,
            "`docker commit` (paused) + create + start (no workspace, no /tmp)",
            stats["commit"],
        ),
        Row.latency(
            f"{rt}: {FORKS} forks at once (one snapshot, {FORKS} sessions in threads), total",
            eight,
            f"{FORKS} cold `copy_of` sessions at once, total",
            eight_cold,
        ),
        Row.latency(
            f"{rt}: {FORKS} forks by layer at once (one snapshot, {FORKS} sessions in threads), total",
            eight_layered,
            f"{FORKS} cold `copy_of` sessions at once, total",
            eight_cold,
        ),
        Row.latency(
            f"{rt}: task root layer (20 MB): `docker commit`", commit, "`docker diff` + tar inside", archive
        ),
    ]
    left = containers_of_this_process(client)
    notes = [
        f"target: fork p50 ≤ {TARGET_MS:g} ms: {fork.p50:.0f} ms "
        f"({'met' if fork.p50 <= TARGET_MS else 'NOT met'})",
        f"target with a store on disk: {stats['fork-shm'].p50:.0f} ms "
        f"({'met' if stats['fork-shm'].p50 <= TARGET_MS else 'NOT met'})",
        f"pool forkable={not options.archives}; a fork's split, the default store (owned: memory tier): "
        f"snapshot p50 "
        f"{split['snapshot'].p50:.0f} ms, session from it p50 {split['session'].p50:.0f} ms; store on disk: "
        f"snapshot p50 {split['snapshot-shm'].p50:.0f} ms, session p50 {split['session-shm'].p50:.0f} ms "
        "(the session from the pool: host copies of the workspace, /tmp and HOME, first `true`)",
        f"target by layer: {stats['layer'].p50:.0f} ms "
        f"({'met' if stats['layer'].p50 <= TARGET_MS else 'NOT met'}); its split: snapshot p50 "
        f"{split['snapshot-layer'].p50:.0f} ms, session from it p50 {split['session-layer'].p50:.0f} ms",
        f"the snapshot on disk: {int(du) / 1e6:.1f} MB (`du -sb`; {TREE_FILES} files of 8 KiB + {TMP_MB} MiB "
        f"of /tmp, a tree or an archive), method {sizes.method}, size_bytes {sizes.size_bytes / 1e6:.1f} MB",
        f"the changed paths' archive: {archived / 1e6:.1f} MB",
        f"containers of this process left: {len(left)}",
    ]
    print_section(f"Issue 24: snapshots and forks ({rt})", rows, notes)
    client.close()


if __name__ == "__main__":
    main()
