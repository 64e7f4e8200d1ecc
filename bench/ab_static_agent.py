"""The static agent of a git revision against the working tree's, side by side in one run (issue 11).

Run: PYTHONPATH=. .venv/bin/python bench/ab_static_agent.py REV [--quick] [--runtime runsc]
Two sessions of one workspace, the first running the agent built from ``agent.c`` at ``REV`` and the
second the current one, timed interleaved with host ``subprocess.run(["sh", "-c", "true"])`` and the bash
tool (``DevToolset`` on a Docker workspace, current code): on a shared machine only a comparison made in
one loop says what a change to the agent is worth; the host rows keep the ratios comparable with
BENCHMARKS.md. Both agents are built into the usual cache (keyed by their source).
"""

from __future__ import annotations

import asyncio
import subprocess

from _fixtures import TRUE, owned_workspace
from _timing import Row, interleaved, parser, print_section

from adk_sandbox.devtools import DevToolset, Workspace
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from adk_sandbox.executor.channel import static_agent

HOST_ANCHOR = 'host `subprocess.run(["sh","-c","true"])`'


def _started_with(source: bytes | None, backend: DockerBackend, workspace: str) -> DockerSession:
    """A session whose agent was built from ``source`` (None: the working tree's ``agent.c``)."""
    original = static_agent._source_text
    if source is not None:
        static_agent._source_text = lambda name: source if name == "agent.c" else original(name)
    static_agent._static_or_reason.cache_clear()
    try:
        session = backend.session(workspace=workspace)
        session.start()  # the agent starts here (the session's probe is its first command)
        return session
    finally:
        static_agent._source_text = original
        static_agent._static_or_reason.cache_clear()


def _agent_c_at(rev: str) -> bytes:
    """agent.c as of ``rev`` (executor/channel/inside/, before that executor/backends/docker/agent/)."""
    for path in ("executor/channel/inside/agent.c", "executor/backends/docker/agent/agent.c"):
        shown = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, check=False)
        if shown.returncode == 0:
            return shown.stdout
    raise SystemExit(f"no agent.c at {rev}")


def main() -> None:
    args = parser(__doc__)
    args.add_argument("rev", help="the git revision whose agent.c is the baseline")
    args.add_argument("--runtime", help="the container runtime (runsc: gVisor); default runc")
    options = args.parse_args()
    old_source = _agent_c_at(options.rev)
    workspace = owned_workspace()
    backends = [DockerBackend(runtime=options.runtime) for _ in range(3)]
    loop = asyncio.new_event_loop()
    try:
        with (
            _started_with(old_source, backends[0], workspace) as old,
            _started_with(None, backends[1], workspace) as new,
            Workspace(workspace, sandbox=backends[2]) as ws,
        ):
            tools = DevToolset(ws)

            def host() -> None:
                subprocess.run(["sh", "-c", "true"], check=True)

            def bash_tool() -> None:
                assert loop.run_until_complete(tools.run("bash", {"command": "true"}))["exit_code"] == 0

            stats = interleaved(
                {
                    "host": host,
                    "old": lambda: old.execute(TRUE),
                    "new": lambda: new.execute(TRUE),
                    "tool": bash_tool,
                },
                60 if options.quick else 300,
            )
    finally:
        loop.close()
        for backend in backends:
            backend.close()
    rows = [
        Row.latency("session `true`, agent channel, this agent", stats["new"], HOST_ANCHOR, stats["host"], 2),
        Row.latency(
            f"session `true`, agent channel, agent of {options.rev}",
            stats["old"],
            HOST_ANCHOR,
            stats["host"],
            2,
        ),
        Row.latency("session `true`, this agent", stats["new"], f"the agent of {options.rev}", stats["old"]),
        Row.latency(
            "bash tool `true` (DevToolset, Docker workspace)", stats["tool"], HOST_ANCHOR, stats["host"], 2.5
        ),
    ]
    print_section(f"The static agent against the one of {options.rev}", rows)


if __name__ == "__main__":
    main()
