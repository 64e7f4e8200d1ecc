"""How an agent is started in a container: the Python agent, or the static one for images without python3.

The agent channel (:mod:`.agent_transport`) is one mechanism; what differs between the two agent
*flavours* is only how the exec starts one, an :class:`AgentLaunch` (the exec's argv, and bytes written
to its stdin before the first frame):

* ``python``: ``python3 -I -S -c AGENT_SOURCE adk-sandbox-agent [setid-allowed] [<protected>]``
  (:mod:`.agent`), nothing on stdin. Needs ``python3`` in the image.
* ``static``: ``inside/agent.c``, the same protocol and process-tree rules in C, built on the host as a fully
  static binary (``gcc -static``, glibc's ``libc.a``; the agent never uses the name service, so static
  glibc is safe). It reaches the container without a file: ``/bin/sh -c SCRIPT`` writes the tiny
  ``inside/loader.c`` (about 1.5 KiB, no libc) with the ``printf`` builtin to a fresh, randomly named file
  in ``/tmp`` (else ``$HOME``, ``/dev/shm``), ``chmod 700`` and ``exec`` it; the loader makes itself
  non-dumpable, unlinks its file, reads exactly the agent's bytes from stdin into a sealed ``memfd`` and
  ``execveat``s it as ``adk-sandbox-agent [setid-allowed] [<protected>]``. Needs ``/bin/sh`` (``printf``
  builtin), ``chmod`` and an executable tmpfs (the session's ``/tmp`` is mounted ``exec``). Nothing of the
  agent is ever a file a command could replace, and each start streams a fresh copy.

Both flavours take the same arguments after their name (:func:`.agent.agent_arguments`): the opt-in word
``setid-allowed`` (:data:`.agent.SETID_ALLOWED_WORD`, also in the generated C header, so both read one
spelling) starts the agent without the set-id filter; without it the filter is on, as ever.

The binaries are built once per source into a cache directory named by the SHA-256 of everything that
goes into them (sources, the generated header — the set-id filter of :mod:`.setid` and the opt-in word —,
flags, compiler): a binary that does not match the source is never used, a changed source (``agent.c``,
``loader.c``) is rebuilt. ``scripts/setup`` builds it (``main()`` here); otherwise the first session that
wants it builds it (about a second) when a C compiler with a static libc is present.

Selection (``ADK_SANDBOX_AGENT`` or the transport's ``agent=`` argument): ``static``, ``python`` or
``auto`` (the default): the static agent when it is available (built or buildable), else the Python one.
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
from typing import Literal

from adk_sandbox.executor.channel import agent as _agent
from adk_sandbox.executor.channel.agent import SETID_ALLOWED_WORD, agent_arguments, agent_argv
from adk_sandbox.executor.channel.setid import native_arch, setid_filter

__all__ = [
    "AgentFlavour",
    "AgentLaunch",
    "StaticAgent",
    "StaticAgentUnavailableError",
    "agent_launches",
    "build_static_agent",
    "cache_root",
    "filter_header",
    "load_static_agent",
    "loader_script",
]

log = logging.getLogger(__name__)

AgentFlavour = Literal["auto", "python", "static"]
#: Environment variable choosing the flavour when the transport is not told.
FLAVOUR_VARIABLE = "ADK_SANDBOX_AGENT"
_SOURCES = ("agent.c", "loader.c")
_AGENT_FLAGS = ("-static", "-O2", "-s", "-Wall", "-Wextra", "-fno-strict-aliasing")
_LOADER_FLAGS = (
    "-Os", "-static", "-nostdlib", "-nostartfiles", "-ffreestanding", "-fno-builtin", "-fno-stack-protector",
    "-fno-asynchronous-unwind-tables", "-fno-pie", "-no-pie", "-Wl,--build-id=none", "-Wl,-z,norelro",
    "-Wl,-z,noseparate-code", "-Wl,--gc-sections", "-s", "-Wall", "-Wextra",
)  # fmt: skip
_BUILD_SECONDS = 120.0


class StaticAgentUnavailableError(RuntimeError):
    """The static agent could not be built here (no C compiler or no static C library); says why."""


@dataclasses.dataclass(frozen=True)
class StaticAgent:
    """A built static agent: the agent binary, its loader, and the digest of what they were built from."""

    agent: bytes
    loader: bytes
    digest: str


@dataclasses.dataclass(frozen=True)
class AgentLaunch:
    """How one agent is started: the exec's argv and the bytes written to its stdin before any frame."""

    flavour: Literal["python", "static"]
    argv: list[str]
    preamble: bytes = b""
    #: What the image must provide, quoted when the agent does not start.
    requirement: str = "the session image must provide python3 on PATH"


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
    )


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "gcc", "cc"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _source_text(name: str) -> bytes:
    return resources.files(__package__).joinpath("inside", name).read_bytes()


def _digest(compiler: str, header: str) -> str:
    h = hashlib.sha256()
    for name in _SOURCES:
        h.update(name.encode() + b"\0" + _source_text(name) + b"\0")
    h.update(header.encode() + b"\0")
    h.update(" ".join(_AGENT_FLAGS + _LOADER_FLAGS).encode() + b"\0")
    h.update(f"{os.uname().machine}\0{os.path.basename(compiler)}".encode())
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
    except OSError:
        return None
    if sums != _sums(agent, loader):
        return None  # damaged or tampered with: rebuilt
    return StaticAgent(agent, loader, digest)


def build_static_agent(*, force: bool = False) -> tuple[StaticAgent, Path]:
    """The static agent for the current sources, built into :func:`cache_root` unless already there."""
    compiler = _compiler()
    if compiler is None:
        raise StaticAgentUnavailableError(
            "no C compiler (gcc or cc, or $CC) to build the static agent; install one with a static C "
            "library (Debian: apt install gcc libc6-dev)"
        )
    header = filter_header(native_arch())
    digest = _digest(compiler, header)
    final = cache_root() / f"static-agent-{digest[:32]}"
    if not force:
        built = _load_built(final, digest)
        if built is not None:
            return built, final
    cache_root().mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".static-agent-", dir=cache_root()))
    try:
        for name in _SOURCES:
            (work / name).write_bytes(_source_text(name))
        (work / "setid_filter.h").write_text(header)
        targets = (("agent", "agent.c", _AGENT_FLAGS), ("loader", "loader.c", _LOADER_FLAGS))
        for output, source, flags in targets:
            cmd = [compiler, *flags, "-I", str(work), "-o", str(work / output), str(work / source)]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=_BUILD_SECONDS, check=False)
            if done.returncode != 0:
                raise StaticAgentUnavailableError(
                    f"building the static agent ({source}) failed; a static C library is needed (Debian: "
                    f"apt install gcc libc6-dev): {done.stderr.strip()[-1500:]}"
                )
        agent, loader = (work / "agent").read_bytes(), (work / "loader").read_bytes()
        (work / "SHA256SUMS").write_text(_sums(agent, loader))
        with contextlib.suppress(OSError):
            shutil.rmtree(final)  # an outdated or damaged copy of the same digest
        try:
            os.rename(work, final)
        except OSError:  # another process built it meanwhile
            built = _load_built(final, digest)
            if built is None:
                raise
            return built, final
        return StaticAgent(agent, loader, digest), final
    finally:
        shutil.rmtree(work, ignore_errors=True)


@functools.cache
def _static_or_reason() -> StaticAgent | str:
    try:
        return build_static_agent()[0]
    except (StaticAgentUnavailableError, OSError, subprocess.SubprocessError) as exc:
        return str(exc)


def load_static_agent() -> StaticAgent:
    """The static agent, built on first use (once per process); else :class:`StaticAgentUnavailableError`."""
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


def _static_launch(agent: StaticAgent, protected: str | None, *, setid_allowed: bool = False) -> AgentLaunch:
    script = loader_script(agent.loader, secrets.token_hex(12))
    argv = ["/bin/sh", "-c", script, "adk-sandbox-agent-loader", str(len(agent.agent))]
    return AgentLaunch(
        "static",
        # The loader passes what follows the byte count on to the agent, after its name.
        argv + agent_arguments(protected, setid_allowed=setid_allowed),
        agent.agent,
        "the static agent needs /bin/sh, chmod and an executable /tmp (or $HOME) in the image",
    )


def _flavour(requested: str | None) -> str:
    flavour = requested or os.environ.get(FLAVOUR_VARIABLE) or "auto"
    if flavour not in ("auto", "python", "static"):
        raise ValueError(f"{FLAVOUR_VARIABLE} must be auto, python or static, not {flavour!r}")
    return flavour


def agent_launches(
    requested: str | None,
    protected: str | None,
    source: str | None = None,
    *,
    setid_allowed: bool = False,
) -> list[AgentLaunch]:
    """How to start the next agent, in order of preference: the transport tries each until one answers.

    ``requested`` is the flavour (None: ``$ADK_SANDBOX_AGENT``, else ``auto``). ``auto`` prefers the
    static agent (the same protocol and file operations, about twice as fast per command and a fraction
    of the memory) and falls back to the Python agent when the static one cannot start there (no
    ``/bin/sh`` or no executable ``/tmp``); ``static`` or ``python`` is that one only. ``source`` (a
    Python agent program, for tests) forces the Python flavour. ``setid_allowed`` starts every flavour
    without the set-id filter (the opt-in word on its argv); by default the filter is on.
    """
    flavour = "python" if source is not None else _flavour(requested)
    # Looked up at each start (not bound at import), so the program in force is the module's current one.
    python = AgentLaunch(
        "python", agent_argv(protected, source or _agent.AGENT_SOURCE, setid_allowed=setid_allowed)
    )
    if flavour == "python":
        return [python]
    found = _static_or_reason()
    if isinstance(found, str):
        if flavour == "static":
            raise StaticAgentUnavailableError(found)
        log.info("static agent unavailable, only the Python agent can be used: %s", found)
        return [
            AgentLaunch(
                "python",
                python.argv,
                requirement=f"the session image must provide python3 on PATH (the static agent that needs "
                f"no python3 could not be built: {found})",
            )
        ]
    static = _static_launch(found, protected, setid_allowed=setid_allowed)
    return [static] if flavour == "static" else [static, python]


def main() -> int:
    """Build the static agent (if needed) and print its directory (``scripts/setup`` calls this)."""
    try:
        _, directory = build_static_agent(force="--force" in sys.argv[1:])
    except StaticAgentUnavailableError as exc:
        print(f"static agent: {exc}", file=sys.stderr)
        return 1
    print(directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
