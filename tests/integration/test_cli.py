"""The adk-sandbox command, run as a user would."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.bwrap
def test_doctor_lists_each_backend_with_its_isolation(bwrap_enforcer: object) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "adk_sandbox", "doctor"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    process = next(line for line in lines if line.startswith("process "))
    bwrap = next(line for line in lines if line.startswith("process+bwrap "))
    assert "subprocess_only" in process and "enforces: timeout, env" in process
    assert "commands see: host_filesystem, host_environment, host_programs" in done.stdout
    assert "commands see: no host state" in done.stdout  # docker (or wasm)
    assert "os_enforced" in bwrap and "network" in bwrap
    # Bubblewrap carries a NetworkPolicy through its forwarder, which the system's Python runs.
    assert (
        "network policy: yes (network=NetworkPolicy; the in-namespace forwarder runs on /usr/" in done.stdout
    )
