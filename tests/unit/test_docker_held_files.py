"""The held-file checks look only beneath each bind mount's source, whatever the sandbox's list says.

The list of held files is written inside the sandbox (its own shell can print any line), so these are
the forged lines a hostile sandbox can send: ``..`` out of the mount, a symlink it planted in the
workspace pointing out, an absolute one. The host files they name exist and then vanish or grow: the
checks must neither refuse the resume for them (which told the caller whether a host path exists) nor
report their sizes. The integration test (test_docker_checkpoint.py) forges a line with a real program.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from adk_sandbox.executor.backends.docker._held import HeldFile, held_sizes, missing_held_files
from adk_sandbox.executor.errors import SandboxFailedError


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (outside / "secret").write_text("host\n")
    (workspace / "kept.txt").write_text("kept\n")
    os.symlink("../outside", workspace / "relative")
    os.symlink(str(outside), workspace / "absolute")
    os.symlink("kept.txt", workspace / "inner")  # stays inside: followed
    return workspace, outside


FORGED = ("../outside/secret", "relative/secret", "absolute/secret", "a/../../outside/secret")


@pytest.mark.parametrize("rel", FORGED)
def test_a_line_leading_out_of_the_mount_is_never_looked_at(layout: tuple[Path, Path], rel: str) -> None:
    workspace, outside = layout
    held: dict[str, HeldFile] = {f"/ws/{rel}": (str(workspace), rel)}
    assert held_sizes(held) == {}  # no size of a host file outside
    (outside / "secret").unlink()
    missing_held_files(held, {})  # its absence refuses nothing


def test_files_of_the_mount_are_checked(layout: tuple[Path, Path]) -> None:
    workspace, _ = layout
    held: dict[str, HeldFile] = {
        "/ws/kept.txt": (str(workspace), "kept.txt"),
        "/ws/inner": (str(workspace), "inner"),
        "/ws": (str(workspace), ""),
    }
    sizes = held_sizes(held)
    assert sizes == {"/ws/kept.txt": 5, "/ws/inner": 5}
    missing_held_files(held, sizes)
    (workspace / "kept.txt").write_text("longer now\n")
    with pytest.raises(SandboxFailedError, match=r"'/ws/kept.txt': 5 -> 11 bytes"):
        missing_held_files(held, sizes)
    (workspace / "kept.txt").unlink()
    with pytest.raises(SandboxFailedError, match=r"paused \('/ws/inner', '/ws/kept.txt'"):
        missing_held_files(held, {})
