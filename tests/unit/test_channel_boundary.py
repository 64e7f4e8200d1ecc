"""The agent channel is engine-neutral: no module of executor/channel imports docker-py or a backend."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CHANNEL = Path(__file__).resolve().parents[2] / "executor" / "channel"


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module or "")
    return names


@pytest.mark.parametrize("path", sorted(CHANNEL.rglob("*.py")), ids=lambda p: str(p.relative_to(CHANNEL)))
def test_a_channel_module_imports_no_engine_and_no_backend(path: Path) -> None:
    forbidden = [
        name
        for name in _imported(path)
        if name == "docker" or name.startswith(("docker.", "adk_sandbox.executor.backends"))
    ]
    assert forbidden == []


def test_the_in_sandbox_programs_and_the_c_agent_are_package_files() -> None:
    inside = {path.name for path in (CHANNEL / "inside").iterdir()}
    assert {"agent.py", "supervisor.py", "prelude.py", "setid_filter.py", "agent.c", "loader.c"} <= inside
