"""Where session start + first command goes, against raw docker-py's steps (issue 11, benchmark 4's split).

Run: PYTHONPATH=. .venv/bin/python bench/split_start.py [--quick] [--runtimes runc,runsc]

Interleaved rounds of (a) a session started and its first ``true`` run, each step of the library timed
by wrapping it for the run (create, start + inspect + verification, the agent's exec, the agent's
bootstrap up to its HELLO, the start-up probe, the first command) and (b) raw docker-py's create, start,
``containers.get`` and ``exec_run('true')``, each step timed. Then, in one warm session, what the
in-sandbox parts cost as commands of their own (a ``true``, the probe script, a command substitution),
interleaved: the runtime's price of each process the start sequence creates.

It wraps private parts of the library (a measurement aid, not an API); nothing is changed in them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import docker
from _fixtures import TRUE, create_raw_container, owned_workspace, raw_host_config, runtime_name
from _timing import Row, Stats, interleaved, parser, print_section

from adk_sandbox.executor import ExecRequest, Language
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession, _container, _exec
from adk_sandbox.executor.backends.docker import session as session_module
from adk_sandbox.executor.channel import agent_transport as _agent_transport
from adk_sandbox.executor.channel import probe as _probe


@contextlib.contextmanager
def _wrapped(owner: Any, name: str, into: dict[str, float], key: str) -> Iterator[None]:
    """Add the milliseconds of every call of ``owner.name`` to ``into[key]`` while the block runs."""
    original = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            into[key] = into.get(key, 0.0) + (time.perf_counter() - started) * 1000

    setattr(owner, name, timed)
    try:
        yield
    finally:
        setattr(owner, name, original)


def ours_split(backend: DockerBackend, workspace: str, sessions: list[DockerSession]) -> dict[str, float]:
    """One session start + first ``true``, split into the library's steps (ms)."""
    raw: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        stack.enter_context(_wrapped(_container.ContainerProvider, "_create", raw, "create"))
        stack.enter_context(_wrapped(_container.ContainerProvider, "open", raw, "open"))
        stack.enter_context(_wrapped(_exec.DockerExecs, "open_agent_stream", raw, "agent exec"))
        stack.enter_context(_wrapped(_agent_transport.AgentTransport, "_start_launch", raw, "launch"))
        stack.enter_context(_wrapped(session_module, "verify_from_inside", raw, "verify_from_inside"))
        started = time.perf_counter()
        session = backend.session(workspace=workspace)
        sessions.append(session)
        session.start()
        opened = time.perf_counter()
        assert session.execute(TRUE).exit_code == 0
        ended = time.perf_counter()
    return {
        "create": raw["create"],
        "start + inspect + verify": raw["open"] - raw["create"],
        "agent exec": raw["agent exec"],
        "agent bootstrap": raw["launch"] - raw["agent exec"],
        "probe": raw["verify_from_inside"] - raw["launch"],
        "first command": (ended - opened) * 1000,
        "rest of start": (opened - started) * 1000 - raw["open"] - raw["verify_from_inside"],
        "total": (ended - started) * 1000,
    }


def raw_split(
    client: docker.DockerClient, host_config: Any, workspace: str, made: list[str]
) -> dict[str, float]:
    """Raw docker-py create + start + first ``exec_run('true')`` (benchmark 4's anchor), split (ms)."""
    marks = [time.perf_counter()]
    raw_id = create_raw_container(client, host_config, workspace)
    made.append(raw_id)
    marks.append(time.perf_counter())
    client.api.start(raw_id)
    marks.append(time.perf_counter())
    container = client.containers.get(raw_id)
    marks.append(time.perf_counter())
    exit_code, _ = container.exec_run("true", user="1000:1000")
    marks.append(time.perf_counter())
    assert exit_code == 0
    names = ("create", "start", "inspect (containers.get)", "exec_run('true')")
    split = {name: (marks[i + 1] - marks[i]) * 1000 for i, name in enumerate(names)}
    split["total"] = (marks[-1] - marks[0]) * 1000
    return split


#: The start-up probe's script before issue 11's step 6 (main at 990a626): mktemp, chmod, rm and cat, each a
#: fork and an exec of its own.
OLD_PROBE_SETID = (
    'f=$(mktemp) && { if chmod 4755 "$f" 2>/dev/null; then echo setid-allowed; else echo setid-refused; fi; '
    'rm -f "$f"; }'
)


def _old_probe_script(token: str, *, capabilities: bool, nonce: bool) -> str:
    caps = " ; " + _probe._PROBE_CAPS if capabilities else ""
    return OLD_PROBE_SETID + caps + (' ; cat -- "$1" 2>/dev/null' if nonce else "")


@contextlib.contextmanager
def _old_probe() -> Iterator[None]:
    original = _probe._probe_script
    _probe._probe_script = _old_probe_script
    try:
        yield
    finally:
        _probe._probe_script = original


OUR_STEPS = (
    "create",
    "start + inspect + verify",
    "agent exec",
    "agent bootstrap",
    "probe",
    "first command",
    "rest of start",
    "total",
)
RAW_STEPS = ("create", "start", "inspect (containers.get)", "exec_run('true')", "total")


def start_split(runtime: str | None, repeat: int) -> tuple[list[Row], list[str]]:
    """Interleaved rounds of raw, ours and ours with the old probe; each step's p50, the totals' ratios."""
    client = docker.from_env()
    workspace = owned_workspace()
    backend = DockerBackend(runtime=runtime)
    host_config = raw_host_config(client, runtime, workspace)
    made: list[str] = []
    sessions: list[DockerSession] = []
    samples: dict[str, list[dict[str, float]]] = {"raw": [], "ours": [], "old probe": []}

    def cleanup() -> None:
        while made:
            client.api.remove_container(made.pop(), force=True)
        while sessions:
            sessions.pop().close()

    def one(side: str) -> dict[str, float]:
        if side == "raw":
            return raw_split(client, host_config, workspace, made)
        if side == "old probe":
            with _old_probe():
                return ours_split(backend, workspace, sessions)
        return ours_split(backend, workspace, sessions)

    sides = list(samples)
    try:
        for i in range(repeat + 1):  # the first round warms up
            shift = i % len(sides)
            for side in sides[shift:] + sides[:shift]:
                got = one(side)
                cleanup()  # untimed, between samples: one container at a time
                if i:
                    samples[side].append(got)
    finally:
        cleanup()
        backend.close()
        client.close()

    def stats(side: str, key: str) -> Stats:
        return Stats(tuple(sample[key] for sample in samples[side]))

    rt = runtime_name(runtime)
    raw_total = stats("raw", "total")
    rows = [
        Row.latency(f"{rt}: session start + first `true`", stats("ours", "total"), "raw", raw_total, 1.1),
        Row.latency(
            f"{rt}: the same with the probe of 990a626", stats("old probe", "total"), "raw", raw_total, 1.1
        ),
        Row.latency(
            f"{rt}: the probe step",
            stats("ours", "probe"),
            "the probe of 990a626",
            stats("old probe", "probe"),
        ),
    ]
    notes = [
        f"{rt}, p50 ms per step: ours "
        + ", ".join(f"{step} {stats('ours', step).p50:.1f}" for step in OUR_STEPS)
        + "; with the probe of 990a626 "
        + ", ".join(f"{step} {stats('old probe', step).p50:.1f}" for step in OUR_STEPS)
        + "; raw "
        + ", ".join(f"{step} {stats('raw', step).p50:.1f}" for step in RAW_STEPS)
    ]
    return rows, notes


#: The start-up probe's set-id part, as it runs now and as it ran at 990a626.
PROBE = ExecRequest(
    argv=(
        "/bin/sh",
        "-c",
        _probe._probe_script("0" * 32, capabilities=False, nonce=False),
        "adk-sandbox-probe",
    ),
    cwd="/",
    timeout=60,
)
OLD_PROBE = ExecRequest(argv=("/bin/sh", "-c", OLD_PROBE_SETID, "adk-sandbox-probe"), cwd="/", timeout=60)
SUBSTITUTION = ExecRequest(language=Language.COMMAND, code="m=$(umask)", timeout=60)


def in_sandbox_parts(runtime: str | None, repeat: int) -> list[Row]:
    """In one warm session: a ``true`` against both probes and a ``$(umask)``, interleaved."""
    backend = DockerBackend(runtime=runtime)
    try:
        with backend.session(workspace=owned_workspace()) as session:

            def run(request: ExecRequest) -> Callable[[], None]:
                def go() -> None:
                    result = session.execute(request)
                    assert result.exit_code == 0 and "setid-refused" in result.stdout + "setid-refused", (
                        result
                    )

                return go

            requests = {"true": TRUE, "probe": PROBE, "old probe": OLD_PROBE, "subst": SUBSTITUTION}
            stats = interleaved({name: run(request) for name, request in requests.items()}, repeat)
    finally:
        backend.close()
    rt = runtime_name(runtime)
    warm = "warm `true`"
    return [
        Row.latency(f"{rt}: warm: the probe's set-id script", stats["probe"], warm, stats["true"]),
        Row.latency(f"{rt}: warm: the same, at 990a626", stats["old probe"], warm, stats["true"]),
        Row.latency(f"{rt}: warm: `m=$(umask)` (the loader's fork)", stats["subst"], warm, stats["true"]),
    ]


def main() -> None:
    args = parser(__doc__)
    args.add_argument("--runtimes", default="runc,runsc", help="comma-separated: runc, runsc")
    options = args.parse_args()
    rows: list[Row] = []
    notes: list[str] = []
    for name in options.runtimes.split(","):
        runtime = None if name == "runc" else name
        got, more = start_split(runtime, 4 if options.quick else 10)
        rows += got
        notes += more
        rows += in_sandbox_parts(runtime, 10 if options.quick else 40)
    print_section("Session start + first command, step by step (benchmark 4)", rows, notes)


if __name__ == "__main__":
    main()
