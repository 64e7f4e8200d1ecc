"""Property: ``Workspace.resolve`` agrees with a simple reference model on random trees.

The model is ``os.path.realpath(strict=True)`` plus a prefix check: a path whose real location is inside
the root must resolve to exactly that location; one whose real location is outside must raise
``PathEscapeError``; one the model cannot resolve (dangling, loop, through a file) must raise a tool
error, unless it names a not-yet-existing entry in an existing directory inside (a file a write would
create). Link targets never leave the root and come back, the one case where the kernel's
RESOLVE_BENEATH (and this library) is deliberately stricter than realpath.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adk_sandbox.devtools import PathEscapeError, ToolError
from tests.unit.devtools_helpers import RESOLVERS, make_workspace

DIRS = ["a", "b", "a/c", "b/d"]
NAMES = ["a", "b", "c", "d", "f", "g", "l1", "l2", "l3", "x"]
ROOT_TOKEN, OUT_TOKEN = "<root>", "<out>"
TARGETS = [
    "a", "b", "f", "a/c", "a/f", "x", "l1", "l2", "l3", ".", "..", "../f", "../a",
    "../../outside/f", "../../outside", f"{OUT_TOKEN}/f", OUT_TOKEN, f"{ROOT_TOKEN}/a",
    f"{ROOT_TOKEN}/f", ROOT_TOKEN, "/etc", "nope", "a/nope/f",
]  # fmt: skip

tree_strategy = st.fixed_dictionaries(
    {
        "dirs": st.lists(st.sampled_from(DIRS), unique=True),
        "files": st.lists(st.tuples(st.sampled_from(["", *DIRS]), st.sampled_from(["f", "g"])), max_size=6),
        "links": st.lists(
            st.tuples(
                st.sampled_from(["", *DIRS]), st.sampled_from(["l1", "l2", "l3"]), st.sampled_from(TARGETS)
            ),
            max_size=6,
        ),
    }
)
query_strategy = st.lists(st.lists(st.sampled_from(NAMES), min_size=1, max_size=4), min_size=1, max_size=8)


def build(base: Path, tree: dict[str, list]) -> Path:  # type: ignore[type-arg]
    root, outside = base / "ws", base / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "f").write_text("outside")
    for directory in sorted(tree["dirs"]):
        (root / directory).mkdir(parents=True, exist_ok=True)
    for parent, name in tree["files"]:
        if (root / parent).is_dir() and not os.path.lexists(root / parent / name):
            (root / parent / name).write_text("x")
    for parent, name, template in tree["links"]:
        target = template.replace(ROOT_TOKEN, str(root)).replace(OUT_TOKEN, str(outside))
        if (root / parent).is_dir() and not os.path.lexists(root / parent / name):
            os.symlink(target, root / parent / name)
    return root


def model(root: Path, query: str) -> str:
    try:
        real = os.path.realpath(root / query, strict=True)
    except OSError:
        return "error"
    if real == str(root) or real.startswith(f"{root}/"):
        return real
    return "escape"


@pytest.mark.parametrize("resolver", RESOLVERS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=tree_strategy, queries=query_strategy)
def test_resolve_matches_realpath_model(
    resolver: str, tree: dict[str, list], queries: list[list[str]]
) -> None:  # type: ignore[type-arg]
    base = Path(tempfile.mkdtemp(prefix="prop"))
    try:
        root = build(base, tree)
        with make_workspace(root, resolver) as ws:
            for parts in queries:
                query = "/".join(parts)
                expected = model(root, query)
                try:
                    got: str = str(ws.resolve(query))
                except PathEscapeError:
                    got = "escape"
                except ToolError:
                    got = "error"
                if expected == "error" and got not in ("error", "escape"):
                    # Allowed: names that do not exist yet, below a real directory inside the root.
                    assert not os.path.lexists(got), (query, got)
                    existing = os.path.dirname(got)
                    while not os.path.lexists(existing):
                        existing = os.path.dirname(existing)
                    assert os.path.realpath(existing, strict=True) == existing, (query, got)
                    assert os.path.isdir(existing), (query, got)
                    assert existing == str(root) or existing.startswith(f"{root}/"), (query, got)
                elif expected == "error":
                    continue
                else:
                    assert got == expected, (query, expected, got)
    finally:
        shutil.rmtree(base)
