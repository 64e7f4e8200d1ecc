"""grep and glob of the devtools against ripgrep, find and a plain scandir + regex loop, in one run.

Run: .venv/bin/python bench/bench_devtools.py [--repeat N]
The tree is a copy of this Python's standard library (without __pycache__ and site-packages) in a temp
workspace. Every contender must agree on the number of matching lines / files, or the run fails. Caches
are warm (one untimed run each first); the tool runs without its 500/1000 caps (``limit=None``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import regex
from _timing import timed
from wcmatch import fnmatch as wcfnmatch

from adk_sandbox.devtools import Workspace
from adk_sandbox.devtools.tools._common import SKIP_DIRS, is_binary
from adk_sandbox.devtools.tools.glob import glob_files
from adk_sandbox.devtools.tools.grep import MAX_GREP_FILE_BYTES, grep_lines

PATTERNS = [r"def \w+\(self", r"frozenset", r"^import (os|sys)$"]
RG = shutil.which("rg") or "/usr/bin/rg"


def median_ms(fn: Callable[[], int], repeat: int) -> tuple[float, int]:
    """Median ms of ``fn`` after one untimed run (page cache, compiled patterns); every run must agree."""
    result = fn()

    def again() -> None:
        assert fn() == result

    return timed(again, repeat, warm_up=False).p50, result


def rg_count(root: Path, pattern: str) -> int:
    excludes = [arg for name in sorted(SKIP_DIRS) for arg in ("-g", f"!{name}/")]
    done = subprocess.run(
        [RG, "-j1", "--no-ignore", "--hidden", "--no-messages", "-c", *excludes, "--", pattern, str(root)],
        capture_output=True,
        text=True,
        check=False,
    )
    return sum(int(line.rsplit(":", 1)[1]) for line in done.stdout.splitlines())


def scandir_regex_count(root: Path, pattern: str) -> int:
    # The floor: os.walk + whole-file bytes + regex, no containment, no formatting.
    compiled = regex.compile(pattern.encode(), regex.MULTILINE)
    count = 0
    for parent, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        for name in files:
            path = os.path.join(parent, name)
            if os.path.islink(path) or os.path.getsize(path) > MAX_GREP_FILE_BYTES:
                continue
            with open(path, "rb") as handle:
                data = handle.read()
            if is_binary(data):
                continue
            pos = 0
            while (found := compiled.search(data, pos)) is not None:
                count += 1
                end = data.find(b"\n", found.start())
                if end == -1:
                    break
                pos = end + 1
    return count


def find_count(root: Path, name_glob: str) -> int:
    prune: list[str] = []
    for name in sorted(SKIP_DIRS):
        prune += ["-name", name, "-o"]
    done = subprocess.run(
        ["find", str(root), "-type", "d", "(", *prune[:-1], ")", "-prune", "-o", "-type", "f", "-name",
         name_glob, "-print"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return len(done.stdout.splitlines())


def walk_fnmatch_count(root: Path, name_glob: str) -> int:
    matcher = wcfnmatch.compile(name_glob, flags=wcfnmatch.DOTMATCH)
    count = 0
    for _, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        count += sum(1 for name in files if matcher.match(name))
    return count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    base = Path(tempfile.mkdtemp(prefix="bench-devtools-"))
    root = base / "stdlib"
    shutil.copytree(
        stdlib,
        root,
        symlinks=True,
        ignore=shutil.ignore_patterns("__pycache__", "site-packages", "dist-packages"),
    )
    files = sum(len(f) for _, _, f in os.walk(root))
    size_mb = sum(os.path.getsize(os.path.join(p, n)) for p, _, fs in os.walk(root) for n in fs) / 1e6
    rows: list[tuple[str, float, int, float, float]] = []
    with Workspace(root, writable=False, allow_bash=False) as ws:
        for pattern in PATTERNS:
            tool_ms, tool_n = median_ms(lambda p=pattern: len(grep_lines(ws, p, limit=None)[0]), args.repeat)
            rg_ms, rg_n = median_ms(lambda p=pattern: rg_count(root, p), args.repeat)
            base_ms, base_n = median_ms(lambda p=pattern: scandir_regex_count(root, p), args.repeat)
            assert tool_n == rg_n == base_n, (pattern, tool_n, rg_n, base_n)
            rows.append((f"grep `{pattern}`", tool_ms, tool_n, rg_ms, base_ms))
        glob_ms, glob_n = median_ms(lambda: len(glob_files(ws, "**/*.py", None, limit=None)[0]), args.repeat)
        find_ms, find_n = median_ms(lambda: find_count(root, "*.py"), args.repeat)
        walk_ms, walk_n = median_ms(lambda: walk_fnmatch_count(root, "*.py"), args.repeat)
        assert glob_n == find_n == walk_n, (glob_n, find_n, walk_n)
        rows.append(("glob `**/*.py`", glob_ms, glob_n, find_ms, walk_ms))
    shutil.rmtree(base)

    print(f"tree: {stdlib} copy, {files} files, {size_mb:.0f} MB; repeat={args.repeat}; "
          f"{os.cpu_count()} cpus; {time.strftime('%Y-%m-%d')}\n")  # fmt: skip
    print(
        "| what | devtools ms | lines/files | anchor ms (`rg -j1` / `find`) | ratio | plain loop ms | ratio |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, ms, n, anchor, floor in rows:
        print(
            f"| {name} | {ms:.1f} | {n} | {anchor:.1f} | {ms / anchor:.2f}x "
            f"| {floor:.1f} | {ms / floor:.2f}x |"
        )


if __name__ == "__main__":
    main()
