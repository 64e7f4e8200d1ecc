r"""The extension kit, for tests of code that drives a sandbox and of new backends.

Fakes that run nothing, answer as scripted and record what they were asked::

    from adk_sandbox.testing import FakeBackend, FakeSessionFactory

    fake = FakeBackend(stdout="hello\n")                  # a SandboxBackend
    factory = FakeSessionFactory(stdout="hi\n")           # opens FakeSessions, like DockerBackend

and the conformance suite every backend of this library runs, for a third-party backend to run too (its
test module provides a ``conformance_target`` fixture and subclasses the suite)::

    import pytest
    from adk_sandbox.testing import ConformanceSuite, ConformanceTarget, KnownDifference

    @pytest.fixture(scope="module")
    def conformance_target():
        with MyBackend() as backend:
            yield ConformanceTarget(backend, known_differences={"user_other": KnownDifference("...")})

    class TestMyBackendConformance(ConformanceSuite):
        pass

The fakes are :mod:`adk_sandbox.executor.testing.fakes`; the suite (which needs pytest) is
:mod:`adk_sandbox.executor.testing.conformance`, imported on first use of its names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from adk_sandbox.executor import testing as _kit
from adk_sandbox.executor.testing import (
    FakeBackend,
    FakeSession,
    FakeSessionFactory,
    Respond,
    container_capabilities,
)

if TYPE_CHECKING:
    from adk_sandbox.executor.testing.conformance import (
        CHECKS,
        ConformanceSuite,
        ConformanceTarget,
        KnownDifference,
    )


def __getattr__(name: str) -> Any:
    if name in ("CHECKS", "ConformanceSuite", "ConformanceTarget", "KnownDifference"):
        return getattr(_kit, name)  # imports the suite (and pytest) now
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CHECKS",
    "ConformanceSuite",
    "ConformanceTarget",
    "FakeBackend",
    "FakeSession",
    "FakeSessionFactory",
    "KnownDifference",
    "Respond",
    "container_capabilities",
]
