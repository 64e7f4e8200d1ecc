"""Formats, caps and errors of the file tools, and what DevToolset lists and refuses (real files)."""

from __future__ import annotations

import asyncio
import os
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from adk_sandbox.devtools import (
    AmbiguousMatchError,
    BashDisabledError,
    BinaryFileError,
    DevToolset,
    InvalidArgumentsError,
    NoMatchError,
    NotReadError,
    PathEscapeError,
    PathNotFoundError,
    PatternTimeoutError,
    ReadOnlyError,
    StaleReadError,
    UnknownToolError,
    Workspace,
)


def run(ws: Workspace, name: str, **args: Any) -> dict[str, Any]:
    return asyncio.run(DevToolset(ws).run(name, args))


@pytest.fixture
def ws(tmp_path: Path) -> Any:
    root = tmp_path / "ws"
    root.mkdir()
    with Workspace(root) as workspace:
        yield workspace


# -- read_file ---------------------------------------------------------------------------------------


def test_read_file_numbers_lines_with_offset_and_limit(ws: Workspace) -> None:
    (ws.root / "f.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    result = run(ws, "read_file", path="f.txt", offset=3, limit=2)
    assert result == {
        "path": "f.txt",
        "content": "     3\tline 3\n     4\tline 4\n",
        "total_lines": 10,
        "returned_lines": 2,
        "truncated": True,
    }
    whole = run(ws, "read_file", path="f.txt")
    assert whole["returned_lines"] == 10 and whole["truncated"] is False
    assert whole["content"].startswith("     1\tline 1\n")


def test_read_file_default_limit_is_2000_lines_and_total_is_real(ws: Workspace) -> None:
    (ws.root / "big.txt").write_text("x\n" * 2500)
    result = run(ws, "read_file", path="big.txt")
    assert result["returned_lines"] == 2000
    assert result["total_lines"] == 2500
    assert result["truncated"] is True
    assert result["content"].splitlines()[-1] == "  2000\tx"


def test_read_file_cuts_long_lines_at_2000_characters(ws: Workspace) -> None:
    (ws.root / "wide.txt").write_text("a" * 5000 + "\nshort\n")
    result = run(ws, "read_file", path="wide.txt")
    first, second = result["content"].split("\n")[:2]
    assert first == "     1\t" + "a" * 2000
    assert second == "     2\tshort"
    assert result["truncated"] is True


def test_read_file_empty_file_and_offset_past_the_end(ws: Workspace) -> None:
    (ws.root / "empty.txt").write_text("")
    assert run(ws, "read_file", path="empty.txt")["total_lines"] == 0
    (ws.root / "two.txt").write_text("a\nb")  # no final newline: still two lines
    result = run(ws, "read_file", path="two.txt", offset=5)
    assert result["content"] == "" and result["total_lines"] == 2 and result["returned_lines"] == 0


def test_read_file_refuses_binary_and_non_utf8(ws: Workspace) -> None:
    (ws.root / "bin").write_bytes(b"ELF\0\1\2" + b"text" * 100)
    with pytest.raises(BinaryFileError, match="binary"):
        run(ws, "read_file", path="bin")
    (ws.root / "latin1.txt").write_bytes("café\n".encode("latin-1"))
    with pytest.raises(BinaryFileError, match="UTF-8"):
        run(ws, "read_file", path="latin1.txt")


def test_read_file_missing_file(ws: Workspace) -> None:
    with pytest.raises(PathNotFoundError, match=r"path 'nope\.txt' does not exist"):
        run(ws, "read_file", path="nope.txt")


# -- write_file ----------------------------------------------------------------------------------------


def test_write_file_creates_parents_and_reports_bytes(ws: Workspace) -> None:
    result = run(ws, "write_file", path="a/b/c.txt", content="héllo\n")
    assert result["bytes_written"] == len("héllo\n".encode())
    assert result["path"] == "a/b/c.txt"
    assert (ws.root / "a/b/c.txt").read_text() == "héllo\n"
    assert not [p for p in (ws.root / "a/b").iterdir() if p.name.endswith(".tmp")]


def test_write_file_keeps_permission_bits_of_an_existing_file(ws: Workspace) -> None:
    script = ws.root / "run.sh"
    script.write_text("old")
    script.chmod(0o751)
    run(ws, "write_file", path="run.sh", content="new")
    assert script.read_text() == "new"
    assert script.stat().st_mode & 0o777 == 0o751


def test_write_file_marks_the_file_as_read(ws: Workspace) -> None:
    run(ws, "write_file", path="w.txt", content="alpha beta")
    result = run(ws, "edit_file", path="w.txt", old_string="alpha", new_string="gamma")
    assert result["replacements"] == 1
    assert (ws.root / "w.txt").read_text() == "gamma beta"


# -- edit_file -----------------------------------------------------------------------------------------


def test_edit_file_requires_a_read_first(ws: Workspace) -> None:
    (ws.root / "e.txt").write_text("one two")
    with pytest.raises(NotReadError) as info:
        run(ws, "edit_file", path="e.txt", old_string="one", new_string="1")
    assert str(info.value) == "file 'e.txt' must be read with read_file before it can be edited"
    assert (ws.root / "e.txt").read_text() == "one two"


def test_edit_file_no_match_and_ambiguous_leave_the_file_alone(ws: Workspace) -> None:
    (ws.root / "e.txt").write_text("x = 1\nx = 1\n")
    run(ws, "read_file", path="e.txt")
    with pytest.raises(NoMatchError) as no_match:
        run(ws, "edit_file", path="e.txt", old_string="X = 1", new_string="y")  # case-sensitive
    assert str(no_match.value) == "no occurrence of the target string was found in 'e.txt'"
    with pytest.raises(AmbiguousMatchError) as ambiguous:
        run(ws, "edit_file", path="e.txt", old_string="x = 1", new_string="y = 2")
    assert str(ambiguous.value) == (
        "the target string occurs 2 times in 'e.txt'; pass replace_all=true or provide a more specific string"
    )
    assert (ws.root / "e.txt").read_text() == "x = 1\nx = 1\n"


def test_edit_file_replace_all_counts_non_overlapping_matches(ws: Workspace) -> None:
    (ws.root / "e.txt").write_text("aaaa")
    run(ws, "read_file", path="e.txt")
    result = run(ws, "edit_file", path="e.txt", old_string="aa", new_string="b", replace_all=True)
    assert result["replacements"] == 2
    assert (ws.root / "e.txt").read_text() == "bb"


def test_edit_file_detects_a_change_on_disk_after_the_read(ws: Workspace) -> None:
    target = ws.root / "e.txt"
    target.write_text("original\n")
    run(ws, "read_file", path="e.txt")
    time.sleep(0.01)
    target.write_text("changed by someone else\n")
    with pytest.raises(StaleReadError, match="read it again"):
        run(ws, "edit_file", path="e.txt", old_string="changed", new_string="edited")
    assert target.read_text() == "changed by someone else\n"
    # Same size and content, new inode (replaced by a rename): still stale.
    run(ws, "read_file", path="e.txt")
    (ws.root / "other").write_text("changed by someone else\n")
    os.replace(ws.root / "other", target)
    with pytest.raises(StaleReadError):
        run(ws, "edit_file", path="e.txt", old_string="changed", new_string="edited")
    run(ws, "read_file", path="e.txt")
    assert run(ws, "edit_file", path="e.txt", old_string="changed", new_string="edited")["replacements"] == 1


def test_edit_file_is_atomic_rename_in_the_same_directory(ws: Workspace) -> None:
    target = ws.root / "e.txt"
    target.write_text("before\n")
    inode = target.stat().st_ino
    run(ws, "read_file", path="e.txt")
    run(ws, "edit_file", path="e.txt", old_string="before", new_string="after")
    assert target.read_text() == "after\n"
    assert target.stat().st_ino != inode  # a new file was renamed over the old one
    assert sorted(p.name for p in ws.root.iterdir()) == ["e.txt"]


def test_edit_file_through_an_inside_symlink_uses_the_read_of_its_target(ws: Workspace) -> None:
    (ws.root / "real.txt").write_text("v1\n")
    os.symlink("real.txt", ws.root / "alias.txt")
    run(ws, "read_file", path="real.txt")
    run(ws, "edit_file", path="alias.txt", old_string="v1", new_string="v2")
    assert (ws.root / "real.txt").read_text() == "v2\n"
    assert (ws.root / "alias.txt").is_symlink()


# -- glob ----------------------------------------------------------------------------------------------


def make_tree(root: Path, files: list[str]) -> None:
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"content of {name}\n")


def test_glob_double_star_spans_directories_single_star_does_not(ws: Workspace) -> None:
    make_tree(ws.root, ["a.py", "src/b.py", "src/deep/c.py", "src/d.txt", ".hidden/e.py"])
    assert run(ws, "glob", pattern="**/*.py")["matches"] == [
        ".hidden/e.py",
        "a.py",
        "src/b.py",
        "src/deep/c.py",
    ]
    assert run(ws, "glob", pattern="*.py")["matches"] == ["a.py"]
    assert run(ws, "glob", pattern="src/*.py")["matches"] == ["src/b.py"]
    assert run(ws, "glob", pattern="*.py", path="src")["matches"] == ["src/b.py"]
    assert run(ws, "glob", pattern="src/*.{py,txt}")["matches"] == ["src/b.py", "src/d.txt"]
    result = run(ws, "glob", pattern="**/*.rs")
    assert result == {"pattern": "**/*.rs", "matches": [], "count": 0, "truncated": False}


def test_glob_caps_at_1000(ws: Workspace) -> None:
    make_tree(ws.root, [f"many/f{i:04}.txt" for i in range(1100)])
    result = run(ws, "glob", pattern="**/*.txt")
    assert result["count"] == 1000 and len(result["matches"]) == 1000
    assert result["truncated"] is True


def test_glob_refuses_parent_and_absolute_patterns(ws: Workspace) -> None:
    for pattern in ("../*", "src/../../*", "/etc/*", f"{ws.root}/*"):
        with pytest.raises(PathEscapeError):
            run(ws, "glob", pattern=pattern)


def test_glob_skips_build_dirs_and_outside_symlinks(ws: Workspace, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    make_tree(outside, ["leak.py"])
    make_tree(ws.root, ["keep.py", "node_modules/x.py", ".git/y.py", "target/z.py", "__pycache__/w.py"])
    os.symlink(outside, ws.root / "outlink")
    os.symlink(outside / "leak.py", ws.root / "leak_link.py")
    os.symlink("keep.py", ws.root / "alias.py")
    assert run(ws, "glob", pattern="**/*.py")["matches"] == ["alias.py", "keep.py"]


# -- grep ----------------------------------------------------------------------------------------------


def test_grep_formats_matches_as_path_line_text(ws: Workspace) -> None:
    make_tree(ws.root, ["src/a.py", "b.txt"])
    (ws.root / "src/a.py").write_text("import os\n\ndef main():\n    return os.getcwd()\n")
    result = run(ws, "grep", pattern=r"os\.")
    assert result == {"pattern": r"os\.", "matches": ["src/a.py:4:     return os.getcwd()"], "count": 1,
                      "truncated": False}  # fmt: skip
    assert run(ws, "grep", pattern="IMPORT", case_insensitive=True)["matches"] == ["src/a.py:1: import os"]
    assert run(ws, "grep", pattern="content", glob="*.txt")["matches"] == ["b.txt:1: content of b.txt"]
    assert run(ws, "grep", pattern="def", path="src/a.py")["matches"] == ["src/a.py:3: def main():"]


def test_grep_caps_at_500(ws: Workspace) -> None:
    (ws.root / "many.txt").write_text("hit\n" * 600)
    result = run(ws, "grep", pattern="hit")
    assert result["count"] == 500 and result["truncated"] is True
    assert result["matches"][-1] == "many.txt:500: hit"


def test_grep_skips_binary_large_symlinked_and_build_files(ws: Workspace, tmp_path: Path) -> None:
    (ws.root / "ok.txt").write_text("needle\n")
    (ws.root / "bin.dat").write_bytes(b"\0needle\n")
    (ws.root / "huge.txt").write_bytes(b"needle\n" + b"x" * (5 * 1024 * 1024))
    make_tree(ws.root, ["node_modules/m.js", ".venv/v.py", "build/b.txt"])
    for name in ("node_modules/m.js", ".venv/v.py", "build/b.txt"):
        (ws.root / name).write_text("needle\n")
    (tmp_path / "secret").write_text("needle outside\n")
    os.symlink(tmp_path / "secret", ws.root / "link.txt")
    assert run(ws, "grep", pattern="needle")["matches"] == ["ok.txt:1: needle"]


def test_grep_stops_a_catastrophic_pattern_with_a_clear_error(ws: Workspace) -> None:
    (ws.root / "a.txt").write_text("a" * 40 + "b\n")
    started = time.monotonic()
    with pytest.raises(PatternTimeoutError, match="took longer than"):
        run(ws, "grep", pattern="(a|aa)+$")
    assert time.monotonic() - started < 15


def test_grep_invalid_regex_is_an_argument_error(ws: Workspace) -> None:
    with pytest.raises(InvalidArgumentsError, match="not a valid regular expression"):
        run(ws, "grep", pattern="(unclosed")


# -- DevToolset ----------------------------------------------------------------------------------------


def test_toolset_lists_tools_in_spec_order_with_schemas(ws: Workspace) -> None:
    tools = DevToolset(ws).tools
    assert [t.name for t in tools] == ["read_file", "glob", "grep", "write_file", "edit_file", "bash"]
    for tool in tools:
        assert tool.description
        assert tool.parameters["type"] == "object"
        assert tool.parameters["additionalProperties"] is False
    read = tools[0].parameters
    assert read["required"] == ["path"] and set(read["properties"]) == {"path", "offset", "limit"}


def test_read_only_workspace_lists_and_permits_only_reading_tools(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("keep\n")
    with Workspace.read_only(tmp_path) as ws:
        toolset = DevToolset(ws)
        assert [t.name for t in toolset.tools] == ["read_file", "glob", "grep"]
        asyncio.run(toolset.run("read_file", {"path": "f.txt"}))
        for name, args in (
            ("write_file", {"path": "f.txt", "content": "x"}),
            ("edit_file", {"path": "f.txt", "old_string": "keep", "new_string": "x"}),
        ):
            with pytest.raises(ReadOnlyError) as info:
                asyncio.run(toolset.run(name, args))
            assert str(info.value) == f"workspace is read-only; '{name}' is not permitted"
        with pytest.raises(BashDisabledError, match=r"^bash execution is disabled for this workspace$"):
            asyncio.run(toolset.run("bash", {"command": "touch made"}))
    assert (tmp_path / "f.txt").read_text() == "keep\n"
    assert not (tmp_path / "made").exists()


def test_bash_disabled_workspace_is_writable_without_bash(tmp_path: Path) -> None:
    with Workspace(tmp_path, allow_bash=False) as ws:
        toolset = DevToolset(ws)
        assert [t.name for t in toolset.tools] == ["read_file", "glob", "grep", "write_file", "edit_file"]
        with pytest.raises(BashDisabledError):
            asyncio.run(toolset.run("bash", {"command": "touch made"}))
    assert not (tmp_path / "made").exists()


def test_invalid_arguments_name_the_field_and_reason(ws: Workspace) -> None:
    toolset = DevToolset(ws)
    with pytest.raises(InvalidArgumentsError) as info:
        asyncio.run(toolset.run("read_file", {"path": "f", "limit": 0, "bogus": 1}))
    message = str(info.value)
    assert "argument 'limit'" in message and "greater than or equal to 1" in message
    assert "unknown argument 'bogus'" in message
    with pytest.raises(InvalidArgumentsError, match="missing required argument 'command'"):
        asyncio.run(toolset.run("bash", {}))
    with pytest.raises(InvalidArgumentsError, match="must be a JSON object"):
        asyncio.run(toolset.run("glob", ["*"]))  # type: ignore[arg-type]
    with pytest.raises(UnknownToolError, match="unknown tool 'rm'"):
        asyncio.run(toolset.run("rm", {}))


def test_grep_literal_patterns_find_non_ascii_text_and_respect_case(ws: Workspace) -> None:
    # Plain literals take a bytes prefilter; it must agree with the regex over decoded text.
    (ws.root / "menu.txt").write_text("Café au lait\ncafé noir\n")
    (ws.root / "bad.txt").write_bytes(b"caf\xe9 latin-1\n")
    assert run(ws, "grep", pattern="café")["matches"] == ["menu.txt:2: café noir"]
    assert run(ws, "grep", pattern="CAFÉ", case_insensitive=True)["matches"] == [
        "menu.txt:1: Café au lait",
        "menu.txt:2: café noir",
    ]
    assert run(ws, "grep", pattern="latin-1")["matches"] == ["bad.txt:1: caf\ufffd latin-1"]


def test_glob_and_grep_search_paths_are_contained(ws: Workspace, tmp_path: Path) -> None:
    (tmp_path / "outside.txt").write_text("needle\n")
    os.symlink(tmp_path, ws.root / "up")
    for path in ("..", "up", str(tmp_path)):
        with pytest.raises(PathEscapeError):
            run(ws, "glob", pattern="*.txt", path=path)
        with pytest.raises(PathEscapeError):
            run(ws, "grep", pattern="needle", path=path)
    with pytest.raises(PathNotFoundError):
        run(ws, "grep", pattern="needle", path="missing")


@pytest.mark.parametrize("size", [0, 1, 5, 1024 * 1024 - 1, 1024 * 1024, 1024 * 1024 + 3])
def test_read_file_streams_in_chunks_with_the_same_answer_as_a_whole_read(ws: Workspace, size: int) -> None:
    # Lines of varying length (some multi-byte) straddle the 1 MiB read chunks; compare with a simple model.
    pieces, total = [], 0
    i = 0
    while total < size:
        piece = ("é" * (i % 7)) + "x" * (i % 300) + ("\n" if i % 11 else "")
        pieces.append(piece)
        total += len(piece.encode())
        i += 1
    text = "".join(pieces)
    (ws.root / "s.txt").write_text(text)
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    for offset, limit in ((1, 2000), (max(1, len(lines) - 3), 10), (len(lines) // 2 + 1, 5)):
        result = run(ws, "read_file", path="s.txt", offset=offset, limit=limit)
        window = lines[offset - 1 : offset - 1 + limit]
        assert result["total_lines"] == len(lines)
        assert result["content"] == "".join(
            f"{n:>6}\t{line[:2000]}\n" for n, line in enumerate(window, offset)
        )


def test_read_file_of_a_huge_file_keeps_memory_flat(ws: Workspace) -> None:
    with open(ws.root / "huge.log", "wb") as handle:
        for _ in range(64):
            handle.write(b"log line\n" * (1024 * 1024 // 9))  # ~64 MiB, ~7.4 million lines
    tracemalloc.start()
    try:
        result = run(ws, "read_file", path="huge.log", offset=3, limit=2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result["content"] == "     3\tlog line\n     4\tlog line\n"
    assert result["total_lines"] == 64 * (1024 * 1024 // 9)
    assert peak < 16 * 1024 * 1024


def test_read_file_reports_invalid_utf8_late_in_a_large_file(ws: Workspace) -> None:
    (ws.root / "late.txt").write_bytes(b"ok\n" * 500_000 + b"\xff\n")
    with pytest.raises(BinaryFileError, match="offset 1500000"):
        run(ws, "read_file", path="late.txt")
