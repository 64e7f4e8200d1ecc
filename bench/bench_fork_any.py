"""Forks of ordinary sessions (issue 32), side by side with a cold copy of the same tree, in one run.

Run: .venv/bin/python bench/bench_fork_any.py [--repeat N] [--quick]

The parent is the session users have: ``DockerBackend(pool=PoolConfig(size=4, workspace="mirror"))`` (the
default pool shape for copies), ``backend.session(workspace=DIR)`` bound to a host directory of 2,000 files
(8 KiB each, 16 MB), with 50 MB written in ``/tmp`` (50 files of 1 MiB). Rows, interleaved sample by sample
(each new session closed untimed, the fork's snapshot removed with it):

* ``parent.fork()`` + the fork's first ``true``, against a cold ``session(copy_of=tree)`` + first ``true``
  of a backend without a pool (which carries the workspace only, not ``/tmp``). Target: p50 ≤ 0.5x;
* the same fork with ``DockerConfig(fork_spares=0)`` (the cold path, today's fallback), against the same;
* a pooled fork by layer (``PoolConfig(size=4, workspace="mirror", path=..., forkable=True,
  fork_by="layer")``, a parent copied into that pool) + first ``true``. Target: p50 ≤ 150 ms.

The tree lives in the home directory's cache (a pool path may not be below ``/tmp``).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from _fixtures import TRUE
from _timing import Row, Stats, interleaved, parser, print_section
from bench_mirror import make_tree

from adk_sandbox.executor import ExecRequest, Language
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession, PoolConfig
from adk_sandbox.executor.backends.docker.config import DockerConfig

TREE_FILES = 2000
TMP_MB = 50
REPO = "/work/repo"
FILL = f"for i in $(seq {TMP_MB}); do head -c 1048576 /dev/urandom > /tmp/blob$i; done"


def first(session: DockerSession) -> DockerSession:
    """``session`` after its first ``true`` ran."""
    assert session.execute(TRUE).exit_code == 0
    return session


def filled(session: DockerSession) -> DockerSession:
    """``session`` with 50 MB in ``/tmp``."""
    result = session.execute(ExecRequest(language=Language.COMMAND, code=FILL, timeout=120))
    assert result.exit_code == 0, result.stderr
    return session


def forking(parent: DockerSession, methods: list[str]) -> Callable[[], None]:
    def fork() -> None:
        child = first(parent.fork())
        methods.append(str(child.fork_method))
        child.close()

    return fork


def main() -> None:
    """Print the issue 32 fork table."""
    args = parser(__doc__)
    args.add_argument("--repeat", type=int, default=15)
    options = args.parse_args()
    repeat = 3 if options.quick else options.repeat
    cache = Path.home() / ".cache"
    cache.mkdir(exist_ok=True)
    tree = Path(tempfile.mkdtemp(prefix="adk-bench-fork-any-tree-", dir=cache))
    work = Path(tempfile.mkdtemp(prefix="adk-bench-fork-any-", dir=cache))
    make_tree(tree, TREE_FILES)
    shutil.copytree(tree, work, dirs_exist_ok=True)
    ordinary = DockerBackend(pool=PoolConfig(size=4, workspace="mirror"))
    without = DockerBackend(config=DockerConfig(fork_spares=0))
    cold = DockerBackend()
    layered = DockerBackend(
        pool=PoolConfig(size=4, workspace="mirror", path=REPO, forkable=True, fork_by="layer")
    )
    methods: dict[str, list[str]] = {"fork": [], "fork-cold": [], "layer": []}
    try:
        parent = filled(ordinary.session(workspace=str(work)))
        parent_cold = filled(without.session(workspace=str(work)))
        parent_layered = filled(layered.session(copy_of=str(tree)))
        fns: dict[str, Callable[[], object]] = {
            "fork": forking(parent, methods["fork"]),
            "fork-cold": forking(parent_cold, methods["fork-cold"]),
            "layer": forking(parent_layered, methods["layer"]),
            "copy_of": lambda: first(cold.session(copy_of=str(tree))).close(),
        }
        # Each sample starts with its backend's pools and spares ready (untimed), as bench_fork.py does:
        # a fork that finds its spare still starting waits for it (the back-to-back case is not this row).
        pools = [p for b in (ordinary, layered) for p in (b.pool, *b.spares) if p is not None]
        stats: dict[str, Stats] = interleaved(
            fns, repeat, before=lambda: all(p.wait_ready(120) for p in pools)
        )
        for session in (parent, parent_cold, parent_layered):
            session.close()
    finally:
        for backend in (ordinary, without, cold, layered):
            backend.close()
        shutil.rmtree(tree, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    anchor = "cold `session(copy_of=tree)` + first `true` (workspace only)"
    rows = [
        Row.latency(
            "runc: `parent.fork()` of an ordinary session (bound workspace, default pool) + first `true`",
            stats["fork"], anchor, stats["copy_of"], max_ratio=0.5,
        ),
        Row.latency(
            "runc: the same fork with `DockerConfig(fork_spares=0)` (cold: the fallback)",
            stats["fork-cold"], anchor, stats["copy_of"],
        ),
        Row.latency(
            "runc: `parent.fork()` from a pool by layer (`fork_by='layer'`) + first `true`",
            stats["layer"], anchor, stats["copy_of"],
        ),
    ]  # fmt: skip
    print_section(
        f"Forks of ordinary sessions (issue 32), {repeat} samples each",
        rows,
        [
            f"how each fork came (fork_method): ordinary {sorted(set(methods['fork']))}, "
            f"fork_spares=0 {sorted(set(methods['fork-cold']))}, pooled {sorted(set(methods['layer']))}",
            f"the pooled fork by layer p50 {stats['layer'].p50:.0f} ms (target ≤ 150 ms: "
            f"{'met' if stats['layer'].p50 <= 150 else 'not met'})",
        ],
    )


if __name__ == "__main__":
    main()
