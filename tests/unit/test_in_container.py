"""The supervisor run inside a container gets its prelude once: it compiles, no name is defined twice."""

from __future__ import annotations

import ast
import collections

import pytest

from adk_sandbox.executor.channel import supervisor as _supervisor
from adk_sandbox.executor.channel.programs import PRELUDE_LINE, in_container_program


@pytest.mark.parametrize("source", [_supervisor.SCRIPT], ids=["supervisor"])
def test_each_program_has_the_prelude_once_and_compiles(source: str) -> None:
    tree = ast.parse(source)
    names = [node.name for node in tree.body if isinstance(node, ast.FunctionDef)]
    assert [name for name, count in collections.Counter(names).items() if count > 1] == []
    for shared in ("install_setid_filter", "scan", "send", "below", "kill_all", "marker_of"):
        assert shared in names
    assert PRELUDE_LINE not in source


def test_a_program_without_a_prelude_line_is_refused() -> None:
    with pytest.raises(ValueError, match="prelude"):
        in_container_program("print('no prelude')\n")


@pytest.mark.parametrize("source", [_supervisor.SCRIPT], ids=["supervisor"])
def test_the_checker_only_lines_are_not_shipped(source: str) -> None:
    """inside/*.py import the prelude's names for mypy only: nothing of this package runs inside."""
    tree = ast.parse(source)
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not [name for name in imported if name.startswith(("adk_sandbox", "typing", "collections"))]
    assert "@CHECK-ONLY@" not in source and "@END-CHECK-ONLY@" not in source


@pytest.mark.parametrize("source", [_supervisor.SCRIPT], ids=["supervisor"])
def test_the_programs_keep_to_python_3_6_syntax(source: str) -> None:
    """Old images' python3: string annotations only, no syntax newer than 3.6, no ``__future__`` import."""
    tree = ast.parse(source, feature_version=(3, 6))
    modules = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert "__future__" not in modules
