"""The house's layers, read from the source with :mod:`ast` (no import runs).

* The engine-neutral packages sit **below the backends**: nothing in ``executor/channel/`` (the agent
  channel) or ``executor/workspace/`` (the workspace wing) imports docker-py, a backend, or the
  agent-facing layer (``adk_sandbox.devtools``, which imports them).
* **No backend reaches into another's private modules**: a module under ``executor/backends/<a>/`` never
  imports ``adk_sandbox.executor.backends.<b>._<name>``; what two engines share lives below them.
* **No import circle** among the project's modules, counting imports inside functions too (only
  ``if TYPE_CHECKING:`` blocks, which never run, are left out).

Every ``import`` and ``from ... import`` is seen, wherever it is (relative ones resolved, ``from pkg
import sub`` counted as importing ``pkg.sub``), and each ``importlib.import_module``/``__import__`` of a
literal name. The old layout broke all three rules (Kubernetes imported seven of Docker's private modules;
``executor/backend.py`` -> ``docker/backend.py`` -> ... -> ``files.py`` -> back was a circle; the mirror
climbed into ``devtools._beneath``); the checker's own tests below show it sees each kind of import.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "src" / "adk_sandbox"  # the package, no links
PACKAGE_DIRS = ("executor", "devtools")
BELOW_THE_BACKENDS = ("executor/channel", "executor/workspace", "executor/network")
FORBIDDEN_BELOW = ("docker", "adk_sandbox.executor.backends", "adk_sandbox.devtools")
BACKENDS = "adk_sandbox.executor.backends"


@dataclass(frozen=True)
class Imported:
    """One module a source file imports: where (file, line) and what."""

    file: str
    line: int
    module: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} imports {self.module}"


def module_name(path: Path) -> str:
    """The import name of a file of the project (``executor/a/b.py`` -> ``adk_sandbox.executor.a.b``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["adk_sandbox", *parts])


def _type_checking_only(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(source: str, file: str, module: str, *, is_package: bool = False) -> list[Imported]:
    """Every module ``source`` (the module ``module``) imports, wherever the import is.

    ``if TYPE_CHECKING:`` blocks are walked too: they are part of what a module may *name*; the circle
    check leaves them out separately (see :func:`runtime_imports_of`).
    """
    return _imports(ast.parse(source, file), file, module, is_package=is_package, skip_type_checking=False)


def runtime_imports_of(source: str, file: str, module: str, *, is_package: bool = False) -> list[Imported]:
    """The imports that can run: all of :func:`imports_of` but those under ``if TYPE_CHECKING:``."""
    return _imports(ast.parse(source, file), file, module, is_package=is_package, skip_type_checking=True)


def _imports(
    tree: ast.AST, file: str, module: str, *, is_package: bool, skip_type_checking: bool
) -> list[Imported]:
    package = module if is_package else module.rpartition(".")[0]
    found: list[Imported] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if skip_type_checking and _type_checking_only(node):
            assert isinstance(node, ast.If)
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            found += [Imported(file, node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the package, one level up per dot past the first
                parts = package.split(".")
                base = ".".join(
                    [*parts[: len(parts) - (node.level - 1)], *([node.module] if node.module else [])]
                )
            else:
                base = node.module or ""
            found.append(Imported(file, node.lineno, base))
            # `from pkg import sub` imports pkg.sub when sub is a module (a name that is not one is harmless).
            found += [Imported(file, node.lineno, f"{base}.{alias.name}") for alias in node.names]
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
            found.append(Imported(file, node.lineno, node.args[0].value))
    return sorted(found, key=lambda i: (i.line, i.module))


def project_files() -> dict[str, Path]:
    """Every module of the project by import name."""
    return {module_name(p): p for d in PACKAGE_DIRS for p in sorted((ROOT / d).rglob("*.py"))}


def _within(module: str, name: str) -> bool:
    return module == name or module.startswith(name + ".")


def below_the_backends_violations(files: dict[str, Path]) -> list[Imported]:
    """Imports of docker-py, a backend or devtools from the engine-neutral packages."""
    bad = []
    for name, path in files.items():
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith(tuple(d + "/" for d in BELOW_THE_BACKENDS)):
            continue
        for imported in imports_of(path.read_text(), rel, name, is_package=path.name == "__init__.py"):
            if any(_within(imported.module, forbidden) for forbidden in FORBIDDEN_BELOW):
                bad.append(imported)
    return bad


def backend_of(module: str) -> str | None:
    """``docker`` for ``adk_sandbox.executor.backends.docker.x``; None outside a backend package."""
    if not module.startswith(BACKENDS + "."):
        return None
    return module[len(BACKENDS) + 1 :].split(".", maxsplit=1)[0]


def private_of_another_backend(importer: str, imported: str) -> bool:
    """Whether ``importer`` (a module) importing ``imported`` reaches into another backend's privates."""
    mine, theirs = backend_of(importer), backend_of(imported)
    if mine is None or theirs is None or theirs == mine:
        return False
    inner = imported[len(BACKENDS) + 1 :].split(".")[1:]
    return any(part.startswith("_") and part != "__init__" for part in inner)


def cross_backend_violations(files: dict[str, Path]) -> list[Imported]:
    """Imports of another backend's private modules, from anywhere under ``executor/backends``."""
    bad = []
    for name, path in files.items():
        if backend_of(name) is None:
            continue
        rel = path.relative_to(ROOT).as_posix()
        for imported in imports_of(path.read_text(), rel, name, is_package=path.name == "__init__.py"):
            if private_of_another_backend(name, imported.module):
                bad.append(imported)
    return bad


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it may import at run time (importing ``a.b.c`` also runs ``a.b``)."""
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        rel = path.relative_to(ROOT).as_posix()
        targets: set[str] = set()
        for imported in runtime_imports_of(
            path.read_text(), rel, name, is_package=path.name == "__init__.py"
        ):
            parts = imported.module.split(".")
            for i in range(2, len(parts) + 1):
                target = ".".join(parts[:i])
                # Importing one's own ancestor package is no circle: it is already being imported.
                if target in files and target != name and not name.startswith(target + "."):
                    targets.add(target)
        graph[name] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


# -- the rules, on the project --------------------------------------------------------------------------
def test_the_channel_and_the_workspace_wing_import_no_engine_no_backend_no_devtools() -> None:
    files = project_files()
    for below in BELOW_THE_BACKENDS:
        assert module_name(ROOT / below / "__init__.py") in files, below
    bad = below_the_backends_violations(files)
    assert bad == [], "the engine-neutral packages must sit below the backends:\n" + "\n".join(map(str, bad))


def test_no_backend_imports_a_private_module_of_another() -> None:
    bad = cross_backend_violations(project_files())
    assert bad == [], "share it from below the backends instead:\n" + "\n".join(map(str, bad))


def test_there_is_no_import_circle() -> None:
    assert circles(import_graph(project_files())) == []


# -- the checker sees what it must ----------------------------------------------------------------------
def forbidden_in(source: str) -> list[str]:
    module = "adk_sandbox.executor.workspace.x"
    return [
        i.module
        for i in imports_of(source, "x.py", module)
        if any(_within(i.module, forbidden) for forbidden in FORBIDDEN_BELOW)
    ]


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


def test_the_check_passes_what_the_neutral_packages_may_import() -> None:
    source = (
        "import os\nfrom adk_sandbox.executor import _owner\n"
        "from adk_sandbox.executor.errors import ExecutorError\n"
        "from .scan import Entry\nfrom . import racy\nimport dockerfile_parse\n"
    )
    assert forbidden_in(source) == []


@pytest.mark.parametrize(
    ("importer", "imported", "private"),
    [
        (
            "adk_sandbox.executor.backends.kubernetes.backend",
            "adk_sandbox.executor.backends.docker._spec",
            True,
        ),
        (
            "adk_sandbox.executor.backends.kubernetes._spec",
            "adk_sandbox.executor.backends.docker._reaper.x",
            True,
        ),
        ("adk_sandbox.executor.backends.kubernetes", "adk_sandbox.executor.backends.docker.images", False),
        ("adk_sandbox.executor.backends.docker.session", "adk_sandbox.executor.backends.docker._spec", False),
        ("adk_sandbox.executor.cli", "adk_sandbox.executor.backends.docker._spec", False),
        ("adk_sandbox.executor.backends.wasm", "adk_sandbox.executor.backends.process", False),
    ],
)
def test_a_private_module_of_another_backend_is_told_apart(
    importer: str, imported: str, private: bool
) -> None:
    assert private_of_another_backend(importer, imported) is private


def test_a_circle_is_found_even_through_a_late_import_and_not_through_type_checking() -> None:
    a = runtime_imports_of("def f():\n    from adk_sandbox.b import x\n", "a.py", "adk_sandbox.a")
    b = runtime_imports_of("from adk_sandbox.a import y\n", "b.py", "adk_sandbox.b")
    graph = {
        "adk_sandbox.a": {i.module for i in a} & {"adk_sandbox.b"},
        "adk_sandbox.b": {i.module for i in b},
    }
    graph["adk_sandbox.b"] &= {"adk_sandbox.a"}
    assert circles(graph) == [["adk_sandbox.a", "adk_sandbox.b"]]
    typing_only = runtime_imports_of(
        "if TYPE_CHECKING:\n    from adk_sandbox.b import x\n", "a.py", "adk_sandbox.a"
    )
    assert typing_only == []
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
