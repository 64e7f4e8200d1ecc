"""glob: files whose paths match a pattern (``**`` spans directories, ``*`` stays within one)."""

from __future__ import annotations

import os
import stat
from typing import Any

from pydantic import Field
from wcmatch import fnmatch as wcfnmatch
from wcmatch import glob as wcglob
from wcmatch._wcparse import PatternLimitException  # not re-exported by wcmatch's public modules

from adk_sandbox.devtools.errors import InvalidArgumentsError, PathEscapeError, PathNotFoundError
from adk_sandbox.devtools.tools._common import GlobText, PathText, ToolArgs, walk_files
from adk_sandbox.devtools.workspace import Workspace

__all__ = [
    "DESCRIPTION",
    "GLOB_FLAGS",
    "GLOB_PATTERN_LIMIT",
    "MAX_GLOB_MATCHES",
    "GlobArgs",
    "compile_glob",
    "glob",
    "glob_files",
]

MAX_GLOB_MATCHES = 1000
"""Most paths one glob call returns."""

GLOB_PATTERN_LIMIT = 1000
"""Most patterns one glob may expand to (``{a,b}{c,d}`` is four); more is an argument error."""

GLOB_FLAGS = wcglob.GLOBSTAR | wcglob.DOTMATCH | wcglob.BRACE
"""``**`` crosses directories, ``*`` also matches names starting with a dot, ``{a,b}`` alternates."""

DESCRIPTION = (
    "Find files whose path matches a glob pattern, e.g. `**/*.py` or `src/*.{rs,toml}`. `**` spans "
    "directories, `*` matches within one name. The pattern is relative to `path` (default: the workspace "
    f"root); matches are relative to the workspace root, sorted, at most {MAX_GLOB_MATCHES}. Build, "
    "dependency and VCS directories (.git, node_modules, target, ...) are skipped."
)

_MAGIC = frozenset("*?[{\\")


def compile_glob(pattern: str, argument: str, *, fnmatch: bool = False) -> Any:
    """Compile a glob (``fnmatch``: a file-name pattern) for ``argument``; every failure is an argument error.

    wcmatch raises ``ValueError`` for a bad pattern, ``PatternLimitException`` when ``{a,b}`` groups expand
    to more than its limit of patterns, and a deeply nested pattern can exhaust Python's recursion limit.
    """
    try:
        if fnmatch:
            return wcfnmatch.compile(
                pattern, flags=wcfnmatch.DOTMATCH | wcfnmatch.BRACE, limit=GLOB_PATTERN_LIMIT
            )
        return wcglob.compile(pattern, flags=GLOB_FLAGS, limit=GLOB_PATTERN_LIMIT)
    except PatternLimitException:
        raise InvalidArgumentsError(
            f"argument '{argument}' expands to too many patterns (each {{a,b}} group multiplies them; the "
            f"limit is {GLOB_PATTERN_LIMIT}); use fewer brace groups"
        ) from None
    except RecursionError:
        raise InvalidArgumentsError(f"argument '{argument}' is nested too deeply to compile") from None
    except ValueError as exc:
        raise InvalidArgumentsError(f"argument '{argument}' is not a valid glob pattern: {exc}") from None


class GlobArgs(ToolArgs):
    """Arguments of glob."""

    pattern: GlobText = Field(min_length=1, description="Glob pattern, relative (no '..', not absolute).")
    path: PathText | None = Field(default=None, description="Directory to search in (default: the root).")


def glob(ws: Workspace, args: GlobArgs) -> dict[str, Any]:
    """Run glob (blocking)."""
    matches, truncated = glob_files(ws, args.pattern, args.path, limit=MAX_GLOB_MATCHES)
    return {"pattern": args.pattern, "matches": matches, "count": len(matches), "truncated": truncated}


def glob_files(ws: Workspace, pattern: str, path: str | None, *, limit: int | None) -> tuple[list[str], bool]:
    """Files under ``path`` matching ``pattern``, relative to the root: ``(matches, truncated)``.

    ``limit=None`` returns every match (used by the benchmark).
    """
    if "\0" in pattern:
        raise InvalidArgumentsError("argument 'pattern' contains a NUL byte")
    parts = [part for part in pattern.split("/") if part not in ("", ".")]
    if pattern.startswith("/") or ".." in parts:
        raise PathEscapeError(pattern)
    if not parts:
        raise InvalidArgumentsError("argument 'pattern' names no file; use e.g. '*' or '**/*.py'")
    matcher = compile_glob("/".join(parts), "pattern")
    # Leading literal components name the directory to start in; the walk then goes only as deep as the
    # rest of the pattern can reach.
    literal = 0
    while literal < len(parts) - 1 and not _MAGIC.intersection(parts[literal]):
        literal += 1
    prefix, rest = parts[:literal], parts[literal:]
    max_depth = None if any("**" in part for part in rest) else len(rest) - 1
    start = "/".join([path, *prefix]) if path else "/".join(prefix) or "."
    try:
        fd, info, start_rel = ws.open_entry(start)
    except PathNotFoundError:
        if not prefix:
            raise  # the given search path itself is missing: say so
        return [], False
    matches: list[str] = []
    try:
        if not stat.S_ISDIR(info.st_mode):
            return [], False
        top = "/".join(prefix)
        for _, _, rel, is_link in walk_files(fd, top, max_depth=max_depth):
            if not matcher.match(rel):
                continue
            below = rel[len(top) + 1 :] if top else rel
            root_rel = below if start_rel == "." else f"{start_rel}/{below}"
            if is_link and not ws.is_contained_file(root_rel):
                continue  # a symlink is listed only when it leads to a file inside the workspace
            if limit is not None and len(matches) >= limit:
                return matches, True
            matches.append(root_rel)
    finally:
        os.close(fd)
    return matches, False
