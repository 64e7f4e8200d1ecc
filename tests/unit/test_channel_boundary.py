"""The agent channel ships its in-sandbox programs as package files (its imports: test_layering.py)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHANNEL = ROOT / "src" / "adk_sandbox" / "executor" / "channel"


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
    assert {"agent.c", "loader.c"} <= inside
    # One agent, the C one (static_agent.py says why); no Python program is shipped in (the exec
    # transport's supervisor was removed: docs/docker/agent-channel.md, "One agent, one way in").
    assert {name for name in inside if name.endswith(".py")} == {"__init__.py"}


def test_the_checkers_cover_the_in_sandbox_programs() -> None:
    """ruff and mypy --strict read the whole channel: nothing excludes ``inside/``."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    mypy, ruff = config["tool"]["mypy"], config["tool"]["ruff"]
    assert mypy["packages"] == ["adk_sandbox"] and "exclude" not in mypy
    assert "exclude" not in ruff and "extend-exclude" not in ruff
    # pyflakes, pycodestyle's errors and the annotation rules are never waived for the channel.
    ignored = ruff["lint"].get("per-file-ignores", {})
    for pattern, rules in ignored.items():
        if "channel" in pattern or "inside" in pattern:
            assert not {"F", "ANN", "W", "E"} & set(rules), (pattern, rules)
