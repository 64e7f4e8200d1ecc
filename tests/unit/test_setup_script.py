"""scripts/setup's gVisor steps, run as bash functions taken from the script itself.

The daemon.json registration of runsc (its arguments, an old entry updated, other keys kept, a malformed
file refused) and the runsc version check (0.0~20240729 or later).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parents[2] / "scripts" / "setup"
WANTED_ARGS = ["--network=none", "--oci-seccomp", "--overlay2=root:memory"]


def _function(text: str, name: str) -> str:
    """The definition of the bash function ``name`` in ``text`` (up to the first line that is ``}``)."""
    found = re.search(rf"^{name}\(\) \{{.*?^\}}$", text, re.M | re.S)
    assert found is not None, f"scripts/setup defines no function {name}"
    return found.group(0)


def _bash(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    text = SETUP.read_text()
    [minimum] = re.findall(r"^runsc_min=\d+$", text, re.M)
    definitions = "\n".join([minimum, _function(text, "register_runsc"), _function(text, "runsc_new_enough")])
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{definitions}\n{script}"],
        env={**os.environ, **env},
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )


def _register(daemon_json: Path, path: str = "/usr/local/bin/runsc") -> subprocess.CompletedProcess[str]:
    return _bash(f"register_runsc {path}", {"ADK_SANDBOX_DAEMON_JSON": str(daemon_json)})


def test_runsc_is_registered_with_a_memory_backed_root_overlay_once(tmp_path: Path) -> None:
    daemon_json = tmp_path / "docker" / "daemon.json"
    first = _register(daemon_json)
    assert (first.returncode, first.stdout) == (0, "changed\n"), first.stderr
    wanted = {"path": "/usr/local/bin/runsc", "runtimeArgs": WANTED_ARGS}
    # experimental: the engine's checkpoints (DockerBackend(checkpoints=True), docs/pause.md)
    assert json.loads(daemon_json.read_text()) == {"runtimes": {"runsc": wanted}, "experimental": True}
    second = _register(daemon_json)
    assert (second.returncode, second.stdout) == (0, "unchanged\n"), second.stderr


def test_an_old_registration_is_updated_and_other_keys_are_kept(tmp_path: Path) -> None:
    daemon_json = tmp_path / "daemon.json"
    old = {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none", "--oci-seccomp"]}
    daemon_json.write_text(
        json.dumps({"log-level": "warn", "runtimes": {"runsc": old, "kata": {"path": "/k"}}})
    )
    result = _register(daemon_json)
    assert (result.returncode, result.stdout) == (0, "changed\n"), result.stderr
    assert json.loads(daemon_json.read_text()) == {
        "log-level": "warn",
        "runtimes": {
            "runsc": {"path": "/usr/local/bin/runsc", "runtimeArgs": WANTED_ARGS},
            "kata": {"path": "/k"},
        },
        "experimental": True,
    }


def test_a_malformed_daemon_json_stops_setup_and_is_left_alone(tmp_path: Path) -> None:
    daemon_json = tmp_path / "daemon.json"
    daemon_json.write_text('{"runtimes": ')
    result = _register(daemon_json)
    assert result.returncode != 0
    assert "is not valid JSON" in result.stderr
    assert daemon_json.read_text() == '{"runtimes": '


@pytest.mark.parametrize(
    ("version", "new_enough"),
    [
        ("runsc version 0.0~20221219.0", False),  # Debian 12 (bookworm)
        ("runsc version 0.0~20240729.0", True),  # Debian 13 (trixie)
        ("runsc version release-20250512.0", True),  # an upstream release
        ("runsc version release-20231009.0", False),
        ("runsc version unknown", False),
        ("", False),
    ],
)
def test_runsc_versions_before_20240729_are_too_old(tmp_path: Path, version: str, new_enough: bool) -> None:
    fake = tmp_path / "runsc"
    fake.write_text(f"#!/bin/sh\n[ \"$1\" = --version ] && printf '%s\\nspec: 1.0.2-dev\\n' '{version}'\n")
    fake.chmod(0o755)
    result = _bash(f"runsc_new_enough {fake} && echo yes || echo no", {})
    assert result.stdout == ("yes\n" if new_enough else "no\n"), result.stderr


def test_a_missing_runsc_is_not_new_enough(tmp_path: Path) -> None:
    result = _bash(f"runsc_new_enough {tmp_path / 'absent'} && echo yes || echo no", {})
    assert result.stdout == "no\n", result.stderr
