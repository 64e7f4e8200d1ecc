"""Importing the package and its workspace and tools loads no engine's client.

An engine's client library (docker-py, which brings paramiko and requests; kubernetes; wasmtime; inspect_ai)
is imported the first time that engine is used, so a host-only user pays for none of them: before this
rule ``from adk_sandbox import Workspace, DevToolset`` loaded 797 modules (docker-py and paramiko among
them), after it about 360. Each check runs in a fresh interpreter (this one has imported everything).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

ENGINE_CLIENTS = frozenset({"docker", "paramiko", "kubernetes", "inspect_ai", "wasmtime", "requests"})


def top_level_modules_after(code: str) -> set[str]:
    """The top-level names in ``sys.modules`` after ``code`` runs in a fresh interpreter."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True, timeout=60
    )
    return set(json.loads(out.stdout.splitlines()[-1]))


@pytest.mark.parametrize(
    "code",
    [
        "import adk_sandbox",
        "from adk_sandbox import Workspace, DevToolset",
        "import adk_sandbox.executor, adk_sandbox.devtools",
        "from adk_sandbox import ProcessBackend, ExecRequest, SandboxPolicy, Capabilities",
    ],
)
def test_no_engine_client_is_loaded_until_an_engine_is_named(code: str) -> None:
    loaded = top_level_modules_after(code)
    assert "adk_sandbox" in loaded
    assert not loaded & ENGINE_CLIENTS, f"{code!r} loaded {sorted(loaded & ENGINE_CLIENTS)}"


def test_naming_the_docker_backend_loads_docker_py() -> None:
    """The check above can see a client: the first use of an engine's name loads it."""
    loaded = top_level_modules_after("from adk_sandbox import DockerBackend")
    assert "docker" in loaded


def test_the_lazy_names_resolve_to_the_engines_classes() -> None:
    import adk_sandbox.executor as executor_package  # noqa: PLC0415 - the name is what is under test
    from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession  # noqa: PLC0415

    assert executor_package.DockerBackend is DockerBackend
    assert executor_package.DockerSession is DockerSession
    with pytest.raises(AttributeError, match="no attribute 'NoSuchBackend'"):
        _ = executor_package.NoSuchBackend
