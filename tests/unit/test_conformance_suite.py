"""The conformance suite catches broken backends, and keeps its known-difference lists true.

Each case runs a few checks of ``adk_sandbox.testing.ConformanceSuite`` in an inner pytest session
(pytester) against a deliberately broken backend: a ProcessBackend (host processes, no engine needed)
altered in one way, which the matching check must fail while the others still pass.
"""

from __future__ import annotations

import textwrap

import pytest

from adk_sandbox.executor.testing import conformance

pytest_plugins = ["pytester"]

BROKEN = '''
import os

import pytest

from adk_sandbox.executor import Language, PolicyNotEnforceableError, ProcessBackend, SandboxFailedError
from adk_sandbox.testing import ConformanceSuite, ConformanceTarget, FakeBackend, KnownDifference


class LeaksHostEnvironment(ProcessBackend):
    def execute(self, request, on_output=None, *, cancel=None):
        leaky = request.model_copy(update={"env": {**os.environ, **request.env}})
        return super().execute(leaky, on_output, cancel=cancel)


class IgnoresTheTimeout(ProcessBackend):
    def execute(self, request, on_output=None, *, cancel=None):
        return super().execute(request.model_copy(update={"timeout": 4.0}), on_output, cancel=cancel)


class IgnoresTheOutputCap(ProcessBackend):
    def execute(self, request, on_output=None, *, cancel=None):
        uncapped = request.model_copy(update={"max_output_bytes": None, "truncate": "head"})
        return super().execute(uncapped, on_output, cancel=cancel)


class RaisesOnAFailedCommand(ProcessBackend):
    def execute(self, request, on_output=None, *, cancel=None):
        result = super().execute(request, on_output, cancel=cancel)
        if not result.ok:
            raise SandboxFailedError(f"the command failed with {result.exit_code}")
        return result


class ClaimsNoNetwork(ProcessBackend):
    def capabilities(self):
        return super().capabilities().model_copy(update={"network": True})


class KillsOnlyTheShell(ProcessBackend):
    """Starts every command in a session of its own: the timeout's group kill misses it."""

    def execute(self, request, on_output=None, *, cancel=None):
        if request.code is not None and request.language == "command":
            request = request.model_copy(update={"code": f"setsid sh -c {request.code!r}"})
        return super().execute(request, on_output, cancel=cancel)


def RunsNothing(workdir):
    """The shipped fake, as if it were a backend: it answers every command with nothing, exit 0."""
    return FakeBackend(languages=[Language.COMMAND])


def target(backend, tmp_path_factory, **known):
    workdir = tmp_path_factory.mktemp("workdir")
    return ConformanceTarget(backend(workdir=workdir), processes="host", scratch=str(workdir),
                             known_differences=known)


@pytest.fixture(scope="module")
def conformance_target(request, tmp_path_factory):
    return target(request.module.BACKEND, tmp_path_factory, **request.module.KNOWN)
'''


#: Why each failed check of the last inner run failed (its report's text).
WHY: dict[str, str] = {}


def run_checks(pytester: pytest.Pytester, backend: str, *checks: str, known: str = "{}") -> dict[str, str]:
    """Run ``checks`` of the suite against ``backend`` (a class of BROKEN); each check's outcome.

    A check whose setup or call failed is "failed" (its report's text in :data:`WHY`); an expected
    failure of a listed known difference is "xfailed".
    """
    pytester.makepyfile(
        broken=BROKEN,
        test_inner=textwrap.dedent(f"""
            from broken import *  # noqa: F403
            from broken import conformance_target  # noqa: F401

            BACKEND = {backend}
            KNOWN = {known}

            class TestInner(ConformanceSuite):
                pass
        """),
    )
    selected = " or ".join(f"test_{check}" for check in checks)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-k", selected)
    outcomes: dict[str, str] = {}
    WHY.clear()
    for report in result.reprec.getreports("pytest_runtest_logreport"):  # type: ignore[attr-defined]
        name = report.nodeid.rsplit("::test_", 1)[1]
        if getattr(report, "wasxfail", None) is not None:
            outcomes[name] = "xfailed"
        elif report.failed:
            outcomes[name] = "failed"
            WHY[name] = WHY.get(name, "") + str(report.longrepr)
        elif report.when == "call" or report.skipped:
            outcomes.setdefault(name, report.outcome)
    return outcomes


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken backends are given up on sooner: 2 s of slack after a timeout (not 14), survivors looked
    for during 1 s (not 3); the inner sessions load no plugins but pytester's."""
    monkeypatch.setattr(conformance, "_KILL_SLACK", 2.0)
    monkeypatch.setattr(conformance, "_GONE_WITHIN", 1.0)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def test_a_correct_backend_passes_the_checks_used_below(pytester: pytest.Pytester) -> None:
    checks = (
        "results",
        "timeout",
        "output_cap",
        "output_head_tail",
        "env_cleared",
        "known_differences_are_checks",
    )
    outcomes = run_checks(pytester, "ProcessBackend", *checks)
    assert outcomes == dict.fromkeys(checks, "passed")


def test_a_leaked_host_variable_is_caught(pytester: pytest.Pytester) -> None:
    assert run_checks(pytester, "LeaksHostEnvironment", "env_cleared", "results") == {
        "env_cleared": "failed",
        "results": "passed",
    }
    assert "a host variable reached the command" in WHY["env_cleared"]


def test_an_ignored_timeout_is_caught_without_hanging_the_suite(pytester: pytest.Pytester) -> None:
    assert run_checks(pytester, "IgnoresTheTimeout", "timeout", "cancel") == {
        "timeout": "failed",
        "cancel": "passed",
    }
    assert "did not come back within 2 s of the request's timeout" in WHY["timeout"]


def test_a_timeout_that_leaves_the_tree_running_is_caught(pytester: pytest.Pytester) -> None:
    assert run_checks(pytester, "KillsOnlyTheShell", "timeout") == {"timeout": "failed"}
    assert "processes of the timed-out command are still running" in WHY["timeout"]


def test_an_ignored_output_cap_is_caught(pytester: pytest.Pytester) -> None:
    assert run_checks(pytester, "IgnoresTheOutputCap", "output_cap", "output_head_tail", "stdin_bytes") == {
        "output_cap": "failed",
        "output_head_tail": "failed",
        "stdin_bytes": "passed",
    }


def test_a_failed_command_raised_as_an_exception_is_caught(pytester: pytest.Pytester) -> None:
    assert run_checks(pytester, "RaisesOnAFailedCommand", "results") == {"results": "failed"}
    assert "SandboxFailedError: the command failed with 3" in WHY["results"]


def test_a_fake_that_runs_nothing_is_caught(pytester: pytest.Pytester) -> None:
    assert run_checks(pytester, "RunsNothing", "results", "stdin_bytes") == {
        "results": "failed",
        "stdin_bytes": "failed",
    }
    assert "expected stdout 'out\\n', stderr 'err\\n', exit 3" in WHY["results"]


def test_a_capability_claimed_but_not_enforced_is_caught(pytester: pytest.Pytester) -> None:
    outcomes = run_checks(pytester, "ClaimsNoNetwork", "network_denied", "memory_limit")
    assert outcomes == {"network_denied": "failed", "memory_limit": "skipped"}  # memory is not claimed
    assert "the command reached this machine" in WHY["network_denied"]


def test_the_known_differences_stay_true(pytester: pytest.Pytester) -> None:
    known = (
        "{'results': 'listed, yet it passes', "
        "'env_cleared': KnownDifference('a leak listed as a refusal', raises=PolicyNotEnforceableError), "
        "'network_denied': 'listed, yet it does not apply', "
        "'no_such_check': 'a name that is no check'}"
    )
    checks = ("results", "env_cleared", "network_denied", "known_differences_are_checks")
    outcomes = run_checks(pytester, "LeaksHostEnvironment", *checks, known=known)
    assert outcomes == {
        "results": "failed",  # XPASS(strict): a listed difference that passes fails the run
        "env_cleared": "failed",  # failed with AssertionError, not the listed error
        "network_denied": "failed",  # listed but not applicable (an error in its setup)
        "known_differences_are_checks": "failed",  # 'no_such_check'
    }
    assert "[XPASS(strict)] known difference: listed, yet it passes" in WHY["results"]
    assert "a host variable reached the command" in WHY["env_cleared"]
    assert "is a listed known difference but does not apply" in WHY["network_denied"]
    assert "['no_such_check']" in WHY["known_differences_are_checks"]
    listed = run_checks(pytester, "LeaksHostEnvironment", "env_cleared", known="{'env_cleared': 'it leaks'}")
    assert listed == {"env_cleared": "xfailed"}
