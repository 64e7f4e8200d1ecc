"""Where things are inside every sandbox this project starts, whatever the engine.

A container and a Pod give commands the same home directory and refuse the same kernel paths as mount
points, so a workspace, a tmpfs or a policy path means the same thing on each engine.
"""

from __future__ import annotations

__all__ = ["AGENT_MOUNT", "DIRECT_MOUNT", "HOME_DIR", "KERNEL_PATHS"]

#: HOME of every command: a size-limited tmpfs (Docker) or memory-backed emptyDir (Kubernetes).
HOME_DIR = "/home/sandbox"
#: Where a session's direct egress socket directory is bound read-only (docs/network.md, "Speed").
DIRECT_MOUNT = "/run/adk-sandbox-egress"
#: Where a runc keeper's agent binary is bound read-only (docs/pause.md, "runc").
AGENT_MOUNT = "/run/adk-sandbox-agent"
#: The kernel's file systems: never a workspace, a tmpfs or a policy mount, nor under one.
KERNEL_PATHS = ("/proc", "/sys", "/dev")
