"""DockerBackend overheads, measured side by side with their anchors in one run.

Run: .venv/bin/python bench/bench_docker.py [--repeat N] [--quick] [--runtime runsc]
Prints a Markdown table (medians, ratios to the anchor) for BENCHMARKS.md, then issue 11's benchmark 4
(session start + first command, :func:`start_first_command`). Anchors:
* host ``subprocess.run(["true"])``: the floor of running anything;
* raw docker-py ``containers.create`` + ``start`` (with the same hardened host config) and ``remove``;
* raw docker-py ``exec_run("true")`` in a running container;
* a host pipe drained by a bare ``os.read`` loop, for streaming 200 MB.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from collections.abc import Callable

import docker
from _fixtures import TRUE, create_raw_container, owned_workspace, raw_host_config, runtime_name
from _timing import Row, Stats, interleaved, print_section, timed

from adk_sandbox.executor import ExecRequest, Language
from adk_sandbox.executor.backends.docker import BASE_IMAGE, DockerBackend, DockerSession

FLOOD_BYTES = 200_000_000


def paired_ms(ours: Callable[[], object], anchor: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Medians of ``ours`` and ``anchor``, run alternately so machine drift hits both alike."""
    stats = interleaved({"ours": ours, "anchor": anchor}, repeat)
    return stats["ours"].p50, stats["anchor"].p50


def start_first_command(runtime: str | None, repeat: int) -> list[Row]:
    """Benchmark 4 of issue 11: session start + first command vs raw create + start + first exec_run.

    Both sides create a container of the same image with the same hardened host config; removing it is
    outside the timing on both sides (our session's close, the raw container's ``remove``).
    """
    client = docker.from_env()
    workspace = owned_workspace()
    backend = DockerBackend(runtime=runtime)
    host_config = raw_host_config(client, runtime, workspace)
    made: list[str] = []
    sessions: list[DockerSession] = []

    def raw() -> None:
        raw_id = create_raw_container(client, host_config, workspace)
        made.append(raw_id)
        client.api.start(raw_id)
        exit_code, _ = client.containers.get(raw_id).exec_run("true", user="1000:1000")
        assert exit_code == 0

    def ours() -> None:
        session = backend.session(workspace=workspace)
        sessions.append(session)
        assert session.execute(TRUE).exit_code == 0

    def cleanup() -> None:  # between samples, untimed: at most one container of each kind at a time
        while made:
            client.api.remove_container(made.pop(), force=True)
        while sessions:
            sessions.pop().close()

    samples: dict[str, list[float]] = {"ours": [], "raw": []}
    try:
        for i in range(repeat + 1):  # the first round is the warm-up
            for name, fn in (("ours", ours), ("raw", raw)):
                stats = timed(fn, 1, warm_up=False)
                cleanup()
                if i:
                    samples[name] += stats.samples
    finally:
        cleanup()
        backend.close()
        client.close()
    rt = runtime_name(runtime)
    return [
        Row.latency(
            f"{rt}: session start + first `true`",
            Stats(tuple(samples["ours"])),
            "raw docker-py create + start + first `exec_run('true')`",
            Stats(tuple(samples["raw"])),
            1.1,
        )
    ]


def main() -> None:  # noqa: PLR0915 - one table, built in order
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--runtime", default=None, help="e.g. runsc")
    parser.add_argument("--quick", action="store_true", help="5 repetitions")
    args = parser.parse_args()
    repeat = 5 if args.quick else args.repeat
    client = docker.from_env()
    workspace = tempfile.mkdtemp()
    backend = DockerBackend(runtime=args.runtime)
    host_config = raw_host_config(client, args.runtime, workspace)

    def raw_session() -> None:
        raw_id = create_raw_container(client, host_config, workspace)
        client.api.start(raw_id)
        client.api.remove_container(raw_id, force=True)

    def our_session() -> None:
        with backend.session(workspace=workspace) as session:
            session.start()

    rows: list[tuple[str, str, tuple[float, float]]] = []
    rows.append(("session start + close", "raw docker-py create + start + remove",
                 paired_ms(our_session, raw_session, repeat)))  # fmt: skip

    raw_container = client.containers.run(
        BASE_IMAGE, ["sleep", "600"], detach=True, network_mode="none", auto_remove=True, runtime=args.runtime
    )
    true_request = ExecRequest(language=Language.COMMAND, code="true", timeout=30)
    flood = ExecRequest(
        language=Language.COMMAND, code=f"head -c {FLOOD_BYTES} /dev/zero", timeout=120, max_output_bytes=4096
    )

    def raw_pipe_drain() -> None:
        proc = subprocess.Popen(["head", "-c", str(FLOOD_BYTES), "/dev/zero"], stdout=subprocess.PIPE)
        assert proc.stdout is not None
        while os.read(proc.stdout.fileno(), 65536):
            pass
        proc.wait()

    def raw_exec_stream() -> None:
        for _ in raw_container.exec_run(["head", "-c", str(FLOOD_BYTES), "/dev/zero"], stream=True).output:
            pass

    def host_true() -> None:
        subprocess.run(["true"], check=True)

    try:
        with backend.session(workspace=workspace) as session:

            def true() -> None:
                session.execute(true_request)

            def flood_through_session() -> None:
                session.execute(flood)

            rows.append(("session command `true`", "raw docker-py `exec_run('true')`",
                         paired_ms(true, lambda: raw_container.exec_run("true"), repeat)))  # fmt: skip
            rows.append(("session command `true`", "host `subprocess.run(['true'])`",
                         paired_ms(true, host_true, repeat)))  # fmt: skip
            rows.append(("200 MB through a session, 4 KiB kept", "raw docker-py exec stream of 200 MB",
                         paired_ms(flood_through_session, raw_exec_stream, 5)))  # fmt: skip
            rows.append(("200 MB through a session, 4 KiB kept", "bare os.read loop over a host pipe",
                         paired_ms(flood_through_session, raw_pipe_drain, 5)))  # fmt: skip
    finally:
        raw_container.remove(force=True)
        backend.close()

    print(f"runtime: {args.runtime or 'runc (default)'}, repeat {repeat}\n")
    print("| what | median ms | anchor | anchor median ms | ratio |")
    print("|---|---|---|---|---|")
    for name, anchor, (ours, theirs) in rows:
        print(f"| {name} | {ours:.1f} | {anchor} | {theirs:.1f} | {ours / theirs:.2f}x |")
    print()
    print_section(
        "Session start + first command (issue 11, benchmark 4)", start_first_command(args.runtime, repeat)
    )


if __name__ == "__main__":
    main()
