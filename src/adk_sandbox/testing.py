"""The extension kit, for tests of code that drives a sandbox and of new backends.

Fakes that run nothing, answer as scripted and record what they were asked (:class:`FakeBackend`,
:class:`FakeSession`, :class:`FakeSessionFactory`: :mod:`adk_sandbox.executor.testing.fakes`), and the
conformance suite every backend runs (:class:`ConformanceSuite`, :class:`ConformanceTarget`,
:class:`KnownDifference`; needs pytest, imported on first use). See docs/BACKENDS.md, section 5.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from adk_sandbox._lazy import lazy_names
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


_SUITE = ("CHECKS", "ConformanceSuite", "ConformanceTarget", "KnownDifference")
__getattr__, _ = lazy_names(__name__, {"adk_sandbox.executor.testing.conformance": _SUITE})


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
