"""The wheel's build hook: the in-sandbox agent, built for the sandboxes' architectures, as package data.

The agent runs inside the sandbox, never on the host, so a pure-Python wheel carries it for every
architecture a sandbox may have, and a plain ``pip install`` (Linux or macOS) needs no C compiler
(``executor/channel/static_agent.py``). Each machine's agent is built with the first compiler found for it
(``x86_64``: ``x86_64-linux-gnu-gcc``, or ``gcc`` on an x86_64 host; ``aarch64``: ``aarch64-linux-gnu-gcc``,
Debian's ``gcc-aarch64-linux-gnu libc6-dev-arm64-cross``, or ``gcc`` on an aarch64 host) into
``adk_sandbox/executor/channel/inside/bin/<machine>/``. A machine without a compiler is left out with a
warning (its users then need a compiler, and are told so), unless ``ADK_SANDBOX_WHEEL_AGENTS`` names the
machines that must be there (``x86_64,aarch64``): then the build fails without them. Editable installs
build nothing (the checkout's sessions build into the cache).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

#: Where the agent's binaries go in the wheel.
TARGET = "adk_sandbox/executor/channel/inside/bin"
_PACKAGES = ("adk_sandbox", "adk_sandbox.executor", "adk_sandbox.executor.channel")


def _static_agent(root: Path) -> types.ModuleType:
    """``static_agent`` of the checkout, imported without running the packages' ``__init__`` (no deps)."""
    package = root / "src" / "adk_sandbox"
    directories = (package, package / "executor", package / "executor" / "channel")
    for name, directory in zip(_PACKAGES, directories, strict=True):
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(
                name, directory / "__init__.py", submodule_search_locations=[str(directory)]
            )
            if spec is None:
                raise ImportError(f"cannot load {directory}")
            sys.modules[name] = importlib.util.module_from_spec(spec)  # not executed: a bare package
    return importlib.import_module("adk_sandbox.executor.channel.static_agent")


def _compiler(machine: str) -> str | None:
    names = [f"{machine}-linux-gnu-gcc"] + (["gcc", "cc"] if os.uname().machine == machine else [])
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


def build_agents(root: Path, out: Path) -> dict[str, Path]:
    """Build the agent for each machine with a compiler here into ``out/<machine>``; what was built."""
    static_agent = _static_agent(root)
    required = {m for m in os.environ.get("ADK_SANDBOX_WHEEL_AGENTS", "").split(",") if m}
    built: dict[str, Path] = {}
    for machine in static_agent.MACHINES:
        compiler = _compiler(machine)
        if compiler is None:
            if machine in required:
                raise RuntimeError(f"no C compiler for the {machine} agent ({machine}-linux-gnu-gcc)")
            print(
                f"adk-sandbox: no {machine} agent in this wheel (no {machine}-linux-gnu-gcc)", file=sys.stderr
            )
            continue
        directory = out / machine
        directory.mkdir(parents=True)
        static_agent.compile_agent(compiler, machine, directory)
        built[machine] = directory
    return built


class CustomBuildHook(BuildHookInterface):  # type: ignore[misc]
    """Adds ``inside/bin/<machine>/`` to the wheel (see the module docstring)."""

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        """Build the agents into a temporary directory and include them."""
        if version == "editable":
            return
        self._out = Path(tempfile.mkdtemp(prefix="adk-sandbox-agents-"))
        for machine, directory in build_agents(Path(self.root), self._out).items():
            for file in directory.iterdir():
                build_data["force_include"][str(file)] = f"{TARGET}/{machine}/{file.name}"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        """Remove the temporary directory."""
        if hasattr(self, "_out"):
            shutil.rmtree(self._out, ignore_errors=True)
