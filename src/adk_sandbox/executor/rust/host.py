"""The host's Rust toolchain, for running the pipeline on host backends (ProcessBackend, bubblewrap).

Commands on a host backend run with a cleared environment (no PATH, no RUSTUP_HOME), so the pipeline
needs absolute paths: the sysroot's real ``rustc`` (not rustup's proxy), the linker, and the directory of
prebuilt serde_json rlibs made by ``scripts/build-rust-deps`` for exactly this compiler (an rlib is only
usable by the rustc that built it, hence the cache is keyed by rustc's commit hash).
"""

from __future__ import annotations

import functools
import os
import subprocess
from dataclasses import dataclass

from adk_sandbox.executor.backends.process import probe_toolchain
from adk_sandbox.executor.types import Language

__all__ = ["BUILD_DEPS_SCRIPT", "HostRust", "host_rust", "rust_deps_cache_dir"]

BUILD_DEPS_SCRIPT = "scripts/build-rust-deps"
"""The script (in the project checkout, run by ``scripts/setup``) that builds serde_json for the host."""


@dataclass(frozen=True)
class HostRust:
    """The host's rustc as the pipeline starts it, and where its serde_json rlibs are expected."""

    rustc: str
    """Absolute path of the real compiler in the sysroot."""
    args: tuple[str, ...]
    """Arguments it needs in a cleared environment (the absolute linker path)."""
    sysroot: str
    """The toolchain's installation: must be readable inside an enforcer's sandbox."""
    version: str
    """``rustc -vV``'s commit hash (or release when there is none): the key of the deps cache."""
    deps_dir: str
    """Where ``scripts/build-rust-deps`` puts serde_json for this compiler (may not exist yet)."""

    @property
    def deps_available(self) -> bool:
        """True when the prebuilt ``libserde_json.rlib`` is there."""
        return os.path.isfile(os.path.join(self.deps_dir, "libserde_json.rlib"))

    @property
    def read_only_paths(self) -> tuple[str, ...]:
        """Host paths a sandbox policy must make readable for the pipeline to compile there."""
        return (self.sysroot, self.deps_dir)


def rust_deps_cache_dir(version: str) -> str:
    """The deps directory for a rustc version key (same rule as ``scripts/build-rust-deps``)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "adk-sandbox", "rust-deps", version)


@functools.lru_cache(maxsize=8)
def host_rust(search_path: str | None = None) -> HostRust | None:
    """Find rustc on ``search_path`` (default: the caller's PATH) and describe it, or None if absent."""
    if search_path is None:
        search_path = os.environ.get("PATH")
    toolchain = probe_toolchain(Language.RUST, search_path)
    if toolchain is None or not toolchain.install_roots:
        return None
    # The pipeline passes its own --edition; everything else (the linker) is needed as it is.
    args = tuple(arg for arg in toolchain.extra_args if not arg.startswith("--edition"))
    try:
        done = subprocess.run(
            [toolchain.program, "-vV"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    fields = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    commit = fields.get("commit-hash", "")
    # Same rule as scripts/build-rust-deps: builds that do not know their commit are keyed by release.
    version = commit if commit and commit != "unknown" else f"release-{fields.get('release', 'unknown')}"
    return HostRust(
        rustc=toolchain.program,
        args=args,
        sysroot=toolchain.install_roots[0],
        version=version,
        deps_dir=rust_deps_cache_dir(version),
    )
