"""glob: files whose paths match a pattern (``**`` spans directories, ``*`` stays within one)."""

from __future__ import annotations

import os
import stat
from typing import Any

from pydantic import Field
from wcmatch import glob as wcglob

from devtools.errors import InvalidArgumentsError, PathEscapeError, PathNotFoundError
from devtools.tools._common import ToolArgs, walk_files
from devtools.workspace import Workspace

__all__ = ["DESCRIPTION", "GLOB_FLAGS", "MAX_GLOB_MATCHES", "GlobArgs", "glob", "glob_files"]

MAX_GLOB_MATCHES = 1000
"""Most paths one glob call returns."""

GLOB_FLAGS = wcglob.GLOBSTAR | wcglob.DOTMATCH | wcglob.BRACE
"""``**`` crosses directories, ``*`` also matches names starting with a dot, ``{a,b}`` alternates."""

DESCRIPTION = (
    "Find files whose path matches a glob pattern, e.g. `**/*.py` or `src/*.{rs,toml}`. `**` spans "
    "directories, `*` matches within one name. The pattern is relative to `path` (default: the workspace "
    f"root); matches are relative to the workspace root, sorted, at most {MAX_GLOB_MATCHES}. Build, "
    "dependency and VCS directories (.git, node_modules, target, ...) are skipped."
)

_MAGIC = frozenset("*?[{\\")


class GlobArgs(ToolArgs):
    """Arguments of glob."""

    pattern: str = Field(min_length=1, description="Glob pattern, relative (no '..', not absolute).")
    path: str | None = Field(default=None, description="Directory to search in (default: the root).")


def glob(ws: Workspace, args: GlobArgs) -> dict[str, Any]:
    """Run glob (blocking)."""
    matches, truncated = glob_files(ws, args.pattern, args.path, limit=MAX_GLOB_MATCHES)
    return {"pattern": args.pattern, "matches": matches, "count": len(matches), "truncated": truncated}


def glob_files(  # noqa: PLR0912 - validation, start directory, walk: one function reads best
    ws: Workspace, pattern: str, path: str | None, *, limit: int | None
) -> tuple[list[str], bool]:
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
    try:
        matcher = wcglob.compile("/".join(parts), flags=GLOB_FLAGS)
    except ValueError as exc:
        raise InvalidArgumentsError(f"argument 'pattern' is not a valid glob pattern: {exc}") from None
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
