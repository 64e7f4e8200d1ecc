"""A whole inspect eval on the adk-sandbox provider (hardened and task profiles) against inspect's docker one.

Run: PYTHONPATH=. .venv/bin/python bench/bench_inspect_eval.py [--rounds N] [--quick] [--engine unix://…]
(root: without ``--engine`` it starts the current Docker engine of tests/integration/modern_engine.py,
which ``scripts/modern-engine`` builds, and loads the base image into it).

A real ``inspect_ai.eval``: ``mockllm/model`` scripted per sample (a function of the messages so far, so
samples running at once never take each other's turns) drives inspect's ``react`` agent through 12
samples x 5 ``bash()`` calls (files written in ``/tmp``, ``sort``, Python, a hash of what the sample wrote),
then ``submit`` with the hash the last call printed; the scorer compares it with the expected one and
reads the sample's file back through ``sandbox()``. Every eval must score 12/12 and leave no container.

Three configurations, all against the same engine (``DOCKER_HOST`` is set to it for the whole process,
so both providers, and the ``docker`` CLI under inspect's compose, use it): ``adk-sandbox`` with
``AdkSandboxConfig(profile="hardened")``, with ``profile="task"``, and inspect's own ``docker`` provider
with a single-service compose file of the same image (``x-local: true``: never pulled; ``network_mode:
none``, as inspect's generic compose file has). inspect's docker provider needs Docker >= 24.0.6 and
compose v2, hence the current engine: the machine's own is 20.10. Both providers run ``2 x cores`` samples
at once (their default). The configurations run in turn, each round starting one later, after one untimed
eval of each; the table gives the wall time of an eval (task start to the last sample's cleanup), median
and range, and its ratio to inspect's docker provider.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from _timing import Row, Stats, interleaved, parser, print_section
from inspect_ai import Task
from inspect_ai import __version__ as inspect_version
from inspect_ai import eval as inspect_eval
from inspect_ai.agent import react
from inspect_ai.dataset import Sample
from inspect_ai.model import ChatMessage, GenerateConfig, ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import TaskState
from inspect_ai.tool import ToolChoice, ToolInfo, bash
from inspect_ai.util import SandboxEnvironmentSpec, sandbox

from adk_sandbox.devtools.adapters.inspect_sandbox import AdkSandboxConfig
from adk_sandbox.executor.backends.docker import BASE_IMAGE

SAMPLES = 12
#: What inspect's docker provider runs: the base image as it is, never pulled (it exists only locally).
COMPOSE = f"""\
services:
  default:
    image: {BASE_IMAGE}
    x-local: true
    command: tail -f /dev/null
    init: true
    network_mode: none
    stop_grace_period: 1s
"""
# Usage given: without it mockllm counts tokens with tiktoken, which downloads its encoding (offline here).
USAGE = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)


def commands(number: int) -> list[str]:
    """The five ``bash()`` calls of sample ``number``."""
    return [
        f"mkdir -p /tmp/w && echo 'sample {number}' > /tmp/w/notes.txt && id -un",
        "seq 1 2000 | sort -rn | head -3 > /tmp/w/top.txt && wc -l < /tmp/w/top.txt",
        f"python3 -c 'print(sum(range({number} * 1000)))' >> /tmp/w/notes.txt && tail -1 /tmp/w/notes.txt",
        "ls /tmp/w | wc -l",
        "cat /tmp/w/notes.txt /tmp/w/top.txt | sha256sum | cut -c1-16",
    ]


def notes(number: int) -> str:
    """What sample ``number`` leaves in ``/tmp/w/notes.txt``."""
    return f"sample {number}\n{sum(range(number * 1000))}\n"


def expected_answer(number: int) -> str:
    """The hash the last call prints: what the model submits."""
    return hashlib.sha256((notes(number) + "2000\n1999\n1998\n").encode()).hexdigest()[:16]


def scripted_model(
    messages: list[ChatMessage], tools: list[ToolInfo], tool_choice: ToolChoice, config: GenerateConfig
) -> ModelOutput:
    """The next turn of the sample these messages are of: its next ``bash()`` call, then ``submit``."""
    first = next(message for message in messages if message.role == "user")
    number = int(first.text.split()[-1])
    results = [message for message in messages if message.role == "tool"]
    script = commands(number)
    if len(results) < len(script):
        output = ModelOutput.for_tool_call(
            model="mockllm/model", tool_name="bash", tool_arguments={"command": script[len(results)]}
        )
    else:
        answer = results[-1].text.strip()
        output = ModelOutput.for_tool_call(
            # No text beside the call: react appends the answer to it, the answer alone is the completion.
            model="mockllm/model",
            tool_name="submit",
            tool_arguments={"answer": answer},
            content="",
        )
    output.usage = USAGE
    return output


@scorer(metrics=[accuracy()])
def submitted_hash() -> Any:
    """Correct when the submitted hash is the expected one and the sample's file is in its sandbox."""

    async def score(state: TaskState, target: Target) -> Score:
        number = int(state.input_text.split()[-1])
        written = await sandbox().read_file("/tmp/w/notes.txt")
        # The bash() results (react keeps submit's out of the messages).
        tools = [message for message in state.messages if message.role == "tool"]
        errors = [message.error for message in tools if message.error is not None]
        answer = state.output.completion.strip()
        every_call = len(tools) == len(commands(number)) and not errors
        ok = every_call and answer == target.text and written == notes(number)
        explanation = f"answer {answer!r}, notes {written!r}, {len(tools)} tool results, errors {errors}"
        return Score(value=CORRECT if ok else INCORRECT, explanation=explanation)

    return score


def make_task(spec: SandboxEnvironmentSpec) -> Task:
    """The eval's task on the sandbox ``spec``."""
    dataset = [Sample(input=f"Work on sample {n}", target=expected_answer(n)) for n in range(1, SAMPLES + 1)]
    return Task(
        dataset=dataset, solver=react(tools=[bash(timeout=60)]), scorer=submitted_hash(), sandbox=spec
    )


def run_eval(spec: SandboxEnvironmentSpec, log_dir: str) -> list[float]:
    """One eval of the task on ``spec``: each sample's ``total_time`` in its log, seconds.

    Fails unless the eval scored every sample correct.
    """
    model = get_model("mockllm/model", custom_outputs=scripted_model)
    [log] = inspect_eval(make_task(spec), model=model, log_dir=log_dir, display="none")
    assert log.status == "success", log.error
    assert log.results is not None and log.samples is not None and len(log.samples) == SAMPLES
    accuracy_ = log.results.scores[0].metrics["accuracy"].value
    if accuracy_ != 1.0:
        wrong = [score.explanation for sample in log.samples for score in (sample.scores or {}).values()]
        raise AssertionError(f"accuracy {accuracy_} on {spec.type}: {wrong[:2]}")
    return [sample.total_time or 0.0 for sample in log.samples]


@contextlib.contextmanager
def modern_engine(given: str | None) -> Iterator[tuple[str, dict[str, str]]]:
    """The engine's address and versions.

    ``given``, else a modern engine started here with the base image (destroyed at the end).
    """
    if given is not None:
        yield given, engine_versions(given)
        return
    from tests.integration.modern_engine import ROOTFS, ModernEngine  # noqa: PLC0415 - only when needed

    engine = ModernEngine(ROOTFS)
    try:
        engine.start()
        # From the machine's engine (docker save on the default socket): before DOCKER_HOST changes.
        engine.load_image(BASE_IMAGE)
        yield engine.host, engine_versions(engine.host)
    finally:
        engine.destroy()


def engine_versions(host: str) -> dict[str, str]:
    """The engine's, its runc's and containerd's versions, and compose's, as the CLI reports them."""
    template = (
        "{{.Server.Version}} {{.Server.APIVersion}} "
        "{{range .Server.Components}}{{.Name}}={{.Version}} {{end}}"
    )
    answer = subprocess.run(["docker", "-H", host, "version", "--format", template], check=True,
                            capture_output=True, text=True).stdout.split()  # fmt: skip
    versions = {"engine": answer[0], "api": answer[1]}
    components = (part.split("=", 1) for part in answer[2:] if "=" in part)
    versions |= {name: version for name, version in components if name != "Engine"}
    compose = subprocess.run(
        ["docker", "compose", "version", "--short"], check=False, capture_output=True, text=True
    )
    versions["compose"] = compose.stdout.strip()
    versions["inspect_ai"] = inspect_version
    return versions


def containers(host: str) -> list[str]:
    """Every container on the engine (``docker ps -a``)."""
    listed = subprocess.run(["docker", "-H", host, "ps", "-aq"], check=True, capture_output=True, text=True)
    return listed.stdout.split()


def seconds(stats: Stats) -> str:
    """Median and range of ``stats`` (milliseconds), in seconds."""
    return f"{stats.p50 / 1000:.1f} s ({min(stats.samples) / 1000:.1f}-{max(stats.samples) / 1000:.1f})"


def main() -> None:
    args = parser(__doc__)
    args.add_argument("--rounds", type=int, default=5, help="timed evals of each configuration")
    args.add_argument("--engine", help="a running Docker >= 24.0.6 with the base image (default: start one)")
    options = args.parse_args()
    rounds = 1 if options.quick else options.rounds
    with modern_engine(options.engine) as (host, versions), tempfile.TemporaryDirectory() as scratch:
        os.environ["DOCKER_HOST"] = host
        compose = Path(scratch) / "compose.yaml"
        compose.write_text(COMPOSE)
        specs = {
            "adk-sandbox hardened": SandboxEnvironmentSpec(
                "adk-sandbox", AdkSandboxConfig(profile="hardened")
            ),
            "adk-sandbox task": SandboxEnvironmentSpec("adk-sandbox", AdkSandboxConfig(profile="task")),
            "inspect docker": SandboxEnvironmentSpec("docker", str(compose)),
        }
        logs = Path(scratch) / "logs"

        sample_times: dict[str, list[float]] = {name: [] for name in specs}

        def one(name: str, spec: SandboxEnvironmentSpec) -> Callable[[], None]:
            return lambda: sample_times[name].extend(run_eval(spec, str(logs)))

        stats = interleaved({name: one(name, spec) for name, spec in specs.items()}, rounds)
        assert containers(host) == [], "an eval left a container on the engine"
    anchor = stats["inspect docker"]
    # Per sample (the untimed first eval's included): seconds as milliseconds, for seconds() and Stats.
    per_sample = {name: Stats(tuple(1000 * t for t in times)) for name, times in sample_times.items()}
    rows = [
        Row(
            name,
            seconds(stats[name]),
            "inspect's docker provider",
            seconds(anchor),
            stats[name].p50 / anchor.p50,
        )
        for name in ("adk-sandbox hardened", "adk-sandbox task")
    ]
    anchor_sample = per_sample["inspect docker"]
    rows += [
        Row(
            f"{name}: one sample (its total_time)",
            seconds(per_sample[name]),
            "inspect's docker provider",
            seconds(anchor_sample),
            per_sample[name].p50 / anchor_sample.p50,
        )
        for name in ("adk-sandbox hardened", "adk-sandbox task")
    ]
    described = ", ".join(f"{key} {value}" for key, value in versions.items())
    print_section(
        f"inspect eval, {SAMPLES} samples x 5 bash() + submit, wall time per eval, {rounds} timed each",
        rows,
        [f"engine: {described}", "runtime runc; both providers run 2 x cores samples at once"],
    )


if __name__ == "__main__":
    main()
