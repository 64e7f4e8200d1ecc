"""The agent's build: one source of truth for the set-id filter, the wheel and the cache, the sh loader.

Needs a C compiler with a static libc on the host (gcc and libc6-dev, installed by scripts/setup); the
aarch64 build needs Debian's cross toolchain (gcc-aarch64-linux-gnu, also installed by scripts/setup). The
agent itself never runs on the host here (it would treat the host's orphans as its own escapees); the
loader does, with a harmless program as its payload.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from adk_sandbox.executor.channel import static_agent as _static_agent
from adk_sandbox.executor.channel.agent import SETID_ALLOWED_WORD
from adk_sandbox.executor.channel.setid import native_arch, setid_filter
from adk_sandbox.executor.channel.static_agent import (
    StaticAgentUnavailableError,
    agent_launch,
    build_static_agent,
    compile_agent,
    filter_header,
    loader_script,
)
from tests.conftest import require

X86_64, AARCH64 = 0xC000003E, 0xC00000B7


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One cache directory for the module (a build takes seconds); tests that damage it rebuild it."""
    require(shutil.which("gcc") is not None or shutil.which("cc") is not None, "no C compiler")
    directory = tmp_path_factory.mktemp("static-agent") / "cache"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ADK_SANDBOX_CACHE", str(directory))
        yield directory


@pytest.mark.parametrize("arch", [X86_64, AARCH64])
def test_the_c_filter_table_is_the_python_filter(arch: int) -> None:
    header = filter_header(arch)
    numbers = re.search(r"\{([0-9,]*)\}", header)
    assert numbers is not None
    assert bytes(int(n) for n in numbers.group(1).split(",")) == setid_filter(arch)
    assert f"#define SETID_FILTER_LEN {len(setid_filter(arch))}\n" in header


def test_the_built_agent_carries_exactly_this_filter(cache: Path) -> None:
    built, directory = build_static_agent()
    assert setid_filter(native_arch()) in built.agent
    assert directory.parent == cache and (directory / "DIGEST").read_text().strip() == built.digest
    assert built.agent.startswith(b"\x7fELF") and built.loader.startswith(b"\x7fELF")
    assert b"INTERP" not in built.agent[:4096] and len(built.loader) < 4096  # static; tiny loader


def test_a_changed_filter_is_a_different_build(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, first = build_static_agent()
    monkeypatch.setattr(_static_agent, "setid_filter", lambda arch: setid_filter(arch)[8:])
    _, second = build_static_agent()
    assert first != second
    shutil.rmtree(second)


def test_a_changed_agent_source_is_a_different_build(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache is keyed by the sources' bytes: an edited agent.c never reuses the binary of the old one."""
    built, first = build_static_agent()
    original = _static_agent._source_text

    def edited(name: str) -> bytes:
        text = original(name)
        return (
            text + b'\nstatic const char EDITED[] __attribute__((used)) = "edited";\n'
            if name == "agent.c"
            else text
        )

    monkeypatch.setattr(_static_agent, "_source_text", edited)
    rebuilt, second = build_static_agent()
    assert first != second and rebuilt.digest != built.digest
    assert b"edited" in rebuilt.agent and b"edited" not in built.agent
    shutil.rmtree(second)


def test_the_built_agent_knows_the_opt_in_word(cache: Path) -> None:
    """The word comes from the generated header (agent.SETID_ALLOWED_WORD), so it is in the binary."""
    built, _ = build_static_agent()
    assert SETID_ALLOWED_WORD.encode() + b"\0" in built.agent


def test_a_damaged_cached_binary_is_rebuilt(cache: Path) -> None:
    built, directory = build_static_agent()
    (directory / "agent").write_bytes(b"\x7fELF tampered")
    again, _ = build_static_agent()
    assert again.agent == built.agent


def test_no_compiler_is_a_clear_error(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_static_agent, "_compiler", lambda: None)
    with pytest.raises(StaticAgentUnavailableError, match="C compiler"):
        build_static_agent()


def test_no_binary_and_no_compiler_names_what_to_install(
    cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(_static_agent, "_compiler", lambda: None)
    monkeypatch.setattr(_static_agent, "_packaged_directory", lambda machine: tmp_path / machine)
    _static_agent._static_or_reason.cache_clear()
    try:
        with pytest.raises(StaticAgentUnavailableError, match=r"wheel .* apt install gcc libc6-dev"):
            agent_launch(None)
    finally:
        _static_agent._static_or_reason.cache_clear()


def test_the_wheels_agent_is_used_without_a_compiler(
    cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The wheel's binary (hatch_build.py) serves a host without a compiler, if it is of these sources."""
    machine = _static_agent._machine()
    packaged = tmp_path / machine
    packaged.mkdir()
    compile_agent(str(_static_agent._compiler()), machine, packaged)
    assert sorted(p.name for p in packaged.iterdir()) == ["DIGEST", "SHA256SUMS", "agent", "loader"]
    monkeypatch.setattr(_static_agent, "_compiler", lambda: None)
    monkeypatch.setattr(_static_agent, "_packaged_directory", lambda machine: tmp_path / machine)
    _static_agent._static_or_reason.cache_clear()
    try:
        launch = agent_launch("1:2", setid_allowed=True)
        assert launch.preamble == (packaged / "agent").read_bytes()
        assert launch.argv[:2] == ["/bin/sh", "-c"]
        assert launch.argv[3:] == [
            "adk-sandbox-agent-loader",
            str(len(launch.preamble)),
            SETID_ALLOWED_WORD,
            "1:2",
        ]
        # A binary of other sources (an older wheel's files in a newer checkout) is never used.
        (packaged / "DIGEST").write_text("0" * 64 + "\n")
        _static_agent._static_or_reason.cache_clear()
        with pytest.raises(StaticAgentUnavailableError, match="no C compiler"):
            agent_launch(None)
    finally:
        _static_agent._static_or_reason.cache_clear()


def test_the_aarch64_agent_cross_builds(tmp_path: Path) -> None:
    """The wheel carries an aarch64 agent (an arm64 Mac's Docker Desktop runs aarch64 containers)."""
    compiler = shutil.which("aarch64-linux-gnu-gcc")
    require(compiler is not None, "no aarch64 cross compiler (Debian: gcc-aarch64-linux-gnu)")
    built = compile_agent(str(compiler), "aarch64", tmp_path)
    assert built.agent[:4] == b"\x7fELF" and built.agent[18:20] == (183).to_bytes(2, "little")  # EM_AARCH64
    assert built.loader[18:20] == (183).to_bytes(2, "little") and len(built.loader) < 4096
    assert setid_filter(AARCH64) in built.agent


@pytest.mark.parametrize("shell", ["dash", "busybox"])
def test_the_loader_written_by_printf_runs_its_payload_from_stdin_and_leaves_no_file(
    cache: Path, shell: str, tmp_path: Path
) -> None:
    require(shutil.which(shell) is not None, f"{shell} is missing")
    built, _ = build_static_agent()
    payload = Path("/bin/echo").read_bytes()
    argv = [shell, *(["sh"] if shell == "busybox" else []), "-c", loader_script(built.loader, "unit")]
    argv += ["adk-sandbox-agent-loader", str(len(payload)), "loaded", "fine"]
    done = subprocess.run(
        argv, input=payload + b"frames follow", capture_output=True, timeout=30, check=False,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (0, b"loaded fine\n"), done.stderr
    assert not Path("/tmp/.adk-sandbox-agent-unit").exists()


def test_a_short_payload_fails_the_loader_cleanly(cache: Path) -> None:
    built, _ = build_static_agent()
    argv = ["dash", "-c", loader_script(built.loader, "short"), "loader", "1000"]
    done = subprocess.run(argv, input=b"only a few", capture_output=True, timeout=30, check=False)
    assert done.returncode == 127 and b"ended early" in done.stderr
