"""The in-sandbox agent: ``inside/agent.c``, a static binary, and how an exec starts it in a sandbox.

:func:`load_static_agent` finds the binary (the wheel's, else the cache's, built by
:func:`build_static_agent`; else :class:`StaticAgentUnavailableError`); :func:`agent_launch` gives the
exec's argv and stdin that deliver it through the file-less loader. ``main()`` is ``scripts/setup``'s build.
See docs/docker/agent-channel.md, section "The agent binary, and why there is one agent".
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path

from adk_sandbox.executor._layout import AGENT_MOUNT
from adk_sandbox.executor.channel.agent import AGENT_ARGV0, KEEPER_WORD, SETID_ALLOWED_WORD, agent_arguments
from adk_sandbox.executor.channel.setid import setid_filter

__all__ = [
    "AgentLaunch",
    "StaticAgent",
    "StaticAgentUnavailableError",
    "agent_launch",
    "bound_agent_directory",
    "build_static_agent",
    "cache_root",
    "filter_header",
    "load_static_agent",
    "loader_script",
]

log = logging.getLogger(__name__)

_SOURCES = ("agent.c", "loader.c")
_AGENT_FLAGS = ("-static", "-O2", "-s", "-Wall", "-Wextra", "-fno-strict-aliasing")
_LOADER_FLAGS = (
    "-Os", "-static", "-nostdlib", "-nostartfiles", "-ffreestanding", "-fno-builtin", "-fno-stack-protector",
    "-fno-asynchronous-unwind-tables", "-fno-pie", "-no-pie", "-Wl,--build-id=none", "-Wl,-z,norelro",
    "-Wl,-z,noseparate-code", "-Wl,--gc-sections", "-s", "-Wall", "-Wextra",
)  # fmt: skip
_BUILD_SECONDS = 120.0
#: What to install, quoted when no agent binary can be had.
_INSTALL = (
    "install a wheel of adk-sandbox built with the agent for this architecture, or a C compiler with a "
    "static C library (Debian: apt install gcc libc6-dev) and run scripts/setup or "
    "`python -m adk_sandbox.executor.channel.static_agent`"
)
#: The sandbox's machine names (``uname -m``) with a prebuilt agent possible, and their AUDIT_ARCH values.
MACHINES = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}


class StaticAgentUnavailableError(RuntimeError):
    """No agent binary for the sandbox's architecture (none packaged, none buildable here); says why."""


@dataclasses.dataclass(frozen=True)
class StaticAgent:
    """A built agent: the agent binary, its loader, and the digest of what they were built from."""

    agent: bytes
    loader: bytes
    digest: str


@dataclasses.dataclass(frozen=True)
class AgentLaunch:
    """How one agent is started: the exec's argv and the bytes written to its stdin before any frame.

    ``requirement`` (what the image must provide) is quoted when the agent does not start. Tests start
    stand-in agents with a launch of their own (``AgentTransport(launch=...)``).
    """

    argv: list[str]
    preamble: bytes = b""
    requirement: str = "the agent needs /bin/sh, chmod and an executable /tmp (or $HOME) in the image"


def filter_header(arch: int) -> str:
    """The C header of the set-id rule: the filter and the word that opts out of it.

    :func:`.setid.setid_filter` as bytes and :data:`.agent.SETID_ALLOWED_WORD`: one source of truth for
    both agents.
    """
    try:
        program = setid_filter(arch)
    except KeyError:
        program = b""  # no filter for this architecture: the agent refuses to start commands
    body = ",".join(str(b) for b in program) or "0"
    return (
        "/* generated from executor/channel/setid.py setid_filter() and agent.py: do not edit */\n"
        f"static const unsigned char SETID_FILTER[] __attribute__((aligned(8))) = {{{body}}};\n"
        f"#define SETID_FILTER_LEN {len(program)}\n"
        f'#define SETID_ALLOWED_WORD "{SETID_ALLOWED_WORD}"\n'
        f'#define KEEPER_WORD "{KEEPER_WORD}"\n'
    )


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "gcc", "cc"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _source_text(name: str) -> bytes:
    return resources.files(__package__).joinpath("inside", name).read_bytes()


def source_digest(machine: str) -> str:
    """The SHA-256 of what an agent for ``machine`` is built from: sources, generated header, flags."""
    h = hashlib.sha256()
    for name in _SOURCES:
        h.update(name.encode() + b"\0" + _source_text(name) + b"\0")
    h.update(filter_header(MACHINES[machine]).encode() + b"\0")
    h.update(" ".join(_AGENT_FLAGS + _LOADER_FLAGS).encode() + b"\0")
    h.update(machine.encode())
    return h.hexdigest()


def cache_root() -> Path:
    """Where built agents are kept: ``$ADK_SANDBOX_CACHE``, else ``$XDG_CACHE_HOME`` or ``~/.cache``."""
    explicit = os.environ.get("ADK_SANDBOX_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "adk-sandbox"


def _sums(agent: bytes, loader: bytes) -> str:
    return f"{hashlib.sha256(agent).hexdigest()}  agent\n{hashlib.sha256(loader).hexdigest()}  loader\n"


def _load_built(directory: Path, digest: str) -> StaticAgent | None:
    try:
        agent = (directory / "agent").read_bytes()
        loader = (directory / "loader").read_bytes()
        sums = (directory / "SHA256SUMS").read_text()
        built_from = (directory / "DIGEST").read_text().strip()
    except OSError:
        return None
    if sums != _sums(agent, loader) or built_from != digest:
        return None  # damaged, tampered with or of other sources: not used
    return StaticAgent(agent, loader, digest)


def compile_agent(compiler: str, machine: str, directory: Path) -> StaticAgent:
    """Build the agent and its loader for ``machine`` with ``compiler`` into ``directory`` (which exists).

    Writes ``agent``, ``loader``, ``SHA256SUMS`` and ``DIGEST`` (:func:`source_digest`); the wheel's build
    hook (``hatch_build.py``) calls it too, with a cross compiler for another machine.
    """
    for name in _SOURCES:
        (directory / name).write_bytes(_source_text(name))
    (directory / "setid_filter.h").write_text(filter_header(MACHINES[machine]))
    targets = (("agent", "agent.c", _AGENT_FLAGS), ("loader", "loader.c", _LOADER_FLAGS))
    for output, source, flags in targets:
        cmd = [compiler, *flags, "-I", str(directory), "-o", str(directory / output), str(directory / source)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=_BUILD_SECONDS, check=False)
        if done.returncode != 0:
            raise StaticAgentUnavailableError(
                f"building the agent ({source}) failed; a static C library is needed (Debian: apt install "
                f"gcc libc6-dev): {done.stderr.strip()[-1500:]}"
            )
    for name in (*_SOURCES, "setid_filter.h"):
        (directory / name).unlink()
    agent, loader = (directory / "agent").read_bytes(), (directory / "loader").read_bytes()
    digest = source_digest(machine)
    (directory / "SHA256SUMS").write_text(_sums(agent, loader))
    (directory / "DIGEST").write_text(digest + "\n")
    return StaticAgent(agent, loader, digest)


def _machine() -> str:
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(os.uname().machine, os.uname().machine)
    if machine not in MACHINES:
        raise StaticAgentUnavailableError(f"the agent is not made for the architecture {machine}")
    return machine


def build_static_agent(*, force: bool = False) -> tuple[StaticAgent, Path]:
    """The agent for the current sources, built into :func:`cache_root` unless already there."""
    machine = _machine()
    compiler = _compiler()
    if compiler is None:
        raise StaticAgentUnavailableError(
            f"no agent binary for {machine} and no C compiler to build one: {_INSTALL}"
        )
    digest = source_digest(machine)
    key = hashlib.sha256(f"{digest}\0{os.path.basename(compiler)}".encode()).hexdigest()
    final = cache_root() / f"static-agent-{key[:32]}"
    if not force:
        built = _load_built(final, digest)
        if built is not None:
            return built, final
    cache_root().mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".static-agent-", dir=cache_root()))
    try:
        fresh = compile_agent(compiler, machine, work)
        with contextlib.suppress(OSError):
            shutil.rmtree(final)  # an outdated or damaged copy of the same digest
        try:
            os.rename(work, final)
        except OSError:  # another process built it meanwhile
            built = _load_built(final, digest)
            if built is None:
                raise
            return built, final
        return fresh, final
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _packaged_directory(machine: str) -> Path:
    return Path(str(resources.files(__package__).joinpath("inside", "bin", machine)))


def packaged_agent(machine: str) -> StaticAgent | None:
    """The wheel's agent for ``machine`` (``inside/bin/<machine>/``), if it was built from these sources."""
    return _load_built(_packaged_directory(machine), source_digest(machine))


@functools.cache
def _static_or_reason() -> StaticAgent | str:
    try:
        packaged = packaged_agent(_machine())
        return packaged if packaged is not None else build_static_agent()[0]
    except (StaticAgentUnavailableError, OSError, subprocess.SubprocessError) as exc:
        return str(exc)


def load_static_agent() -> StaticAgent:
    """The agent: the wheel's, else the cache's (built on first use, once per process), else an error."""
    found = _static_or_reason()
    if isinstance(found, str):
        raise StaticAgentUnavailableError(found)
    return found


def loader_script(loader: bytes, token: str) -> str:
    """The ``sh -c`` script that writes ``loader`` with the printf builtin and execs it (``"$@"``: its args).

    Only shell builtins are needed besides ``chmod``: ``set -C`` makes the redirection fail rather than
    reuse a file that already exists at the (random) name; the loader unlinks it as soon as it runs.
    ``umask 077`` is for that file only: the umask the exec gave is back before the agent starts, since
    its commands inherit it (files they make must get the modes they would get without the agent).
    """
    escaped = "".join(chr(b) if 0x20 <= b < 0x7F and chr(b) not in "'\\%" else f"\\{b:03o}" for b in loader)
    return (
        "mask=$(umask); umask 077; set -C\n"
        'for d in /tmp "$HOME" /dev/shm; do\n'
        f'  f="$d/.adk-sandbox-agent-{token}"\n'
        f"  if printf '{escaped}' >\"$f\" 2>/dev/null; then\n"
        '    chmod 700 "$f" && umask "$mask" && exec "$f" "$@"\n'
        '    rm -f "$f"; exit 126\n'
        "  fi\n"
        "done\n"
        'echo "adk-sandbox-agent: no writable directory for its loader (/tmp, \\$HOME, /dev/shm)" >&2\n'
        "exit 126\n"
    )


def bound_agent_directory() -> str:
    """A host directory holding the agent binary alone, to bind read-only at :data:`AGENT_MOUNT`.

    For a keeper that CRIU checkpoints (runc): CRIU 4.1 restores no executable from a memfd, the
    loader's way. Named by the binary's digest and never rewritten, so a paused container's executable is
    there at its restore whatever agent later versions build.
    """
    agent = load_static_agent().agent
    directory = cache_root() / f"bound-agent-{hashlib.sha256(agent).hexdigest()[:32]}"
    if (directory / AGENT_ARGV0).is_file():
        return str(directory)
    cache_root().mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".bound-agent-", dir=cache_root()))
    try:
        (work / AGENT_ARGV0).write_bytes(agent)
        (work / AGENT_ARGV0).chmod(0o555)
        work.chmod(0o755)
        os.rename(work, directory)
    except OSError:  # made meanwhile by another process
        shutil.rmtree(work, ignore_errors=True)
        if not (directory / AGENT_ARGV0).is_file():
            raise
    return str(directory)


def agent_launch(
    protected: str | None,
    *,
    setid_allowed: bool = False,
    keeper_lifetime: int | None = None,
    bound: bool = False,
) -> AgentLaunch:
    """How to start the next agent: the loader script, then the agent's bytes on stdin.

    ``setid_allowed`` starts it without the set-id filter (the opt-in word on its argv); by default the
    filter is on. ``keeper_lifetime`` makes it a container's keeper (its command, living that many
    seconds at most; :data:`.agent.KEEPER_WORD`), which then reads the agent's user from stdin.
    ``bound`` starts the binary bound at :data:`AGENT_MOUNT` instead (:func:`bound_agent_directory`).
    :class:`StaticAgentUnavailableError` when there is no binary (docs/docker/agent-channel.md, "Build").
    """
    if bound:  # the binary bound at AGENT_MOUNT (bound_agent_directory): no loader, nothing on stdin
        argv = [f"{AGENT_MOUNT}/{AGENT_ARGV0}"]
        if keeper_lifetime is not None:
            argv += [KEEPER_WORD, str(keeper_lifetime)]
        return AgentLaunch(argv + agent_arguments(protected, setid_allowed=setid_allowed), b"")
    agent = load_static_agent()
    script = loader_script(agent.loader, secrets.token_hex(12))
    argv = ["/bin/sh", "-c", script, "adk-sandbox-agent-loader", str(len(agent.agent))]
    if keeper_lifetime is not None:
        argv += [KEEPER_WORD, str(keeper_lifetime)]
    # The loader passes what follows the byte count on to the agent, after its name.
    return AgentLaunch(argv + agent_arguments(protected, setid_allowed=setid_allowed), agent.agent)


def main() -> int:
    """Build the agent (if needed) and print its directory (``scripts/setup`` calls this)."""
    try:
        _, directory = build_static_agent(force="--force" in sys.argv[1:])
    except StaticAgentUnavailableError as exc:
        print(f"agent: {exc}", file=sys.stderr)
        return 1
    print(directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
