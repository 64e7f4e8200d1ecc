"""Where a warm command's time goes on the agent channel: a profile aid behind BENCHMARKS.md's issue 11 notes.

Run: PYTHONPATH=. .venv/bin/python bench/split_agent.py [--quick] [--runtime runsc]

* the agent's own CPU per command against its reaped shims' and commands' (runc: host /proc and cgroup);
* the channel alone: a PING/PONG round trip through the agent (host → dockerd → shim → agent → back),
  interleaved with a RUN of ``true`` and the host's ``sh -c true``;
* the in-container steps of one command, timed inside a session's container by a program built with the
  agent's own prelude (``in_container_program``): a fork of a Python process, the set-id filter, the
  ``posix_spawn`` of ``sh``, the shim's signal reset; wall and CPU ms per step (CPU includes children).

It reads private parts of the library (the agent's socket, its frame types): a measurement aid, not an
API. It runs through the exec transport for the in-container part, so that no second agent starts in a
container that already has one (a new agent kills earlier ones by design).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

from _fixtures import TRUE, owned_workspace, runtime_name
from _timing import Row, cgroup_cpu_seconds, interleaved, parser, print_section, process_cpu_seconds

from adk_sandbox.executor import ExecRequest, Language
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from adk_sandbox.executor.channel.agent import AGENT_ARGV0
from adk_sandbox.executor.channel.frames import Frame, FrameType, encode
from adk_sandbox.executor.channel.programs import in_container_program

STEPS_BODY = r"""import json, os, signal, sys, time
# @PRELUDE@
SELF = os.getpid()
MARK = b"ADK_SANDBOX_EXEC="
import ctypes
N = int(sys.argv[1])
def forked(body):
    def run():
        pid = os.fork()
        if pid == 0:
            body()
            os._exit(0)
        os.waitpid(pid, 0)
    return run
def spawn_sh():
    pid = os.posix_spawn("/bin/sh", ["/bin/sh", "-c", "--", "true"], {"PATH": "/usr/bin:/bin"}, setsid=True)
    os.waitpid(pid, 0)
def reset_signals():
    for s in range(1, signal.NSIG):
        try:
            signal.signal(s, signal.SIG_DFL)
        except (OSError, ValueError, RuntimeError):
            pass
    os.listdir("/proc/self/fd")
def filter_then_spawn():
    install_setid_filter(SETID)
    spawn_sh()
for name, fn in [("fork + exit of a Python process", forked(lambda: None)),
                 ("fork + install_setid_filter + exit", forked(lambda: install_setid_filter(SETID))),
                 ("fork + reset signals + listdir fds + exit", forked(reset_signals)),
                 ("posix_spawn sh -c true (no fork)", spawn_sh),
                 ("fork + filter + spawn sh (a shim, roughly)", forked(filter_then_spawn)),
                 ("scan() of /proc", scan)]:
    fn()
    before, started = os.times(), time.perf_counter()
    for _ in range(N):
        fn()
    after = os.times()
    cpu = sum(getattr(after, f) - getattr(before, f)
              for f in ("user", "system", "children_user", "children_system"))
    # one line per step: output keeps flowing (a long silent command trips the socket timeout defect)
    print(json.dumps([name, (time.perf_counter() - started) / N * 1000, cpu / N * 1000]), flush=True)
"""


def channel_rows(session: DockerSession, repeat: int) -> list[Row]:
    """PING/PONG through the running agent, against ``true`` and the host anchor, interleaved."""
    session.execute(TRUE)
    agent = session._transport._agent  # private: a measurement aid
    pong = threading.Event()
    deliver = agent._deliver

    def deliver_pong(frame: Frame) -> None:
        if frame.type == FrameType.PONG:
            pong.set()
        else:
            deliver(frame)

    agent._deliver = deliver_pong  # this agent only, for this measurement

    def ping() -> None:
        pong.clear()
        agent.send(encode(FrameType.PING, 0), time.monotonic() + 5)
        assert pong.wait(5)

    stats = interleaved(
        {
            "ping": ping,
            "true": lambda: session.execute(TRUE),
            "host": lambda: subprocess.run(["sh", "-c", "true"], check=True),
        },
        repeat,
    )
    host = 'host `subprocess.run(["sh","-c","true"])`'
    return [
        Row.latency("PING/PONG round trip through the agent", stats["ping"], host, stats["host"]),
        Row.latency("RUN `true` through the agent", stats["true"], host, stats["host"]),
    ]


def _agent_host_pid(container_id: str) -> int:
    """The host pid of the container's agent (its cmdline names it; its cgroup names the container)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline, open(f"/proc/{entry}/cgroup") as cgroup:
                argv, groups = cmdline.read().split(b"\0"), cgroup.read()
        except OSError:
            continue
        if argv[0] == b"python3" and AGENT_ARGV0.encode() in argv and container_id in groups:
            return int(entry)
    raise LookupError(f"no agent in container {container_id}")


def agent_cpu_rows(session: DockerSession, commands: int) -> list[Row]:
    """CPU per ``true`` in the container: the agent's own loop vs its reaped shims (and their commands)."""
    session.execute(TRUE)
    container_id = session.container_id
    agent = _agent_host_pid(container_id)

    def snapshot() -> tuple[float, float, float]:
        own = process_cpu_seconds(agent)
        return own, process_cpu_seconds(agent, True) - own, cgroup_cpu_seconds(container_id)

    before = snapshot()
    for _ in range(commands):
        session.execute(TRUE)
    after = snapshot()
    own, shims, cgroup = ((a - b) * 1000 / commands for a, b in zip(after, before, strict=True))
    return [
        Row(
            "in the container, per `true`: the agent's own CPU (its loop, the fork's parent side)",
            f"{own:.2f} ms",
            "its reaped shims + commands / whole container cgroup",
            f"{shims:.2f} ms / {cgroup:.2f} ms",
        )
    ]


def step_rows(session: DockerSession, workspace: str, repeat: int) -> list[Row]:
    """The in-container steps of a command, timed inside the container."""
    path = os.path.join(workspace, "adk-bench-steps.py")
    with open(path, "w", encoding="utf-8") as program:
        program.write(in_container_program(STEPS_BODY))
    result = session.execute(
        ExecRequest(language=Language.COMMAND, code=f"python3 -I -S {path} {repeat}", timeout=600)
    )
    assert result.exit_code == 0, result
    rows = []
    for line in result.stdout.splitlines():
        name, wall, cpu = json.loads(line)
        rows.append(
            Row(f"in the container: {name}", f"{wall:.2f} ms wall", "CPU (with children)", f"{cpu:.2f} ms")
        )
    return rows


def main() -> None:
    args = parser(__doc__)
    args.add_argument("--runtime", default=None, help="e.g. runsc")
    options = args.parse_args()
    repeat = 30 if options.quick else 150
    workspace = owned_workspace()
    agent_backend = DockerBackend(runtime=options.runtime)
    exec_backend = DockerBackend(runtime=options.runtime, transport="exec")
    try:
        with agent_backend.session(workspace=workspace) as agent:
            rows = channel_rows(agent, repeat)
            if options.runtime is None:  # the cgroup and the agent's host pid are readable under runc
                rows += agent_cpu_rows(agent, repeat * 2)
        with exec_backend.session(workspace=workspace) as exe:
            rows += step_rows(exe, workspace, max(20, repeat // 2))
    finally:
        agent_backend.close()
        exec_backend.close()
    print_section(f"Where a warm command's time goes, {runtime_name(options.runtime)}", rows)


if __name__ == "__main__":
    main()
