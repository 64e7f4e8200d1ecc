"""The agent channel ships its in-sandbox programs as package files (its imports: test_layering.py)."""

from __future__ import annotations

import ast
from pathlib import Path

CHANNEL = Path(__file__).resolve().parents[2] / "executor" / "channel"


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module or "")
    return names


def test_the_in_sandbox_programs_and_the_c_agent_are_package_files() -> None:
    inside = {path.name for path in (CHANNEL / "inside").iterdir()}
    assert {"agent.py", "supervisor.py", "prelude.py", "setid_filter.py", "agent.c", "loader.c"} <= inside
