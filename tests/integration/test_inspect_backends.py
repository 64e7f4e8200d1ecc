"""The SWE-shaped inspect eval through the provider on a microVM and on Kubernetes (``backend:``).

The task of tests/integration/test_inspect_task_eval.py -- a package whose tests fail until two bugs are
fixed, ``pip install -e .``, the fixes, pytest as the scorer -- in the shape these sandboxes give: their
root is read-only and commands run as the config's user (1000), so the repository comes with the sample
(``Sample(files=...)``, written where the session starts: HOME in the VM, the workspace ``emptyDir`` in
the Pod) and pip installs for the user. Only ``bash`` is used: inspect's ``text_editor`` runs a helper it
copies into ``/var/tmp``, which neither sandbox can write. The image is the task image
(``adk-sandbox-test/swe-task``: the base with pip and pytest), built by the Docker eval's fixture.

The microVM needs QEMU (fails in CI, skips locally, as tests/integration/test_microvm.py). Kubernetes runs
on the cluster ``ADK_SANDBOX_K8S_CONTEXT`` names (in CI the one-node cluster of ``../shared/k8s``, into
whose containerd the task image is imported; elsewhere ``ADK_SANDBOX_K8S_SWE_IMAGE`` names a pushed copy),
failing in CI as tests/integration/test_k8s_cluster.py does.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IN_CI, require
from tests.integration.k8s_cluster import CONTEXT, import_image, needs_cluster

try:
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import Sample
    from inspect_ai.model import ModelOutput, ModelUsage, get_model
    from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
    from inspect_ai.solver import TaskState, generate, use_tools
    from inspect_ai.tool import bash
    from inspect_ai.util import SandboxEnvironmentSpec, sandbox

    from adk_sandbox.devtools.adapters.inspect_sandbox import AdkSandboxConfig, AdkSandboxEnvironment
    from adk_sandbox.executor.errors import InvalidRequestError
    from adk_sandbox.executor.types import ResourceLimits
    from tests.integration.test_inspect_task_eval import IMAGE, OPS, PYPROJECT, TESTS, task_context

    INSPECT_MISSING = None
except ImportError as exc:  # pragma: no cover - the inspect extra is not installed
    if IN_CI:
        raise
    INSPECT_MISSING = str(exc)

__all__ = ["task_context"]  # the fixture that builds the task image

PIP_INSTALL = "pip install --user --no-build-isolation --no-deps -e . 2>&1 | tail -1"
ADD_FIX = "sed -i 's/return a - b  # BUG: subtracts/return a + b/' src/calc/ops.py"
MUL_FIX = r"sed -i 's/return a \* b + 1  # BUG: off by one/return a * b/' src/calc/ops.py"
FILES = {
    "pyproject.toml": PYPROJECT,
    "src/calc/__init__.py": "",
    "src/calc/ops.py": OPS,
    "tests/test_ops.py": TESTS,
}


def _task(config: AdkSandboxConfig, backend: str) -> tuple[Any, Any]:
    outputs = [
        ModelOutput.for_tool_call(
            model="mockllm/model", tool_name="bash", tool_arguments={"command": command}
        )
        for command in (PIP_INSTALL, ADD_FIX, MUL_FIX)
    ]
    outputs.append(ModelOutput.from_content(model="mockllm/model", content="done"))
    for output in outputs:  # counted, so inspect fetches no tokenizer (no network here)
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)

    @scorer(metrics=[accuracy()])
    def tests_pass() -> Any:
        async def score(state: TaskState, target: Target) -> Score:
            errors = [m.error for m in state.messages if m.role == "tool" and m.error is not None]
            tests = await sandbox().exec(["python3", "-m", "pytest", "-q", "tests"])
            where = await sandbox().exec(
                ["sh", "-c", "pwd; id -u; cd / && python3 -c 'import calc.ops as o; print(o.__file__)'"]
            )
            workdir, uid, installed = [*where.stdout.split(), "", "", ""][:3]
            try:  # a capability the backend lacks is refused with its name, not weakened
                carries = (await sandbox().as_type(AdkSandboxEnvironment).snapshot()).carries
                refused = ""
            except InvalidRequestError as exc:
                carries, refused = (), str(exc)
            checks = {
                "no tool errors": not errors,
                "tests pass": tests.success,
                "editable install": installed == f"{workdir}/src/calc/ops.py",
                "the config's user": uid == "1000",
                # a microVM is kept whole (its processes with it); a Pod is refused by name
                "snapshot as the backend can": "processes" in carries
                if backend == "microvm"
                else f"not available on the {backend} backend" in refused,
            }
            failed = [name for name, ok in checks.items() if not ok]
            return Score(
                value=INCORRECT if failed else CORRECT,
                explanation=f"failed: {failed}; errors: {errors}; {tests.stdout[-800:]}{where.stderr}",
            )

        return score

    task = Task(
        dataset=[Sample(input="Fix the failing tests.", target="done", files=FILES)],
        solver=[use_tools([bash(timeout=600)]), generate()],
        scorer=tests_pass(),
        sandbox=SandboxEnvironmentSpec("adk-sandbox", config),
    )
    return task, get_model("mockllm/model", custom_outputs=outputs)


def _scores_100(config: AdkSandboxConfig, backend: str, log_dir: Path) -> None:
    task, model = _task(config, backend)
    [log] = inspect_eval(task, model=model, log_dir=str(log_dir), display="none")
    assert log.status == "success", log.error
    assert log.samples is not None
    [sample] = log.samples
    assert sample.scores is not None
    [score] = sample.scores.values()
    assert score.value == CORRECT, score.explanation
    assert log.results is not None and log.results.scores[0].metrics["accuracy"].value == 1.0


@pytest.mark.slow
@pytest.mark.docker  # the VM's root disk is made from the task image in the Docker engine
def test_the_swe_task_scores_100_on_a_microvm(task_context: Path, tmp_path: Path) -> None:
    require(INSPECT_MISSING is None, f"inspect_ai is not installed: {INSPECT_MISSING}")
    require(shutil.which("qemu-system-x86_64") is not None, "QEMU is not installed (scripts/setup)")
    config = AdkSandboxConfig(
        backend={"type": "microvm", "boot_timeout_seconds": 120},
        image=IMAGE,
        limits=ResourceLimits(memory_mb=1024, cpus=1, pids=512),
    )
    _scores_100(config, "microvm", tmp_path)


@pytest.mark.slow
@pytest.mark.docker  # the task image is built in the Docker engine, then imported into the cluster
@needs_cluster
def test_the_swe_task_scores_100_on_kubernetes(task_context: Path, tmp_path: Path) -> None:
    require(INSPECT_MISSING is None, f"inspect_ai is not installed: {INSPECT_MISSING}")
    if "ADK_SANDBOX_K8S_SWE_IMAGE" not in os.environ:
        import_image(IMAGE)  # no registry: the node gets the image built here
    settings = {
        "type": "kubernetes",
        "context": CONTEXT,
        "namespace": os.environ.get("ADK_SANDBOX_K8S_NAMESPACE", "default"),
        "image_pull_policy": "Never" if "ADK_SANDBOX_K8S_SWE_IMAGE" not in os.environ else "IfNotPresent",
        "startup_timeout_seconds": 300.0,
    }
    image = os.environ.get("ADK_SANDBOX_K8S_SWE_IMAGE", IMAGE)
    config = AdkSandboxConfig(backend=settings, image=image, limits=ResourceLimits(memory_mb=1024, cpus=1))
    _scores_100(config, "kubernetes", tmp_path)
