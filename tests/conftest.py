"""Shared test fixtures.

Tests that need a real enforcer or engine (bubblewrap, Docker, gVisor, wasmtime) call :func:`require`:
outside CI a missing dependency skips with the reason; with ``CI`` set it fails, so a CI run can never go
green by skipping what it was meant to test.
"""

from __future__ import annotations

import os

import pytest

from executor import BubblewrapEnforcer, EnforcerUnavailableError, get_enforcer

IN_CI = bool(os.environ.get("CI"))


def require(available: bool, reason: str) -> None:
    """Skip (locally) or fail (in CI) when a real dependency of the test is missing."""
    if available:
        return
    if IN_CI:
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def bwrap_enforcer() -> BubblewrapEnforcer:
    """The real bubblewrap enforcer, probed once per test session."""
    try:
        return get_enforcer()
    except EnforcerUnavailableError as exc:
        require(False, f"bubblewrap is not usable here: {exc}")
        raise  # unreachable: require() skipped or failed
