"""The in-sandbox agent, session start to first command and per command, flavours alternated in one run.

Run: PYTHONPATH=. .venv/bin/python bench/bench_agent_flavours.py [--quick] [--flavours python,static]
On the Docker runc backend and the base image. Each round opens a fresh session per flavour, in turn
(:func:`_timing.interleaved`): the time from ``backend.session()`` to the end of the first ``true`` (the
container, the probe, the agent's start and one command), then ``true`` in that warm session, then the
agent's resident memory (VmRSS, read by a separate exec as root). Issue 33 chose one agent with it
(docs/docker/agent-channel.md, "One agent"): ``--flavours python,static`` compared the two at commit
6a864af (the last with the Python agent, chosen then by ``ADK_SANDBOX_AGENT``); since, only ``static`` exists.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable

import _timing

from adk_sandbox.executor import ExecRequest, Language
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from adk_sandbox.executor.channel.agent_transport import AgentTransport

TRUE = ExecRequest(language=Language.COMMAND, code="true", timeout=30)


def agent_rss_kib(backend: DockerBackend, session: DockerSession) -> int:
    """The session agent's VmRSS in KiB."""
    transport = session._transport
    assert isinstance(transport, AgentTransport)
    api = backend._client.api
    created = api.exec_create(
        session.container_id, ["cat", f"/proc/{transport.agent_pid}/status"], user="0:0"
    )
    for line in api.exec_start(created["Id"]).decode().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def main() -> None:
    """Print the table."""
    parser = _timing.parser(__doc__)
    parser.add_argument("--flavours", default="static")
    args = parser.parse_args()
    flavours = args.flavours.split(",")
    rounds, warm = (3, 10) if args.quick else (12, 40)
    workspace = tempfile.mkdtemp()
    backend = DockerBackend()
    per_command: dict[str, list[float]] = {f: [] for f in flavours}
    memory: dict[str, list[int]] = {f: [] for f in flavours}
    starts: dict[str, list[float]] = {f: [] for f in flavours}

    def session_round(flavour: str) -> Callable[[], object]:
        def run() -> None:
            os.environ["ADK_SANDBOX_AGENT"] = flavour  # read when the session's first agent starts
            started = time.perf_counter()
            with backend.session(workspace=workspace) as session:
                session.execute(TRUE)
                starts[flavour].append((time.perf_counter() - started) * 1000)
                transport = session._transport
                assert isinstance(transport, AgentTransport)
                assert getattr(transport, "agent_flavour", "static") == flavour
                per_command[flavour].extend(_timing.timed(lambda: session.execute(TRUE), warm).samples)
                memory[flavour].append(agent_rss_kib(backend, session))

        return run

    try:
        _timing.interleaved({f: session_round(f) for f in flavours}, rounds, warm_up=False)
    finally:
        backend.close()
    print(
        f"{_timing.load_note()}; runc, base image, {rounds} sessions and {rounds * warm} warm commands each\n"
    )
    print("| flavour | session start to first `true` p50 | warm `true` p50 / p99 | agent RSS |")
    print("|---|---|---|---|")
    for flavour in flavours:
        commands = _timing.Stats(tuple(per_command[flavour]))
        start = _timing.Stats(tuple(starts[flavour]))
        rss = sorted(memory[flavour])[len(memory[flavour]) // 2]
        warm_ms = f"{commands.p50:.2f} / {commands.p99:.2f} ms"
        print(f"| {flavour} | {start.p50:.0f} ms | {warm_ms} | {rss / 1024:.1f} MiB |")


if __name__ == "__main__":
    main()
