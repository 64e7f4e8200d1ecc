"""A SWE-bench-shaped inspect eval on the provider's defaults: a task image run as it is (issue 22).

The image is built here, ``FROM`` the project's base image: a root-owned repository at ``/testbed`` whose
tests fail until two bugs are fixed, pip and pytest from Debian, the image's ``WORKDIR`` at ``/testbed``,
no ``USER`` (root). A ``mockllm`` agent does what agents do in SWE-bench: ``pip install -e .`` as root,
one fix with ``text_editor`` and one with ``sed -i``; the scorer runs pytest in the sandbox. Under the
hardened shape every step of it failed (a read-only ``/testbed``, a user install on a tmpfs). It runs on
runc and gVisor with the config model, and through a single-service ``compose.yaml`` as written for
inspect's docker provider (``build:`` of the same Dockerfile).
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from tests.conftest import IN_CI, require
from tests.integration.provider_containers import provider_containers

try:
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import Sample
    from inspect_ai.model import ModelOutput, ModelUsage, get_model
    from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
    from inspect_ai.solver import TaskState, generate, use_tools
    from inspect_ai.tool import bash, text_editor
    from inspect_ai.util import SandboxEnvironmentSpec, sandbox

    from adk_sandbox.devtools.adapters.inspect_sandbox import PROVIDER_LABEL, AdkSandboxConfig, build_image

    INSPECT_MISSING = None
except ImportError as exc:  # pragma: no cover - the inspect extra is not installed
    if IN_CI:
        raise
    INSPECT_MISSING = str(exc)

pytestmark = pytest.mark.docker

IMAGE = "adk-sandbox-test/swe-task:latest"

DOCKERFILE = """\
FROM adk-sandbox/base:latest
RUN set -eux; apt-get update; \\
    apt-get install -y --no-install-recommends python3-pip python3-pytest python3-setuptools; \\
    apt-get clean; rm -rf /var/lib/apt/lists/*; \\
    rm -f /usr/lib/python3*/EXTERNALLY-MANAGED
COPY testbed /testbed
WORKDIR /testbed
"""

PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "calc"
version = "0.1"

[tool.setuptools.packages.find]
where = ["src"]
"""

OPS = """\
def add(a, b):
    return a - b  # BUG: subtracts


def mul(a, b):
    return a * b + 1  # BUG: off by one
"""

TESTS = """\
from calc.ops import add, mul


def test_add():
    assert add(2, 3) == 5


def test_mul():
    assert mul(2, 3) == 6
"""

COMPOSE = """\
services:
  default:
    build:
      context: .
      network: host
    init: true
    command: tail -f /dev/null
    working_dir: /testbed
    network_mode: none
    mem_limit: 1g
    x-default: true
"""

PIP_INSTALL = "pip install --no-build-isolation --no-deps -e . 2>&1 | tail -1"
SED_FIX = r"sed -i 's/return a \* b + 1  # BUG: off by one/return a * b/' src/calc/ops.py"


def _context(directory: Path) -> Path:
    (directory / "Dockerfile").write_text(DOCKERFILE)
    package = directory / "testbed" / "src" / "calc"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "ops.py").write_text(OPS)
    (directory / "testbed" / "pyproject.toml").write_text(PYPROJECT)
    (directory / "testbed" / "tests").mkdir()
    (directory / "testbed" / "tests" / "test_ops.py").write_text(TESTS)
    (directory / "compose.yaml").write_text(COMPOSE)
    return directory


@pytest.fixture(scope="module")
def task_context(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The task's build context (Dockerfile, /testbed, compose.yaml), and its image built once."""
    require(INSPECT_MISSING is None, f"inspect_ai is not installed: {INSPECT_MISSING}")
    context = _context(tmp_path_factory.mktemp("swe-task"))
    from adk_sandbox.devtools.adapters.inspect_sandbox import ImageBuild  # noqa: PLC0415

    build_image(IMAGE, ImageBuild(context=str(context), network="host"))
    client = docker.from_env()
    try:
        # The task as shipped: its tests fail until fixed, and /testbed is root's.
        unfixed = client.containers.run(
            IMAGE, ["sh", "-c", "stat -c %U /testbed; python3 -m pytest -q tests >/dev/null || echo failing"],
            network_mode="none", remove=True,
        )  # fmt: skip
        assert bytes(unfixed).decode().split() == ["root", "failing"]
    finally:
        client.close()
    yield context
    shutil.rmtree(context, ignore_errors=True)


def _task(spec: SandboxEnvironmentSpec) -> tuple[Any, Any]:
    usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)

    def call(tool: str, **arguments: Any) -> ModelOutput:
        output = ModelOutput.for_tool_call(model="mockllm/model", tool_name=tool, tool_arguments=arguments)
        output.usage = usage
        return output

    outputs = [
        call("bash", command=PIP_INSTALL),
        call(
            "text_editor",
            command="str_replace",
            path="/testbed/src/calc/ops.py",
            old_str="return a - b  # BUG: subtracts",
            new_str="return a + b",
        ),
        call("bash", command=SED_FIX),
    ]
    final = ModelOutput.from_content(model="mockllm/model", content="done")
    final.usage = usage
    outputs.append(final)

    @scorer(metrics=[accuracy()])
    def tests_pass() -> Any:
        async def score(state: TaskState, target: Target) -> Score:
            errors = [m.error for m in state.messages if m.role == "tool" and m.error is not None]
            tests = await sandbox().exec(["python3", "-m", "pytest", "-q", "tests"])
            # Installed editable, as root, into the system's site-packages: importable from anywhere.
            where = await sandbox().exec(
                ["python3", "-c", "import calc.ops; print(calc.ops.__file__)"], cwd="/"
            )
            whoami = await sandbox().exec(["sh", "-c", "id -u; pwd"])
            checks = {
                "no tool errors": not errors,
                "tests pass": tests.success,
                "editable install": where.stdout.strip() == "/testbed/src/calc/ops.py",
                "root in /testbed": whoami.stdout.split() == ["0", "/testbed"],
            }
            failed = [name for name, ok in checks.items() if not ok]
            return Score(
                value=INCORRECT if failed else CORRECT,
                explanation=f"failed: {failed}; errors: {errors}; {tests.stdout[-800:]}{where.stderr}",
            )

        return score

    task = Task(
        dataset=[Sample(input="Fix the failing tests in /testbed.", target="done")],
        solver=[use_tools([bash(), text_editor()]), generate()],
        scorer=tests_pass(),
        sandbox=spec,
    )
    return task, get_model("mockllm/model", custom_outputs=outputs)


def _scores_100(spec: SandboxEnvironmentSpec, log_dir: Path) -> None:
    before = provider_containers(PROVIDER_LABEL)
    task, model = _task(spec)
    [log] = inspect_eval(task, model=model, log_dir=str(log_dir), display="none")
    assert log.status == "success", log.error
    assert log.samples is not None
    [sample] = log.samples
    assert sample.scores is not None
    [score] = sample.scores.values()
    assert score.value == CORRECT, score.explanation
    assert log.results is not None and log.results.scores[0].metrics["accuracy"].value == 1.0
    assert provider_containers(PROVIDER_LABEL) - before == set()


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
def test_a_swe_task_scores_100_on_the_providers_defaults(
    runtime: str, task_context: Path, tmp_path: Path
) -> None:
    client = docker.from_env()
    try:
        require(runtime in (client.info().get("Runtimes") or {}), f"the engine has no {runtime} runtime")
    finally:
        client.close()
    config = (
        AdkSandboxConfig(image=IMAGE) if runtime == "runc" else AdkSandboxConfig(image=IMAGE, runtime="runsc")
    )
    _scores_100(SandboxEnvironmentSpec("adk-sandbox", config), tmp_path)


def test_the_same_task_through_its_compose_file(task_context: Path, tmp_path: Path) -> None:
    """The compose file written for inspect's docker provider, as it is: built, then run the same way."""
    _scores_100(SandboxEnvironmentSpec("adk-sandbox", str(task_context / "compose.yaml")), tmp_path)


def test_the_hardened_profile_cannot_do_this_task(task_context: Path) -> None:
    """Why the task profile exists: as before, the hardened shape refuses the task's first step."""
    import asyncio  # noqa: PLC0415

    from adk_sandbox.devtools.adapters.inspect_sandbox import AdkSandboxEnvironment  # noqa: PLC0415

    config = AdkSandboxConfig(image=IMAGE, profile="hardened", user="0:0", working_dir="/testbed")

    async def attempt() -> str:
        environments = await AdkSandboxEnvironment.sample_init("hardened-swe", config, {})
        try:
            result = await environments["default"].exec(["sh", "-c", textwrap.dedent(SED_FIX) + " 2>&1"])
            return result.stdout
        finally:
            await AdkSandboxEnvironment.sample_cleanup("hardened-swe", config, environments, False)
            await AdkSandboxEnvironment.task_cleanup("hardened-swe", config, True)

    assert "Read-only file system" in asyncio.run(attempt())
