r"""The extension kit: fakes for unit tests of code that drives a sandbox, and a conformance suite.

* :class:`FakeBackend`, :class:`FakeSession`, :class:`FakeSessionFactory` (:mod:`.fakes`): stand-ins that
  run nothing, answer as scripted and record what they were asked, for tests of an agent's logic;
* :mod:`.conformance`: the behaviour the README promises of every backend, as pytest tests a backend's own
  test module runs against it (``ConformanceSuite``, ``ConformanceTarget``, ``KnownDifference``; needs
  pytest, so those names are imported on first use).

Also importable as :mod:`adk_sandbox.testing`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from adk_sandbox._lazy import lazy_names
from adk_sandbox.executor.testing.fakes import (
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

# The conformance suite imports pytest: loaded only when asked for, so the fakes need no pytest.
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
