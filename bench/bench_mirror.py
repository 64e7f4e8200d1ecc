"""Issue 13, step 2: the workspace mirror's push and pull against a plain ``tar`` of the same tree.

On the local engine with ``workspace_transport="mirror"`` forced, for trees of 2,000 and 10,000 files of
8 KiB (16 and 80 MB): the full push at start (host scan + tar over the agent channel + the container's
baseline listing) against ``tar -c | docker exec -i tar -x``; the pull-back of 10 changed files and of every
file against ``docker exec tar -c | tar -x``; and the sync cost of a command that changed nothing against
the command itself (``true``) and against the full scan it replaced (issue 13, the sync cut: the code of
commit ``OLD_SCAN_COMMIT``, loaded from git, syncing the same session in the same run).

    PYTHONPATH=. python bench/bench_mirror.py [--quick] [--sync-only]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

from _timing import Row, interleaved, parser, print_section

from adk_sandbox.executor import ExecRequest, Language
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from adk_sandbox.executor.workspace.mirror import MirrorWorkspace
from adk_sandbox.executor.workspace.protocol import Run
from adk_sandbox.executor.workspace.racy import RACY_NS

#: The last commit with the full scan on both sides (every host entry lstat'ed into an Entry, every
#: container record parsed with Decimal), the anchor of the sync rows.
OLD_SCAN_COMMIT = "c836b77"


def old_workspace_module() -> Any:
    """``executor/backends/docker/_workspace.py`` as of :data:`OLD_SCAN_COMMIT`, as a module."""
    repository = Path(__file__).resolve().parent.parent
    source = subprocess.run(
        ["git", "show", f"{OLD_SCAN_COMMIT}:executor/backends/docker/_workspace.py"],
        cwd=repository, capture_output=True, check=True,
    ).stdout  # fmt: skip
    module = types.ModuleType("bench_old_workspace")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, f"{OLD_SCAN_COMMIT}:_workspace.py", "exec"), module.__dict__)  # noqa: S102 - our own history
    return module


def make_tree(root: Path, files: int) -> None:
    per_dir = 100
    for index in range(files):
        directory = root / f"d{index // per_dir:03}"
        directory.mkdir(exist_ok=True)
        (directory / f"f{index:05}.txt").write_bytes(os.urandom(8192))


def mirror_of(session: DockerSession) -> MirrorWorkspace:
    mirror = session.mirror
    assert mirror is not None
    return mirror


def sync_run(session: DockerSession) -> Run:
    """The session's own sync step runner (a command as the user, outside any request and its sync)."""
    synced = session._workspace
    assert synced is not None
    return synced.run


def in_container(session: DockerSession, script: str) -> None:
    result = sync_run(session)(("/bin/sh", "-c", script), None, 1 << 20)  # no sync around it
    assert result.exit_code == 0, result.stderr


def sync_rows(session: DockerSession, root: Path, files: int, repeat: int) -> list[Row]:
    """The sync around a command that changed nothing: the cut against the old full scan, same session."""
    mirror, run = mirror_of(session), sync_run(session)
    # The steady state: files written less than RACY_NS before a scan have their content checked (the
    # tree was just made), which a session pays once after a big change, not on every command.
    time.sleep(RACY_NS / 1e9)
    old_module = old_workspace_module()
    old = old_module.MirrorWorkspace(str(root), mirror.cap_bytes // (1024 * 1024), mirror.owner)
    old._host = old_module.scan_host(str(root))
    listing, complete = old._list(run)
    assert complete
    old._inside = listing

    def new_sync() -> None:
        mirror.before_command(run)
        assert mirror.after_command(run) == []

    def old_sync() -> None:
        old.before_command(run)
        assert old.after_command(run) == []

    def new_host() -> None:
        mirror.before_command(run)

    def old_host() -> None:
        old.before_command(run)

    def new_inside() -> None:
        mirror.after_command(run)

    def old_inside() -> None:
        old.after_command(run)

    stats = interleaved(
        {"new": new_sync, "old": old_sync, "new_host": new_host, "old_host": old_host,
         "new_inside": new_inside, "old_inside": old_inside},
        repeat,
    )  # fmt: skip
    try:
        return [
            Row.latency(f"sync around a command, nothing changed, {files} files", stats["new"],
                        "the old full scan (same session, same run)", stats["old"]),
            Row.latency(f"  of which the host scan (before), {files} files", stats["new_host"],
                        "the old host scan", stats["old_host"]),
            Row.latency(f"  of which the container listing (after), {files} files", stats["new_inside"],
                        "the old listing and parse", stats["old_inside"]),
        ]  # fmt: skip
    finally:
        old.close()


def scenario(backend: DockerBackend, files: int, repeat: int, sync_only: bool = False) -> list[Row]:
    """Push, pull and sync timings for a tree of ``files`` files, each beside its anchor."""
    rows: list[Row] = []
    root = Path(tempfile.mkdtemp(prefix=f"bench-mirror-{files}-"))
    scratch = Path(tempfile.mkdtemp(prefix="bench-mirror-anchor-"))
    try:
        make_tree(root, files)
        with backend.session(workspace=root) as session:
            mirror = mirror_of(session)
            cid, ws = session.container_id, str(root)
            run = sync_run(session)
            rows += sync_rows(session, root, files, repeat * 4)
            if sync_only:
                return rows

            def push() -> None:
                mirror.started(run)

            def tar_in() -> None:
                packer = subprocess.Popen(["tar", "-c", "-f", "-", "-C", ws, "."], stdout=subprocess.PIPE)
                subprocess.run(
                    ["docker", "exec", "-i", "-u", "0:0", cid, "tar", "-x", "-f", "-", "-C", "/tmp"],
                    stdin=packer.stdout, check=True,
                )  # fmt: skip
                packer.wait()
                in_container(session, "rm -rf /tmp/d*")

            stats = interleaved({"ours": push, "tar": tar_in}, repeat)
            rows.append(
                Row.latency(
                    f"push {files} files at start",
                    stats["ours"],
                    "tar -c, piped to docker exec tar -x",
                    stats["tar"],
                )
            )

            def pull_changed(count: int) -> None:
                script = f"cd {ws} && find . -type f -name '*.txt' | head -{count} | xargs touch"
                in_container(session, script)
                refused = mirror.after_command(run)
                assert refused == [], refused

            def tar_out() -> None:
                shutil.rmtree(scratch, ignore_errors=True)
                scratch.mkdir()
                reader = subprocess.Popen(
                    ["docker", "exec", cid, "tar", "-c", "-f", "-", "-C", ws, "."], stdout=subprocess.PIPE
                )  # fmt: skip
                subprocess.run(["tar", "-x", "-f", "-", "-C", str(scratch)], stdin=reader.stdout, check=True)
                reader.wait()

            stats = interleaved(
                {"ten": lambda: pull_changed(10), "all": lambda: pull_changed(files), "tar": tar_out},
                repeat,
            )
            rows.append(
                Row.latency(
                    f"pull 10 changed of {files}",
                    stats["ten"],
                    "docker exec tar -c, piped to tar -x (all)",
                    stats["tar"],
                )
            )
            rows.append(
                Row.latency(
                    f"pull all {files} changed",
                    stats["all"],
                    "docker exec tar -c, piped to tar -x (all)",
                    stats["tar"],
                )
            )

            def sync_nothing() -> None:
                mirror.before_command(run)
                mirror.after_command(run)

            def bare_true() -> None:
                in_container(session, "true")

            stats = interleaved({"sync": sync_nothing, "true": bare_true}, repeat * 2)
            rows.append(
                Row.latency(
                    f"sync around a command, nothing changed, {files} files",
                    stats["sync"],
                    "`true` on the agent",
                    stats["true"],
                )
            )
            check = session.execute(ExecRequest(language=Language.COMMAND, code="true", timeout=60))
            assert check.exit_code == 0
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
    return rows


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--sync-only", action="store_true", help="only the sync rows (the cut)")
    args = arguments.parse_args()
    repeat = 2 if args.quick else 5
    rows: list[Row] = []
    notes: list[str] = []
    with DockerBackend(workspace_transport="mirror", mirror_size_mb=512) as backend:
        for files in (2000, 10000):
            rows += scenario(backend, files, repeat, args.sync_only)
    notes.append("ours includes the host scan (lstat of every entry) and the container's listing (GNU find)")
    print_section("Issue 13, step 2: mirror", rows, notes)


if __name__ == "__main__":
    main()
