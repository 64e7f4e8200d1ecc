"""Per-call overhead of the inspect_ai provider against the DockerSession it wraps, side by side.

Run: PYTHONPATH=. .venv/bin/python bench/bench_adapter_inspect.py [--quick] [--runtime runsc]
One sample's sandbox (``AdkSandboxEnvironment.sample_init``) and its own DockerSession: ``exec(["true"])``
through the provider (an awaited call on one event loop: the thread hand-off of the bridge, the request
built from inspect's arguments, the result mapped back) against ``session.execute(ExecRequest(argv=
("true",)))`` called directly, and ``read_file`` of a small file against ``session.files.read_bytes``.
"""

from __future__ import annotations

import asyncio

from _timing import Row, interleaved, parser, print_section

from adk_sandbox.devtools.adapters.inspect_sandbox import AdkSandboxConfig, AdkSandboxEnvironment
from adk_sandbox.executor.types import ExecRequest

TASK = "bench_adapter_inspect"


def main() -> None:
    args = parser(__doc__)
    args.add_argument("--runtime", default="runc", choices=["runc", "runsc"])
    options = args.parse_args()
    repeat = 50 if options.quick else 400
    config = AdkSandboxConfig(runtime=options.runtime)
    loop = asyncio.new_event_loop()
    environments = loop.run_until_complete(AdkSandboxEnvironment.sample_init(TASK, config, {}))
    environment = environments["default"]
    assert isinstance(environment, AdkSandboxEnvironment)
    session = environment._session
    try:
        loop.run_until_complete(environment.write_file("small.txt", "x" * 100))
        request = ExecRequest(argv=("true",), timeout=30)

        def provider_exec() -> None:
            assert loop.run_until_complete(environment.exec(["true"])).success

        def direct_exec() -> None:
            assert session.execute(request).exit_code == 0

        def provider_read() -> None:
            assert len(loop.run_until_complete(environment.read_file("small.txt"))) == 100

        def direct_read() -> None:
            assert len(session.files.read_bytes("/tmp/small.txt")) == 100

        stats = interleaved(
            {"provider exec": provider_exec, "direct exec": direct_exec,
             "provider read": provider_read, "direct read": direct_read},
            repeat,
        )  # fmt: skip
        rows = [
            Row.latency(
                "exec(['true'])", stats["provider exec"], "DockerSession.execute", stats["direct exec"]
            ),
            Row.latency(
                "read_file (100 B)", stats["provider read"], "session.files.read_bytes", stats["direct read"]
            ),
        ]
        print_section(f"Issue 12: inspect_ai adapter ({options.runtime}, {repeat} calls each)", rows)
    finally:
        loop.run_until_complete(AdkSandboxEnvironment.sample_cleanup(TASK, config, environments, False))
        loop.run_until_complete(AdkSandboxEnvironment.task_cleanup(TASK, config, True))
        loop.close()


if __name__ == "__main__":
    main()
