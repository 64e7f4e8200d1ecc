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
    assert {"supervisor.py", "prelude.py", "setid_filter.py", "agent.c", "loader.c"} <= inside
    assert "agent.py" not in inside  # one agent: the C one (static_agent.py says why)


def test_the_checkers_cover_the_in_sandbox_programs() -> None:
    """ruff and mypy --strict read the programs shipped into sandboxes: nothing excludes ``inside/``."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    mypy, ruff = config["tool"]["mypy"], config["tool"]["ruff"]
    assert mypy["packages"] == ["adk_sandbox"] and "exclude" not in mypy
    assert "exclude" not in ruff and "extend-exclude" not in ruff
    # Style families that cannot fit a program run by python3 >= 3.6 with -I -S may be waived for it;
    # pyflakes, pycodestyle's errors and the annotation rules may not.
    ignored = ruff["lint"].get("per-file-ignores", {})
    for pattern, rules in ignored.items():
        if "channel" in pattern or "inside" in pattern:
            assert not {"F", "ANN", "W", "E"} & set(rules), (pattern, rules)
    # The programs are real Python files (no program source left in a string literal on the host side).
    assert {"supervisor.py", "prelude.py", "setid_filter.py"} <= {
        path.name for path in (CHANNEL / "inside").glob("*.py")
    }
