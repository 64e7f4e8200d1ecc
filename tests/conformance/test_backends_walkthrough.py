"""docs/BACKENDS.md's walk-through, run as it is written: its backend, its suite, its known differences.

Each ``python`` block of the page starts with ``# file: <path>``. The backend's modules
(``executor/backends/hostgroup/*.py``) become modules of that name (``adk_sandbox.executor.backends.
hostgroup.*``), so the blocks import each other exactly as the page shows; the test module's block
(``tests/conformance/test_conformance_hostgroup.py``) runs here, so pytest collects its suite. A page that
no longer works -- a renamed hook, an import that moved, a known difference that became untrue -- fails.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "BACKENDS.md"
_BLOCK = re.compile(r"```python\n# file: (?P<path>\S+)\n(?P<code>.*?)```", re.S)


def walkthrough_blocks() -> list[tuple[str, str]]:
    """The page's ``(path, code)`` blocks, in order."""
    return [(m["path"], m["code"]) for m in _BLOCK.finditer(PAGE.read_text(encoding="utf-8"))]


def _load_package_module(path: str, code: str) -> None:
    name = "adk_sandbox." + path.removesuffix(".py").replace("/", ".")
    package = name.rpartition(".")[0]
    if package not in sys.modules:  # the backend's folder, as its __init__ would make it
        folder = types.ModuleType(package)
        folder.__path__ = []
        sys.modules[package] = folder
    module = types.ModuleType(name)
    module.__file__ = str(PAGE)
    sys.modules[name] = module
    exec(compile(code, f"{PAGE.name} ({path})", "exec"), module.__dict__)  # noqa: S102 - the page's own code


_blocks = walkthrough_blocks()
assert [path for path, _ in _blocks] == [
    "executor/backends/hostgroup/transport.py",
    "executor/backends/hostgroup/session.py",
    "executor/backends/hostgroup/backend.py",
    "tests/conformance/test_conformance_hostgroup.py",
], "the walk-through's blocks changed: update this test with the page"
for _path, _code in _blocks:
    if _path.startswith("executor/"):
        _load_package_module(_path, _code)
    else:
        exec(compile(_code, f"{PAGE.name} ({_path})", "exec"), globals())  # noqa: S102 - defines the suite


def test_the_walkthrough_backend_is_a_session_factory_with_files_refused() -> None:
    from adk_sandbox.executor import InvalidRequestError, SessionFactory  # noqa: PLC0415

    backend_module = sys.modules["adk_sandbox.executor.backends.hostgroup.backend"]
    with backend_module.HostGroupBackend() as backend:
        assert isinstance(backend, SessionFactory)
        with backend.session() as session:
            try:
                session.files.read_bytes("/etc/hostname")
            except InvalidRequestError as exc:
                assert "agent channel" in str(exc)
            else:
                raise AssertionError("a session off the agent channel must refuse file operations")
