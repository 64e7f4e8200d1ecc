"""The workspace wing sits below the backends: nothing in ``executor/workspace/`` imports one.

Every module of the package is read with :mod:`ast` (no import runs): each ``import`` and ``from ...
import`` anywhere in it (at the top, in a function, under ``if TYPE_CHECKING``), relative ones resolved,
and each ``importlib.import_module``/``__import__`` of a literal name. None may reach docker-py
(``docker``), a backend (``adk_sandbox.executor.backends``) or the agent-facing layer
(``adk_sandbox.devtools``, which imports the wing): those import the wing, never the other way round.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

WING = Path(__file__).resolve().parents[2] / "executor" / "workspace"
WING_PACKAGE = "adk_sandbox.executor.workspace"
FORBIDDEN = ("docker", "adk_sandbox.executor.backends", "adk_sandbox.devtools")

# The one allowed arrow from the wing into a backend, for now. synced.py takes CommandTransport and
# PreparedCommand from Docker's _transport until another branch moves them to the engine-neutral
# adk_sandbox.executor.channel.transport; the import carries MERGE_MARK and is fixed at that merge, and
# then this exception goes too (test_the_temporary_exception_is_still_needed fails until it does).
MERGE_MARK = "# MERGE: channel.transport"
ALLOWED = {("synced.py", "adk_sandbox.executor.backends.docker._transport")}


@dataclass(frozen=True)
class Imported:
    """One module a source file imports: where (file, line), what, and whether the import carries the mark."""

    file: str
    line: int
    module: str
    marked: bool

    def __str__(self) -> str:
        return f"{self.file}:{self.line} imports {self.module}"


def imports_of(source: str, file: str, package: str) -> list[Imported]:
    """Every module ``source`` (the module ``file`` of ``package``) imports, wherever the import is."""
    lines = source.splitlines()
    found: list[Imported] = []

    def add(node: ast.stmt | ast.expr, module: str) -> None:
        first, last = node.lineno, node.end_lineno or node.lineno
        marked = any(MERGE_MARK in text for text in lines[first - 1 : last])
        found.append(Imported(file, first, module, marked))

    for node in ast.walk(ast.parse(source, file)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(node, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the package, one level up per dot past the first
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            add(node, module)
            if not is_forbidden(module):  # `from pkg import sub` imports pkg.sub when that is a module
                for alias in node.names:
                    add(node, f"{module}.{alias.name}")
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__"))
            )
        ):
            add(node, node.args[0].value)
    return found


def is_forbidden(module: str) -> bool:
    """Whether ``module`` is docker-py, a backend or devtools (or anything inside one)."""
    return any(module == name or module.startswith(name + ".") for name in FORBIDDEN)


def violations(wing: Path) -> tuple[list[Imported], list[Imported]]:
    """The forbidden imports of the package at ``wing``, and the allowed (marked) exceptions met."""
    bad: list[Imported] = []
    excused: list[Imported] = []
    for path in sorted(wing.rglob("*.py")):
        rel = path.relative_to(wing)
        package = ".".join([WING_PACKAGE, *rel.parent.parts])
        for imported in imports_of(path.read_text(encoding="utf-8"), rel.as_posix(), package):
            if not is_forbidden(imported.module):
                continue
            if (rel.as_posix(), imported.module) in ALLOWED and imported.marked:
                excused.append(imported)
            else:
                bad.append(imported)
    return sorted(bad, key=lambda i: (i.file, i.line)), excused


def test_the_wing_imports_no_backend_no_docker_and_no_devtools() -> None:
    assert (WING / "__init__.py").is_file(), WING
    bad, _ = violations(WING)
    assert bad == [], "the workspace wing must sit below the backends:\n" + "\n".join(map(str, bad))


def test_the_temporary_exception_is_still_needed() -> None:
    """Once synced.py imports the channel package, drop ALLOWED's entry (and this test)."""
    _, excused = violations(WING)
    assert {(imported.file, imported.module) for imported in excused} == ALLOWED


def forbidden_in(source: str) -> list[str]:
    return [i.module for i in imports_of(source, "x.py", WING_PACKAGE) if is_forbidden(i.module)]


@pytest.mark.parametrize(
    ("source", "module"),
    [
        ("import docker\n", "docker"),
        ("import docker.errors as errors\n", "docker.errors"),
        ("def f():\n    from docker.types import Mount\n", "docker.types"),
        ("class C:\n    def m(self):\n        import docker\n", "docker"),
        ("if TYPE_CHECKING:\n    import adk_sandbox.devtools\n", "adk_sandbox.devtools"),
        (
            "def f():\n    from adk_sandbox.devtools.workspace import Workspace\n",
            "adk_sandbox.devtools.workspace",
        ),
        ("from adk_sandbox.executor import backends\n", "adk_sandbox.executor.backends"),
        ("from ..backends.docker import _spec\n", "adk_sandbox.executor.backends.docker"),
        (
            "importlib.import_module('adk_sandbox.executor.backends.docker')\n",
            "adk_sandbox.executor.backends.docker",
        ),
    ],
)
def test_the_check_sees_every_kind_of_import(source: str, module: str) -> None:
    assert module in forbidden_in(source)


def test_the_check_passes_what_the_wing_may_import() -> None:
    source = (
        "import os\nfrom adk_sandbox.executor import _owner\n"
        "from adk_sandbox.executor.errors import ExecutorError\n"
        "from .scan import Entry\nfrom . import racy\nimport dockerfile_parse\n"
    )
    assert forbidden_in(source) == []


def test_the_exception_needs_its_module_its_file_and_the_mark(tmp_path: Path) -> None:
    module = "adk_sandbox.executor.backends.docker._transport"
    transport = f"from {module} import CommandTransport"
    (tmp_path / "synced.py").write_text(f"{transport}  {MERGE_MARK}\n")
    assert violations(tmp_path) == ([], [Imported("synced.py", 1, module, marked=True)])
    (tmp_path / "synced.py").write_text(f"{transport}\n")  # unmarked
    (tmp_path / "mirror.py").write_text(f"{transport}  {MERGE_MARK}\n")  # another file
    (tmp_path / "scan.py").write_text(f"import docker  {MERGE_MARK}\n")  # another module
    bad, excused = violations(tmp_path)
    assert excused == []
    assert sorted((i.file, i.module) for i in bad) == [
        ("mirror.py", module),
        ("scan.py", "docker"),
        ("synced.py", module),
    ]
