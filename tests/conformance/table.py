"""The capability table's columns of this repository's conformance targets (docs/CAPABILITIES.md)."""

from __future__ import annotations

from pathlib import Path

from adk_sandbox.executor.testing.capability_table import TableColumn

PAGE = Path(__file__).resolve().parents[2] / "docs" / "CAPABILITIES.md"


def column(name: str) -> TableColumn:
    """The column ``name`` of docs/CAPABILITIES.md."""
    return TableColumn(PAGE, name)
