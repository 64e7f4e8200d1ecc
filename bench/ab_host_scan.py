"""The mirror's host-side sync cost of a command that changed nothing: this code against another commit's.

Run: PYTHONPATH=. .venv/bin/python bench/ab_host_scan.py [--against REV] [--repeat N] [--quick]
``MirrorWorkspace.before_command`` on trees of 2,000 and 10,000 files of 8 KiB (16 and 80 MB; 100 files a
directory), after the racy window has passed, interleaved call by call with the same call of the
``_workspace.py`` of ``REV`` (default 990a626: the by-path walk and reads), both on the same tree. The
container side is the unit tests' in-memory one (a command that changed nothing sends nothing), so the
rows are the host scan alone: the walk, one ``lstat`` an entry, the compare.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

from _timing import Row, interleaved, parser, print_section
from bench_mirror import make_tree

from adk_sandbox.executor.workspace.mirror import MirrorWorkspace
from tests.unit.test_mirror_sync import FakeContainer


def workspace_module(rev: str) -> Any:
    """``executor/backends/docker/_workspace.py`` as of ``rev``, as a module."""
    source = subprocess.run(
        ["git", "show", f"{rev}:executor/backends/docker/_workspace.py"],
        cwd=Path(__file__).resolve().parent.parent, capture_output=True, check=True,
    ).stdout  # fmt: skip
    module = types.ModuleType("bench_ab_workspace")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, f"{rev}:_workspace.py", "exec"), module.__dict__)  # noqa: S102 - our own history
    return module


def rows_for(files: int, rev: str, repeat: int) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="adk-ab-scan-") as root:
        make_tree(Path(root), files)
        owner = (os.getuid(), os.getgid())
        new = MirrorWorkspace(root, 1024, owner)
        old = workspace_module(rev).MirrorWorkspace(root, 1024, owner)
        new_box, old_box = FakeContainer(), FakeContainer()
        new.started(new_box.run)
        old.started(old_box.run)
        time.sleep(2.5)  # past both racy windows: the steady state
        for mirror, box in ((new, new_box), (old, old_box)):
            mirror.before_command(box.run)  # settles what the start's scan found racy
        stats = interleaved(
            {"new": lambda: new.before_command(new_box.run), "old": lambda: old.before_command(old_box.run)},
            repeat,
        )
        new.close()
        old.close()
    return [
        Row.latency(f"host scan of {files} files, nothing changed (this code)", stats["new"],
                    f"the same at {rev}", stats["old"]),
    ]  # fmt: skip


def main() -> None:
    args = parser(__doc__)
    args.add_argument("--against", default="990a626")
    args.add_argument("--repeat", type=int, default=30)
    options = args.parse_args()
    repeat = 5 if options.quick else options.repeat
    rows = [row for files in (2000, 10000) for row in rows_for(files, options.against, repeat)]
    print_section(f"Mirror host scan against {options.against}", rows)


if __name__ == "__main__":
    main()
