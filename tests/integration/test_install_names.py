"""The import root clashes with nothing: next to PyPI's ``devtools`` and ``executor``, all three import.

A new virtual environment gets both PyPI distributions first, then this project's wheel (built from the
checkout); before the import root was ``adk_sandbox``, the wheel's top-level ``executor`` and ``devtools``
overwrote theirs. The check runs from an empty directory, so nothing of the checkout is on ``sys.path``.
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]

CHECK = """
from devtools import debug            # PyPI's devtools (a debugging library)
import executor                       # PyPI's executor
import adk_sandbox
from adk_sandbox import DevToolset, DockerBackend, ExecRequest, ProcessBackend, Workspace

assert debug.__module__.startswith("devtools"), debug.__module__
assert "site-packages/executor/" in executor.__file__, executor.__file__
assert not hasattr(executor, "ExecRequest"), "this project's executor replaced PyPI's"
assert DockerBackend.__module__ == "adk_sandbox.executor.backends.docker.backend"
with ProcessBackend() as backend:
    result = backend.execute(ExecRequest(language="command", code="echo ok", timeout=30))
assert result.stdout == "ok\\n", result
print("three roots")
"""


def _run(*argv: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in argv], check=False, cwd=cwd, capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, f"{argv[:4]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.slow
def test_the_project_installs_next_to_pypis_devtools_and_executor(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    _run(python, "-m", "pip", "install", "-q", "devtools", "executor", cwd=tmp_path)
    wheels = tmp_path / "wheels"
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", wheels, REPOSITORY, cwd=tmp_path)
    (wheel,) = wheels.glob("adk_sandbox-*.whl")
    _run(python, "-m", "pip", "install", "-q", wheel, cwd=tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _run(python, "-c", CHECK, cwd=empty).strip() == "three roots"
    # The command line and its module form come from the same root.
    assert "usage: adk-sandbox" in _run(env_dir / "bin" / "adk-sandbox", "--help", cwd=empty)
    assert "usage: adk-sandbox" in _run(python, "-m", "adk_sandbox", "--help", cwd=empty)
    # The wheel carries the in-sandbox agent (hatch_build.py), used without a compiler on the host.
    agent = (
        "from adk_sandbox.executor.channel import static_agent as s; print(len(s.load_static_agent().agent))"
    )
    shipped = _run(python, "-c", agent, cwd=empty, env={"PATH": "/nonexistent", "HOME": str(empty)})
    assert int(shipped) > 100_000


def test_the_editable_install_puts_only_src_on_the_path() -> None:
    """The development install maps ``adk_sandbox`` without exposing the checkout's folders at the top."""
    code = (
        "import importlib.util, sys, adk_sandbox.executor as e, adk_sandbox.devtools as d\n"
        "print(e.__file__); print(d.__file__)\n"
        "print(importlib.util.find_spec('executor'), importlib.util.find_spec('devtools'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd="/", capture_output=True, text=True, timeout=60, check=True
    ).stdout.splitlines()
    assert out[0] == str(REPOSITORY / "src/adk_sandbox/executor/__init__.py")
    assert out[1] == str(REPOSITORY / "src/adk_sandbox/devtools/__init__.py")
    assert out[2] == "None None", "the checkout's executor/ or devtools/ is importable at the top"
