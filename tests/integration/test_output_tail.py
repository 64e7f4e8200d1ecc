"""``ExecRequest(truncate="head_tail")`` on every backend that runs commands: host processes, bubblewrap,
and Docker over each channel (the static C agent, the Python agent, one exec per command)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from adk_sandbox.executor import ExecRequest, Language, ProcessBackend, SandboxBackend, SandboxPolicy
from adk_sandbox.executor.backends.docker import DockerBackend

SCRIPT = "i=0; while [ $i -lt 2000 ]; do printf 'line %04d\\n' $i; i=$((i+1)); done; echo err-end >&2"
EXPECTED = (
    "line 0000\nline 0001\nline 0002\nline 0003\nline 0004\n"
    "[... 19900 bytes omitted ...]\n"
    "line 1995\nline 1996\nline 1997\nline 1998\nline 1999\n"
)


@pytest.fixture(params=["process", "bwrap", "docker"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SandboxBackend]:
    kind = str(request.param)
    if kind == "process":
        with ProcessBackend(workdir=tmp_path) as backend:
            yield backend
        return
    if kind == "bwrap":
        enforcer = request.getfixturevalue("bwrap_enforcer")
        policy = SandboxPolicy.builder().allow_read_write(tmp_path).allow_process_spawn().build()
        with ProcessBackend.with_sandbox(enforcer, policy, workdir=tmp_path) as backend:
            yield backend
        return
    request.getfixturevalue("docker_backend")  # the engine and image are there (fails in CI if not)
    with DockerBackend() as docker, docker.session() as session:
        yield session


def test_head_tail_keeps_the_start_and_the_end(backend: SandboxBackend) -> None:
    streamed: list[str] = []
    result = backend.execute(
        ExecRequest(
            language=Language.COMMAND, code=SCRIPT, timeout=60, max_output_bytes=100, truncate="head_tail"
        ),
        lambda stream, text: streamed.append(text) if stream == "stdout" else None,
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout == EXPECTED
    assert result.stdout_truncated and not result.stderr_truncated and result.stderr == "err-end\n"
    assert "".join(streamed) == EXPECTED


def test_head_is_still_the_default(backend: SandboxBackend) -> None:
    result = backend.execute(
        ExecRequest(language=Language.COMMAND, code=SCRIPT, timeout=60, max_output_bytes=100)
    )
    assert result.stdout == "".join(f"line {i:04d}\n" for i in range(10))
    assert result.stdout_truncated


def test_head_tail_output_that_fits_is_whole(backend: SandboxBackend) -> None:
    code = "printf 'abcdefghij%.0s' 1 2 3 4 5 6 7 8 9"  # 90 bytes, cap 100
    result = backend.execute(
        ExecRequest(
            language=Language.COMMAND, code=code, timeout=60, max_output_bytes=100, truncate="head_tail"
        )
    )
    assert result.stdout == "abcdefghij" * 9 and not result.stdout_truncated


def test_a_flood_with_a_tail_costs_the_host_nothing(request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("docker_backend")

    def rss_peak_kib() -> int:
        with open("/proc/self/status") as handle:
            return next(int(line.split()[1]) for line in handle if line.startswith("VmHWM"))

    with DockerBackend() as docker, docker.session() as session:
        before = rss_peak_kib()
        result = session.execute(
            ExecRequest(
                language=Language.COMMAND,
                code="head -c 300000000 /dev/zero | tr '\\0' a; echo; echo the-end",
                timeout=120,
                max_output_bytes=65536,
                truncate="head_tail",
            )
        )
        grown_mib = (rss_peak_kib() - before) / 1024
    assert result.exit_code == 0 and result.stdout_truncated
    marker = f"\n[... {300_000_000 + len(chr(10) + 'the-end' + chr(10)) - 65536} bytes omitted ...]\n"
    head, found, tail = result.stdout.partition(marker)
    assert found and head == "a" * 32768
    assert tail == "a" * (32768 - len("\nthe-end\n")) + "\nthe-end\n"
    assert grown_mib < 32, f"host peak RSS grew by {grown_mib:.0f} MiB"
