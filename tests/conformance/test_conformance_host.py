"""The conformance suite (adk_sandbox.testing) on the host backends: a plain ProcessBackend and bubblewrap.

Processes are looked for in this machine's ``/proc`` (the commands are host processes). Each known
difference is what the README's isolation table says these backends do not give.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from adk_sandbox.executor import BubblewrapEnforcer, PolicyNotEnforceableError, ProcessBackend, SandboxPolicy
from adk_sandbox.testing import ConformanceSuite, ConformanceTarget, KnownDifference
from tests.conformance.table import column

#: Host backends run every command as the caller: another uid is refused, never faked.
RUNS_AS_THE_CALLER = KnownDifference(
    "host backends run commands as the calling user; another uid:gid is refused (only a Docker session "
    "switches users)",
    raises=PolicyNotEnforceableError,
)


class TestProcessBackendConformance(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConformanceTarget]:
        workdir = tmp_path_factory.mktemp("process-workdir")
        with ProcessBackend(workdir=workdir) as backend:
            yield ConformanceTarget(
                backend,
                processes="host",
                scratch=str(workdir),
                table=column("process"),
                known_differences={
                    "escapees_die": KnownDifference(
                        "without an enforcer only the command's process group is killed: a process that "
                        "leaves it (setsid, a double fork) outlives the command (isolation subprocess_only)",
                        raises=AssertionError,
                    ),
                    "user_other": RUNS_AS_THE_CALLER,
                },
            )


@pytest.mark.bwrap
class TestBubblewrapConformance(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(
        cls, bwrap_enforcer: BubblewrapEnforcer, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[ConformanceTarget]:
        workdir: Path = tmp_path_factory.mktemp("bwrap-workdir")
        policy = SandboxPolicy.builder().allow_process_spawn().allow_read_write(workdir).build()
        with ProcessBackend.with_sandbox(bwrap_enforcer, policy, workdir=workdir) as backend:
            yield ConformanceTarget(
                backend,
                processes="host",
                scratch=str(workdir),
                table=column("bwrap"),
                known_differences={"user_other": RUNS_AS_THE_CALLER},
            )
