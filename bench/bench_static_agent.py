"""The static agent (C) against the Python agent, side by side in one run (issue 11, "any image").

Run: PYTHONPATH=. .venv/bin/python bench/bench_static_agent.py [--repeat N] [--runtime runsc]
Prints a Markdown table (medians, ratios) for docs/DOCKER.md ("Images without Python"), on the base image
(which has python3, so both flavours can run):
* agent start: one exec to HELLO (the static agent's includes streaming its ~0.8 MB binary over stdin);
* ``true`` in a warm session;
* 200 MB with a 4 KiB cap (both discard at the source);
* the agent's resident memory while idle.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable

from adk_sandbox.executor import ExecRequest, Language
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from adk_sandbox.executor.backends.docker._daemon import daemon_socket_path
from adk_sandbox.executor.backends.docker._exec import DockerExecTransport
from adk_sandbox.executor.channel.agent_transport import AgentTransport

FLOOD_BYTES = 200_000_000
FLAVOURS = ("python", "static")


def interleaved_ms(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Medians of each function, run in turn so machine drift hits all alike."""
    for fn in fns.values():
        fn()  # warm-up
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            started = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - started) * 1000)
    return {name: statistics.median(values) for name, values in samples.items()}


def agent_start(backend: DockerBackend, session: DockerSession, flavour: str) -> Callable[[], object]:
    """One agent started to HELLO in the session's container, then closed."""

    def start() -> None:
        opener = DockerExecTransport(backend._client, session.container_id, daemon_socket_path())
        transport = AgentTransport(
            opener.open_agent_stream, agent="static" if flavour == "static" else "python"
        )
        try:
            transport._agent_for(session._user, time.monotonic() + 60)
        finally:
            transport.close()

    return start


def rss_kib(backend: DockerBackend, session: DockerSession) -> int:
    """The session agent's VmRSS, read by a separate exec as root."""
    transport = session._transport
    assert isinstance(transport, AgentTransport)
    created = backend._client.api.exec_create(
        session.container_id, ["cat", f"/proc/{transport.agent_pid}/status"], user="0:0"
    )
    for line in backend._client.api.exec_start(created["Id"]).decode().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def open_session(backend: DockerBackend, workspace: str, flavour: str) -> DockerSession:
    os.environ["ADK_SANDBOX_AGENT"] = flavour  # read when the session's first agent starts
    session = backend.session(workspace=workspace)
    session.__enter__()
    transport = session._transport
    assert isinstance(transport, AgentTransport) and transport.agent_flavour == flavour
    transport._flavour = "static" if flavour == "static" else "python"  # also for a restarted agent
    return session


def _flavour_of(session: DockerSession) -> str | None:
    transport = session._transport
    assert isinstance(transport, AgentTransport)
    return transport.agent_flavour


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--runtime", default=None, help="e.g. runsc")
    args = parser.parse_args()
    workspace = tempfile.mkdtemp()
    backend = DockerBackend(runtime=args.runtime)
    true = ExecRequest(language=Language.COMMAND, code="true", timeout=30)
    flood = ExecRequest(
        language=Language.COMMAND, code=f"head -c {FLOOD_BYTES} /dev/zero", timeout=120, max_output_bytes=4096
    )
    sessions = {flavour: open_session(backend, workspace, flavour) for flavour in FLAVOURS}
    # Agent starts in containers of their own: a new agent kills any other agent of its container.
    starters = {flavour: open_session(backend, workspace, flavour) for flavour in FLAVOURS}
    try:
        starts = interleaved_ms({f: agent_start(backend, s, f) for f, s in starters.items()}, args.repeat)
        warm_fns = {f: (lambda s=s: s.execute(true)) for f, s in sessions.items()}
        warm = interleaved_ms(warm_fns, args.repeat * 3)
        floods = interleaved_ms({f: (lambda s=s: s.execute(flood)) for f, s in sessions.items()}, 3)
        memory = {f: rss_kib(backend, s) for f, s in sessions.items()}
        assert all(_flavour_of(s) == f for f, s in sessions.items())
    finally:
        for session in [*sessions.values(), *starters.values()]:
            session.__exit__(None, None, None)
        backend.close()
    print(f"runtime: {args.runtime or 'runc (default)'}, repeat {args.repeat}, base image\n")
    print("| what | static (C) | Python | static / Python |")
    print("|---|---|---|---|")
    for name, values, unit in (
        ("agent start (exec to HELLO)", starts, "ms"),
        ("session `true`, warm", warm, "ms"),
        ("200 MB, 4 KiB kept", floods, "ms"),
        ("agent resident memory", memory, "KiB"),
    ):
        ours, theirs = float(values["static"]), float(values["python"])
        print(f"| {name} | {ours:.2f} {unit} | {theirs:.2f} {unit} | {ours / theirs:.2f}x |")


if __name__ == "__main__":
    main()
