"""DockerBackend overheads, measured side by side with their anchors in one run.

Run: .venv/bin/python bench/bench_docker.py [--repeat N]
Prints a Markdown table (medians, ratios to the anchor) for BENCHMARKS.md. Anchors:
* host ``subprocess.run(["true"])``: the floor of running anything;
* raw docker-py ``containers.create`` + ``start`` (with the same hardened host config) and ``remove``;
* raw docker-py ``exec_run("true")`` in a running container;
* a host pipe drained by a bare ``os.read`` loop, for streaming 200 MB.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable

import docker

from executor import ExecRequest, Language, ResourceLimits
from executor.backends.docker import BASE_IMAGE, DockerBackend
from executor.backends.docker._spec import ContainerSpec, host_config_arguments

FLOOD_BYTES = 200_000_000


def paired_ms(ours: Callable[[], object], anchor: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Medians of ``ours`` and ``anchor``, run alternately so machine drift hits both alike."""
    ours()
    anchor()  # warm-up
    samples: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeat):
        for fn, into in ((ours, samples[0]), (anchor, samples[1])):
            started = time.perf_counter()
            fn()
            into.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples[0]), statistics.median(samples[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--runtime", default=None, help="e.g. runsc")
    args = parser.parse_args()
    repeat = args.repeat
    client = docker.from_env()
    workspace = tempfile.mkdtemp()
    backend = DockerBackend(runtime=args.runtime)
    host_config = client.api.create_host_config(
        **host_config_arguments(
            ContainerSpec(
                image=BASE_IMAGE, limits=ResourceLimits(), runtime=args.runtime, workspace=workspace
            )
        )
    )

    def raw_session() -> None:
        created = client.api.create_container(
            BASE_IMAGE, entrypoint=["sleep"], command=["600"], host_config=host_config, working_dir=workspace
        )
        client.api.start(created["Id"])
        client.api.remove_container(created["Id"], force=True)

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


if __name__ == "__main__":
    main()
