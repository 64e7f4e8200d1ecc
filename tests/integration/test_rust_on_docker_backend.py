"""The Rust pipeline given a bare ``DockerBackend`` (not a session), as issue 10 composed it:
``CodeTool(RustExecutor(DockerBackend(image="adk-sandbox/rust:latest")))``.

The executor opens one session for its life, so check, build and run share the container's filesystem,
and all of them still happen inside that container.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from adk_sandbox.executor import BackendUnavailableError, CodeTool, RustExecutor, RustExecutorConfig
from adk_sandbox.executor.backends.docker import RUST_IMAGE, DockerBackend
from tests.conftest import project_containers, require
from tests.contract.test_rust_pipeline import LINKED_WITH

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]

ECHO = 'fn run(input: Value) -> Value { serde_json::json!({"got": input}) }'
HOSTNAME_AT_COMPILE_TIME = (
    "fn run(_input: Value) -> Value {\n"
    '    Value::String(include_str!("/etc/hostname").trim().to_string())\n'
    "}\n"
)


@pytest.fixture
def rust_backend() -> Iterator[DockerBackend]:
    try:
        backend = DockerBackend(image=RUST_IMAGE)
    except BackendUnavailableError as exc:
        require(False, f"the Docker engine is not usable here: {exc}")
        raise
    with backend:
        yield backend


def mine(backend: DockerBackend) -> set[str]:
    return set(project_containers(backend._client, os.getpid()))


def test_code_tool_on_a_rust_executor_on_a_bare_docker_backend(rust_backend: DockerBackend) -> None:
    before = mine(rust_backend)
    executor = RustExecutor(rust_backend)
    tool = CodeTool(executor)  # the exact composition of the issue
    try:
        first = tool.run_sync({"code": ECHO, "input": {"n": 21}})
        assert first["status"] == "success", first
        assert first["output"] == {"got": {"n": 21}}
        again = tool.run_sync({"code": ECHO, "input": [1, 2]})
        assert (again["status"], again["output"]) == ("success", {"got": [1, 2]}), again
        # One session container for the executor's life, not one per step or per snippet.
        assert len(mine(rust_backend) - before) == 1
    finally:
        tool.close()  # the tool does not own a given executor ...
        assert len(mine(rust_backend) - before) == 1
        executor.close()  # ... the executor owns its session
    assert mine(rust_backend) <= before
    assert tool.run_sync({"code": ECHO})["status"] == "error"  # closed


def test_check_build_and_run_happen_in_the_container(rust_backend: DockerBackend) -> None:
    # include_str! runs at compile time: it reads the container's /etc/hostname, not the host's.
    assert socket.gethostname() != "sandbox"
    with RustExecutor(rust_backend) as executor:
        result = executor.run(HOSTNAME_AT_COMPILE_TIME, None, timeout=120)
        assert (result.status, result.output) == ("success", "sandbox"), result
        compiled = executor.run("fn run(_i: Value) -> Value { Value::from(1) } fn oops() -> u8 { 300 }")
        assert compiled.status == "compile_error", compiled
        assert compiled.diagnostics[0].spans[0].line_start == 1


def test_a_code_tool_made_from_the_backend_removes_its_container_when_closed(
    rust_backend: DockerBackend,
) -> None:
    before = mine(rust_backend)
    with CodeTool(rust_backend) as tool:
        result = tool.run_sync({"code": ECHO, "input": "x"})
        assert (result["status"], result["output"]) == ("success", {"got": "x"}), result
        assert len(mine(rust_backend) - before) == 1
    assert mine(rust_backend) <= before


def test_the_image_links_with_lld_and_rustc_args_override_the_pipelines_flags(
    rust_backend: DockerBackend,
) -> None:
    # GNU ld took ~0.45 s of a ~0.6 s compile in the image; the image has lld and the pipeline uses it.
    with RustExecutor(rust_backend) as executor:
        result = executor.run(LINKED_WITH, None, timeout=120)
        assert result.status == "success", result
        assert result.output == {"debug_info": False, "lld": True}
    # The caller's rustc_args come after the pipeline's own: GNU ld and full debug info are still there.
    config = RustExecutorConfig(rustc_args=("-C", "link-arg=-fuse-ld=bfd", "-C", "strip=none"))
    with RustExecutor(rust_backend, config) as executor:
        result = executor.run(LINKED_WITH, None, timeout=120)
        assert result.status == "success", result
        assert result.output == {"debug_info": True, "lld": False}
