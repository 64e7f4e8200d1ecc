"""The start-up probe's script, run by the host's /bin/sh with only ``chmod`` and ``rm`` on PATH.

The script is what every session start runs inside its container (each process it creates costs a fork
and an exec, several ms each under gVisor): it must need no other program, read the nonce, say whether a
set-id mode could be set, and leave no scratch file, whatever the outcome.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from adk_sandbox.executor.channel.probe import _probe_script

RANDOM_PART = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def only_chmod_and_rm(tmp_path: Path) -> Path:
    """A PATH directory holding nothing but ``chmod`` and ``rm``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("chmod", "rm"):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    return bin_dir


def _probe(bin_dir: Path, tmpdir: Path, nonce: Path | None) -> subprocess.CompletedProcess[str]:
    script = _probe_script(RANDOM_PART, capabilities=False, nonce=nonce is not None)
    return subprocess.run(
        ["/bin/sh", "-c", script, "adk-sandbox-probe", *([str(nonce)] if nonce else [])],
        env={"PATH": str(bin_dir), "TMPDIR": str(tmpdir)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_the_probe_needs_only_chmod_and_rm_and_leaves_nothing(
    only_chmod_and_rm: Path, tmp_path: Path
) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    nonce = tmp_path / "nonce"
    nonce.write_text("the-token")  # no newline, as the host writes it
    result = _probe(only_chmod_and_rm, scratch, nonce)
    # Nothing refuses set-id modes on the host (no filter, the file is the caller's): the probe says so.
    assert result.stdout.split() == ["setid-allowed", "the-token"], result
    assert "not found" not in result.stderr, result
    assert list(scratch.iterdir()) == []


def test_a_missing_nonce_or_tmp_is_reported_not_taken_for_a_pass(
    only_chmod_and_rm: Path, tmp_path: Path
) -> None:
    result = _probe(only_chmod_and_rm, tmp_path / "no-such-dir", tmp_path / "no-nonce")
    assert result.stdout.split() == [], result  # neither setid word nor a token: the session is refused


def test_an_existing_file_at_the_name_is_not_reused(only_chmod_and_rm: Path, tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    planted = scratch / f".adk-sandbox-probe-{RANDOM_PART}"
    planted.symlink_to(tmp_path / "target")  # a link planted at the name: the create must not follow it
    result = _probe(only_chmod_and_rm, scratch, None)
    assert result.stdout.split() == [], result
    assert not (tmp_path / "target").exists()
