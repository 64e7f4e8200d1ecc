"""The capability table's page (executor/testing/capability_table.py): written, read back, compared."""

from __future__ import annotations

from pathlib import Path

import pytest

from adk_sandbox.executor.testing.capability_table import (
    FUTURE_ROWS,
    NOT_YET,
    ROWS,
    WRITE_VARIABLE,
    TableColumn,
    differences,
    parse_table,
    render_table,
    write_column,
    writing,
)

PAGE = Path(__file__).resolve().parents[2] / "docs" / "CAPABILITIES.md"


def test_a_page_reads_back_as_written() -> None:
    columns = {
        "one": {"exec": "✅", "files": "no: a reason | with a bar\nover two lines", "pty": NOT_YET},
        "two": {"exec": "✅", "files": "no: a reason | with a bar over two lines"},
    }
    page = render_table(columns)
    assert page.count("a reason") == 1  # one numbered reason for both cells
    read = parse_table(page)
    assert list(read) == ["one", "two"]
    assert read["one"]["files"] == read["two"]["files"] == "no: a reason | with a bar over two lines"
    assert read["two"]["pty"] == "not checked"
    assert list(read["one"]) == list(ROWS)


def test_a_column_is_compared_only_on_the_rows_found(tmp_path: Path) -> None:
    column = TableColumn(tmp_path / "CAPABILITIES.md", "engine")
    assert differences(column, {"exec": "✅"}) == [f"{column.path} has no column 'engine'"]
    write_column(column, {"exec": "✅", "files": "no: none here"})
    write_column(TableColumn(column.path, "other"), {"exec": "✅"})
    assert differences(column, {"files": "no: none  here"}) == []  # whitespace as the page keeps it
    assert differences(column, {"exec": "no: refused"}) == [
        "exec: the table says '✅', the suite found 'no: refused'"
    ]
    write_column(column, {"exec": "no: refused"})
    assert parse_table(column.path.read_text())["engine"]["files"] == "no: none here"  # kept
    assert list(parse_table(column.path.read_text())) == ["engine", "other"]


def test_writing_is_asked_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WRITE_VARIABLE, raising=False)
    assert not writing()
    monkeypatch.setenv(WRITE_VARIABLE, "1")
    assert writing()


def test_the_committed_page_is_one_the_generator_writes() -> None:
    """docs/CAPABILITIES.md is as render_table writes its own columns (no hand edits, every row there)."""
    text = PAGE.read_text(encoding="utf-8")
    assert render_table(parse_table(text)) == text
    for cells in parse_table(text).values():
        assert "not checked" not in cells.values()
        assert [cells[row] for row in FUTURE_ROWS] == [NOT_YET] * len(FUTURE_ROWS)
