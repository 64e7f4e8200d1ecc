"""``Capabilities.host_filesystem`` / ``host_environment`` / ``host_programs`` per backend, and the
decisions made from them instead of from the isolation rank (the Rust pipeline's layout).

Capabilities of the host backends, WASM and a Docker container's inspect are pure functions of their
configuration, so they are tested here as a table; the integration tests assert the same on real ones.
"""

from __future__ import annotations

from typing import Any

import pytest

from adk_sandbox.executor import (
    BubblewrapEnforcer,
    Capabilities,
    IsolationClass,
    Language,
    ProcessBackend,
    SandboxPolicy,
    SandboxPolicyBuilder,
)
from adk_sandbox.executor.backends.docker._spec import capabilities_from_inspect
from adk_sandbox.executor.rust import CONTAINER_DEPS_DIR, CONTAINER_WORK_DIR, RustExecutor
from adk_sandbox.testing import FakeBackend, container_capabilities
from tests.conftest import require


def _spawn() -> SandboxPolicyBuilder:
    return SandboxPolicy.builder().allow_process_spawn()


def _facts(capabilities: Capabilities) -> tuple[bool, bool, bool]:
    return capabilities.host_filesystem, capabilities.host_environment, capabilities.host_programs


def _bwrap(policy: SandboxPolicy) -> ProcessBackend:
    # The enforcer's path is not run: capabilities() only asks it what the policy confines.
    return ProcessBackend.with_sandbox(BubblewrapEnforcer("/usr/bin/bwrap"), policy)


@pytest.mark.parametrize(
    ("backend", "expected"),
    [
        (ProcessBackend, (True, True, True)),
        (lambda: _bwrap(_spawn().build()), (False, False, True)),
        (lambda: _bwrap(_spawn().allow_read("/usr").allow_read_write("/tmp").build()), (False, False, True)),
        (lambda: _bwrap(_spawn().allow_read("/").build()), (True, False, True)),
        (lambda: _bwrap(_spawn().allow_read_write("/").build()), (True, False, True)),
    ],
    ids=["process", "bwrap-deny-all", "bwrap-some-paths", "bwrap-root-read-only", "bwrap-root-writable"],
)
def test_host_backends_report_what_their_commands_see(
    backend: object, expected: tuple[bool, bool, bool]
) -> None:
    assert callable(backend)
    with backend() as made:
        assert _facts(made.capabilities()) == expected


def test_wasm_sees_no_host_state() -> None:
    try:
        import wasmtime  # noqa: F401, PLC0415 - the optional wasm extra
    except ImportError as exc:
        require(False, f"the wasm extra is not installed: {exc}")  # fails in CI, skips elsewhere
    from adk_sandbox.executor import WasmBackend  # noqa: PLC0415 - needs the optional wasmtime

    assert _facts(WasmBackend().capabilities()) == (False, False, False)


def test_a_container_sees_no_host_state_also_with_extra_host_mounts() -> None:
    """The defaults, which ``capabilities_from_inspect`` relies on: an extra mount leaves fs_read false but
    still gives no host filesystem as it is, no host environment and no host programs."""
    inspect: dict[str, Any] = {
        "HostConfig": {"NetworkMode": "none", "ReadonlyRootfs": True, "Memory": 1 << 30, "PidsLimit": 512},
        "Mounts": [],
    }
    assert _facts(capabilities_from_inspect(inspect, (Language.COMMAND,))) == (False, False, False)
    inspect["Mounts"] = [{"Type": "bind", "Source": "/etc", "Destination": "/host-etc", "RW": True}]
    attached = capabilities_from_inspect(inspect, (Language.COMMAND,))
    assert not attached.fs_read
    assert _facts(attached) == (False, False, False)


def test_the_facts_default_to_false_so_older_constructors_keep_working() -> None:
    assert _facts(container_capabilities(Language.COMMAND)) == (False, False, False)


def reporting(capabilities: Capabilities) -> FakeBackend:
    """The shipped fake reporting ``capabilities``; the executor's constructor runs nothing."""
    return FakeBackend(capabilities=capabilities, error=AssertionError("not run in this test"))


CONTAINER = container_capabilities(Language.COMMAND)
LOW_RANK = CONTAINER.model_copy(update={"isolation": IsolationClass.SUBPROCESS_ONLY})


@pytest.mark.parametrize(
    ("capabilities", "image_layout"),
    [
        (CONTAINER, True),
        (CONTAINER.model_copy(update={"isolation": IsolationClass.GVISOR}), True),
        # Ranked "container" yet running host programs (e.g. a host process under a stronger enforcer):
        # the host's toolchain and a host work dir, not the image's paths.
        (CONTAINER.model_copy(update={"host_programs": True}), False),
        # Ranked below a container yet running no host program (e.g. a remote runner): the image layout.
        (LOW_RANK, True),
        (LOW_RANK.model_copy(update={"host_programs": True}), False),
    ],
    ids=["container", "gvisor", "container-rank-host-programs", "low-rank-no-host-programs", "host-process"],
)
def test_the_rust_layout_follows_host_programs_not_the_rank(
    capabilities: Capabilities, image_layout: bool
) -> None:
    with RustExecutor(reporting(capabilities)) as executor:
        if image_layout:
            assert (executor.work_dir, executor.deps_dir) == (CONTAINER_WORK_DIR, CONTAINER_DEPS_DIR)
        else:
            assert executor.work_dir != CONTAINER_WORK_DIR
            assert executor.deps_dir != CONTAINER_DEPS_DIR
