"""What the file tools refuse, and that a refusal changes nothing: real files, both resolvers.

* Patterns that cannot be compiled (nested too deep, too many brace expansions) are argument errors.
* A path whose ``..`` climbs above the root, counted on its text, is an escape whatever exists on the way,
  and a refused write creates no directory (nor leaves one behind when the walk refuses later).
* Lone surrogates are refused alike; ``file/`` is "not a directory", as the kernel says.
* Fuzzed: the tools' entry point raises nothing but ``ToolError``s, and nothing outside the root changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adk_sandbox.devtools import (
    DevToolset,
    InvalidArgumentsError,
    InvalidPathError,
    NotRegularFileError,
    PathEscapeError,
    PathNotFoundError,
    ToolError,
    Workspace,
)
from tests.unit.devtools_helpers import RESOLVERS, make_workspace


def run(ws: Workspace, tool: str, /, **args: Any) -> dict[str, Any]:
    # Positional-only: a generated argument called "name" or "ws" must reach the tool, not this helper.
    return asyncio.run(DevToolset(ws).run(tool, args))


def snapshot(top: Path) -> dict[str, tuple[str, bytes | str | None]]:
    """Every entry below ``top`` (names as bytes-safe strings): its kind and content or link target."""
    entries: dict[str, tuple[str, bytes | str | None]] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            rel = os.fsencode(path.relative_to(top)).hex()
            if path.is_symlink():
                entries[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                entries[rel] = ("dir", None)
            else:
                entries[rel] = ("file", path.read_bytes())
    return entries


@pytest.fixture(params=RESOLVERS)
def layout(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Workspace, Path]]:
    """``tmp/ws`` (the root: real.txt, sub/, alias -> real.txt, esc -> ../outside) and ``tmp/outside``."""
    root, outside = tmp_path / "ws", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("secret\n")
    (root / "real.txt").write_text("real\n")
    (root / "sub").mkdir()
    (root / "alias").symlink_to("real.txt")
    (root / "esc").symlink_to(outside)
    with make_workspace(root, request.param) as ws:
        yield ws, tmp_path


# -- 1. patterns that cannot be compiled -----------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "args", "needle"),
    [
        ("grep", {"pattern": "(" * 5000 + ")" * 5000}, "nested too deeply"),
        ("grep", {"pattern": "(?:" * 3000 + "a" + ")" * 3000}, "nested too deeply"),
        ("glob", {"pattern": "{a,b}" * 30}, "too many patterns"),
        ("glob", {"pattern": "src/" + "{a,b}" * 11}, "too many patterns"),
        ("grep", {"pattern": "x", "glob": "{a,b}" * 30}, "too many patterns"),
        ("grep", {"pattern": "x", "glob": "src/" + "{a,b}" * 30}, "too many patterns"),
    ],
)
def test_patterns_that_cannot_be_compiled_are_argument_errors(
    layout: tuple[Workspace, Path], tool: str, args: dict[str, Any], needle: str
) -> None:
    ws, _ = layout
    with pytest.raises(InvalidArgumentsError, match=needle):
        run(ws, tool, **args)


def test_a_glob_expanding_to_the_limit_still_works(layout: tuple[Workspace, Path]) -> None:
    ws, _ = layout
    assert run(ws, "glob", pattern="{real,x}.{txt,md}")["matches"] == ["real.txt"]


# -- 2. lexical escapes, and writes that change nothing when refused --------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "a/../../outside/new.txt",
        "a/b/../../../x",
        "a/b/../../../outside/new.txt",
        "sub/../../outside/new.txt",
        "./a/./../../x",
        "{root}/a/../../outside/new.txt",
    ],
)
def test_a_lexically_escaping_write_is_refused_before_creating_anything(
    layout: tuple[Workspace, Path], path: str
) -> None:
    ws, top = layout
    before = snapshot(top)
    with pytest.raises(PathEscapeError, match="escapes the workspace root"):
        run(ws, "write_file", path=path.format(root=ws.root), content="x")
    assert snapshot(top) == before


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("new/../esc/new.txt", PathEscapeError),  # the walk refuses the link after creating 'new'
        ("new/deeper/../../esc/x", PathEscapeError),
        ("new/../sub", NotRegularFileError),  # resolves to a directory
        ("new/../alias/x", PathNotFoundError),  # through a file
        ("new/x/", InvalidPathError),  # a name ending with '/' is not a file
    ],
)
def test_a_write_refused_after_the_walk_created_directories_removes_them(
    layout: tuple[Workspace, Path], path: str, error: type[ToolError]
) -> None:
    ws, top = layout
    before = snapshot(top)
    with pytest.raises(error):
        run(ws, "write_file", path=path, content="x")
    assert snapshot(top) == before


def test_a_successful_write_still_creates_its_parents(layout: tuple[Workspace, Path]) -> None:
    ws, _ = layout
    run(ws, "write_file", path="new/deeper/../file.txt", content="x")
    assert (ws.root / "new" / "file.txt").read_text() == "x"
    assert (ws.root / "new" / "deeper").is_dir()  # mkdir -p semantics: it was on the way


@pytest.mark.parametrize("missing", ["a", "a/b", "sub/missing"])
def test_a_lexical_escape_through_missing_directories_is_an_escape_not_a_missing_file(
    layout: tuple[Workspace, Path], missing: str
) -> None:
    ws, top = layout
    depth = missing.count("/") + 2
    path = f"{missing}/{'../' * depth}outside/secret.txt"
    before = snapshot(top)
    with pytest.raises(PathEscapeError):
        run(ws, "read_file", path=path)
    (ws.root / "real.txt").write_text("real\n")
    with pytest.raises(PathEscapeError):
        run(ws, "edit_file", path=path, old_string="secret", new_string="x")
    with pytest.raises(PathEscapeError):
        run(ws, "glob", pattern="*", path=f"{missing}/{'../' * depth}outside")
    with pytest.raises(PathEscapeError):
        run(ws, "grep", pattern="secret", path=f"{missing}/{'../' * depth}outside")
    with pytest.raises(PathEscapeError):
        ws.resolve(path)
    assert snapshot(top) == before


def test_dotdot_that_stays_inside_still_works(layout: tuple[Workspace, Path]) -> None:
    ws, _ = layout
    assert run(ws, "read_file", path="sub/../real.txt")["content"] == "     1\treal\n"
    assert run(ws, "glob", pattern="*.txt", path="sub/..")["matches"] == ["real.txt"]


# -- 3. lone surrogates and trailing slashes ---------------------------------------------------------


@pytest.mark.parametrize("name", ["\udcff.txt", "\ud800.txt", "dir/\udc80", "\udcff/x.txt"])
def test_every_lone_surrogate_is_refused_alike(layout: tuple[Workspace, Path], name: str) -> None:
    ws, top = layout
    before = snapshot(top)
    for tool, args in [
        ("write_file", {"content": "x"}),
        ("read_file", {}),
        ("edit_file", {"old_string": "a", "new_string": "b"}),
    ]:
        with pytest.raises(InvalidPathError, match=r"is not valid Unicode \(a lone surrogate\)"):
            run(ws, tool, path=name, **args)
    assert snapshot(top) == before


@pytest.mark.parametrize(
    "path", ["real.txt/", "real.txt/.", "alias/", "sub/../real.txt/", "{root}/real.txt/"]
)
def test_a_file_named_with_a_trailing_slash_is_not_a_directory(
    layout: tuple[Workspace, Path], path: str
) -> None:
    ws, top = layout
    path = path.format(root=ws.root)
    before = snapshot(top)
    for tool, args in [
        ("read_file", {}),
        ("write_file", {"content": "changed"}),
        ("edit_file", {"old_string": "real", "new_string": "changed"}),
    ]:
        if tool == "edit_file":
            run(ws, "read_file", path="real.txt")
        with pytest.raises(InvalidPathError, match="names a file, not a directory"):
            run(ws, tool, path=path, **args)
    with pytest.raises(InvalidPathError, match="names a file, not a directory"):
        run(ws, "grep", pattern="real", path=path)
    with pytest.raises(InvalidPathError, match="names a file, not a directory"):
        ws.resolve(path)
    assert snapshot(top) == before


def test_a_directory_with_a_trailing_slash_is_still_a_directory(layout: tuple[Workspace, Path]) -> None:
    ws, _ = layout
    (ws.root / "sub" / "f.txt").write_text("hit\n")
    with pytest.raises(NotRegularFileError, match="is a directory"):
        run(ws, "read_file", path="sub/")
    assert run(ws, "glob", pattern="*", path="sub/")["matches"] == ["sub/f.txt"]
    assert run(ws, "grep", pattern="hit", path="sub/")["matches"] == ["sub/f.txt:1: hit"]
    assert ws.resolve("sub/") == ws.root / "sub"
    with pytest.raises(PathNotFoundError):
        run(ws, "read_file", path="missing/")


# -- fuzzing -------------------------------------------------------------------------------------------

SEGMENTS = st.sampled_from(
    ["..", ".", "", "a", "sub", "real.txt", "alias", "esc", "new", "\udcff", "\ud800", "~"]
)
PATHS = st.one_of(
    st.lists(SEGMENTS, max_size=6).map("/".join),
    st.lists(SEGMENTS, max_size=6).map(lambda parts: "/" + "/".join(parts)),
    st.text(max_size=30),
)
PATTERNS = st.one_of(
    st.text(alphabet=string.printable, max_size=40),
    st.builds(lambda unit, count: unit * count, st.sampled_from(["(", "{a,b}", "[", "(?:", "{", "**/", "\\"]),
              st.integers(min_value=0, max_value=6000)),
    st.builds(lambda depth: "(" * depth + ")" * depth, st.integers(min_value=0, max_value=6000)),
)  # fmt: skip
CALLS = st.one_of(
    st.builds(lambda p: ("read_file", {"path": p}), PATHS),
    st.builds(lambda p, c: ("write_file", {"path": p, "content": c}), PATHS, st.text(max_size=10)),
    st.builds(lambda p: ("edit_file", {"path": p, "old_string": "real", "new_string": "x"}), PATHS),
    st.builds(lambda pat, p: ("glob", {"pattern": pat, "path": p}), PATTERNS, st.none() | PATHS),
    st.builds(lambda pat, g: ("grep", {"pattern": pat, "glob": g}), PATTERNS, st.none() | PATTERNS),
    st.builds(lambda p: ("grep", {"pattern": "real", "path": p}), PATHS),
    st.builds(lambda name, args: (name, args), st.sampled_from(["read_file", "glob", "grep", "write_file"]),
              st.dictionaries(st.text(max_size=8), st.none() | st.integers() | st.text(max_size=8),
                              max_size=3)),
)  # fmt: skip


@settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(call=CALLS)
def test_the_tools_raise_only_tool_errors_and_never_touch_the_outside(
    layout: tuple[Workspace, Path], call: tuple[str, dict[str, Any]]
) -> None:
    ws, top = layout
    outside = snapshot(top / "outside")
    name, args = call
    if name == "edit_file":
        # An earlier example may have written binary content there: then edit_file says it was not read.
        with contextlib.suppress(ToolError):
            run(ws, "read_file", path="real.txt")
    try:
        result = run(ws, name, **args)
    except ToolError as exc:
        assert str(exc)
    else:
        assert isinstance(result, dict)
    assert snapshot(top / "outside") == outside
    for entry in ws.root.rglob("*"):
        assert os.fsencode(entry.name).decode("utf-8")  # no non-UTF-8 name was created
