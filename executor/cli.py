"""The ``adk-sandbox`` command (also ``python -m executor``).

``doctor`` lists each backend available on this machine with its isolation class and what it enforces.
(``run``, ``cleanup`` and ``images`` arrive with the Docker backend.)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from executor.backends.bwrap import get_enforcer
from executor.backends.process import ProcessBackend
from executor.errors import BackendUnavailableError
from executor.policy import SandboxPolicy
from executor.types import Capabilities

__all__ = ["main"]

_FLAGS = ("timeout", "memory", "cpu", "pids", "network", "fs_read", "fs_write", "env")


def _describe(name: str, caps: Capabilities) -> str:
    enforced = [flag for flag in _FLAGS if getattr(caps, flag)]
    missing = [flag for flag in _FLAGS if not getattr(caps, flag)]
    languages = ", ".join(lang.value for lang in caps.languages) or "none"
    return (
        f"{name:<16} {caps.isolation.value:<16} enforces: {', '.join(enforced) or 'nothing'}\n"
        f"{'':<16} {'':<16} not enforced: {', '.join(missing) or 'nothing'}\n"
        f"{'':<16} {'':<16} languages: {languages}"
    )


def doctor() -> int:
    """Print every backend usable here; exit 0 when at least the host backend works."""
    print(f"{'backend':<16} {'isolation':<16} details")
    print(_describe("process", ProcessBackend().capabilities()))
    try:
        enforcer = get_enforcer()
    except BackendUnavailableError as exc:
        print(f"{'process+bwrap':<16} {'unavailable':<16} {exc}")
    else:
        # The policy doctor reports is the strictest one bubblewrap can enforce.
        policy = SandboxPolicy(allow_process_spawn=True)
        print(_describe("process+bwrap", ProcessBackend.with_sandbox(enforcer, policy).capabilities()))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``adk-sandbox`` command."""
    parser = argparse.ArgumentParser(
        prog="adk-sandbox", description=__doc__.splitlines()[0] if __doc__ else None
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("doctor", help="list the backends available here and what each enforces")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        return doctor()
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
