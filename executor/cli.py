"""The ``adk-sandbox`` command (also ``python -m executor``).

``doctor`` lists each backend available on this machine with its isolation class and what it enforces;
``images build`` builds the sandbox images that are missing or outdated.
(``run`` and ``cleanup`` arrive with the Docker backend.)
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from collections.abc import Sequence
from typing import TextIO

from executor.backends.bwrap import get_enforcer
from executor.backends.process import ProcessBackend
from executor.errors import BackendUnavailableError, ExecutorError
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
    _doctor_docker()
    return 0


def _doctor_docker() -> None:
    """The Docker engine and the sandbox images (present and current, outdated, or missing)."""
    import docker  # noqa: PLC0415 - only doctor needs docker-py here

    from executor.backends.docker import images  # noqa: PLC0415

    try:
        client = docker.from_env(timeout=10)
        version = client.version()
        runtimes = sorted(client.info().get("Runtimes") or {})
        client.close()
    except Exception as exc:  # any failure means "no usable engine", shown as such
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        print(f"{'docker engine':<16} {'unavailable':<16} {first} (scripts/setup starts one as root)")
        return
    print(
        f"{'docker engine':<16} {'available':<16} {version.get('Version', '?')} "
        f"(API {version.get('ApiVersion', '?')}), runtimes: {', '.join(runtimes) or 'none'}"
    )
    try:
        statuses = images.check_images()
    except ExecutorError as exc:
        print(f"{'images':<16} {'unknown':<16} {exc}")
        return
    for status in statuses:
        print(f"{'image ' + status.name:<16} {status.state:<16} {status.tag} ({status.detail})")


class _LiveDisplay:
    """Build progress: on a terminal one rewriting status line per build step, plain lines otherwise."""

    _STEP = re.compile(r"^(\S+): (Step \d+/\d+ : .*)$")

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.live = out.isatty()
        self.current = ""  # the key of the live line: "<image> Step n/m" or "<prefix>"
        self.label = ""  # what the live line shows before its latest output

    def line(self, text: str) -> None:
        if not self.live:
            print(text, file=self.out, flush=True)
            return
        if text.startswith("==> "):
            self._finish()
            print(text, file=self.out, flush=True)
            return
        step = self._STEP.match(text)
        prefix, _, rest = text.partition(": ")
        if step:
            self._finish()
            instruction = " ".join(step.group(2).split())
            if len(instruction) > 48:
                instruction = instruction[:47] + "\u2026"
            self.current, self.label = step.group(1) + step.group(2), f"  {step.group(1)} {instruction}"
            self._show(self.label)
        else:
            if not self.current.startswith(prefix):
                self._finish()
                self.current, self.label = prefix, f"  {prefix}"
            self._show(f"{self.label} | {rest.strip()}")

    def _show(self, text: str) -> None:
        width = max(20, shutil.get_terminal_size((100, 20)).columns - 1)
        flat = " ".join(text.split())
        if len(flat) > width:
            flat = flat[: width - 1] + "\u2026"
        self.out.write(f"\r\x1b[K{flat}")
        self.out.flush()

    def _finish(self) -> None:
        """Leave the live line showing its step (not its last output) and move below it."""
        if self.current:
            self._show(self.label)
            self.out.write("\n")
            self.out.flush()
        self.current = self.label = ""

    def close(self) -> None:
        if self.live:
            self._finish()


def images_build(*, base_image: str | None, force: bool) -> int:
    """``adk-sandbox images build``: build what is missing or outdated, showing progress."""
    from executor.backends.docker.images import ImageBuildError, build_images  # noqa: PLC0415

    display = _LiveDisplay(sys.stdout)
    try:
        results = build_images(base_image=base_image, force=force, progress=display.line)
    except ImageBuildError as exc:
        display.close()
        if display.live and exc.output:
            print(exc.output, file=sys.stderr)
        print(f"adk-sandbox: error: {exc}", file=sys.stderr)
        return 1
    except ExecutorError as exc:
        display.close()
        print(f"adk-sandbox: error: {exc}", file=sys.stderr)
        return 1
    display.close()
    built = [r.tag for r in results if r.action == "built"]
    if built:
        print(f"built: {', '.join(built)}")
    else:
        print("all images up to date")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``adk-sandbox`` command."""
    parser = argparse.ArgumentParser(
        prog="adk-sandbox", description=__doc__.splitlines()[0] if __doc__ else None
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("doctor", help="list the backends available here and what each enforces")
    images_parser = commands.add_parser(
        "images", help="the sandbox images (adk-sandbox/base, adk-sandbox/rust)"
    )
    images_commands = images_parser.add_subparsers(dest="images_command", required=True)
    build = images_commands.add_parser(
        "build",
        help="build the images that are missing or outdated",
        description="Build adk-sandbox/base and adk-sandbox/rust when missing or outdated (their build "
        "context changed). Without --base-image the Debian base is the bootstrap image, or "
        "debian:trixie-slim from a registry, or made with images/bootstrap (debootstrap) when no registry "
        "answers.",
    )
    build.add_argument("--base-image", metavar="IMG", help="the Debian image to build the base image on")
    build.add_argument("--force", action="store_true", help="rebuild every image, without the layer cache")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        return doctor()
    if args.command == "images":
        return images_build(base_image=args.base_image, force=args.force)
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
