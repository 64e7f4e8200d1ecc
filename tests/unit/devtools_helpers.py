"""Helpers shared by the devtools tests: workspaces with a chosen resolver path."""

from __future__ import annotations

import os

import pytest

from adk_sandbox.devtools import Workspace
from adk_sandbox.executor.workspace.beneath import openat2_available

RESOLVERS = ["openat2", "walk"]


def make_workspace(root: str | os.PathLike[str], resolver: str, **options: object) -> Workspace:
    """A workspace whose paths resolve through ``openat2`` (fast path) or the ``O_NOFOLLOW`` walk only."""
    if resolver == "openat2" and not openat2_available():
        pytest.skip("this kernel has no usable openat2; the walk is tested on its own")
    ws = Workspace(root, **options)  # type: ignore[arg-type]
    ws._root.use_openat2 = resolver == "openat2"
    return ws
