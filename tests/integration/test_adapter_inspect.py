"""The inspect_ai provider (devtools.adapters.inspect_sandbox) driven by inspect's own machinery.

* inspect's conformance suite (``inspect_ai.util._sandbox.self_check``, 44 checks) against the provider,
  under runc and gVisor, with the known failures listed per runtime (inspect's own style) as strict
  xfails: a check that starts passing fails the run until it is taken off the list.
* a real ``inspect_ai.eval`` with ``mockllm/model`` and scripted tool calls of ``bash()``, ``python()``,
  ``text_editor()`` and ``bash_session()`` in the sandbox, scored.

In CI a missing inspect_ai fails these tests (it is a dependency of the ``inspect`` extra), never skips.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import docker
import pytest

from tests.conftest import IN_CI, require

try:
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import Sample
    from inspect_ai.model import ModelOutput, ModelUsage, get_model
    from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
    from inspect_ai.solver import TaskState, generate, use_tools
    from inspect_ai.tool import bash, bash_session, python, text_editor
    from inspect_ai.util import SandboxEnvironment, SandboxEnvironmentSpec, sandbox
    from inspect_ai.util._sandbox.self_check import *  # noqa: F403 - inspect's checks, collected here

    from devtools.adapters.inspect_sandbox import PROVIDER_LABEL, AdkSandboxConfig, AdkSandboxEnvironment

    INSPECT_MISSING = None
except ImportError as exc:  # pragma: no cover - the inspect extra is not installed
    if IN_CI:
        raise
    INSPECT_MISSING = str(exc)

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

TASK = "test_adapter_inspect"

#: Checks this provider fails, per runtime, and why (strict xfails: each must really fail).
KNOWN_FAILURES: dict[str, dict[str, str]] = {
    runtime: {
        "test_exec_as_user": (
            "adds a user with adduser as root: the base image has no adduser, and the sandbox's root "
            "filesystem is read-only with every capability dropped (SPEC §4), so /etc/passwd cannot "
            "change; running as any existing user (user='root', a uid, a name) works"
        ),
    }
    for runtime in ("runc", "runsc")
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _runtime_available(runtime: str) -> None:
    try:
        client = docker.from_env()
        runtimes = client.info().get("Runtimes") or {}
        client.close()
    except docker.errors.DockerException as exc:
        require(False, f"the Docker engine is not usable here: {exc}")
        return
    require(runtime in runtimes, f"the Docker engine has no {runtime} runtime")


@pytest.fixture(scope="module", params=["runc", "runsc"])
def module_sandbox(request: pytest.FixtureRequest) -> Iterator[tuple[str, SandboxEnvironment]]:
    """One sample's sandbox per runtime, made and removed by the provider's own lifecycle calls."""
    require(INSPECT_MISSING is None, f"inspect_ai is not installed: {INSPECT_MISSING}")
    runtime = request.param
    _runtime_available(runtime)
    config = AdkSandboxConfig(runtime=runtime)
    asyncio.run(AdkSandboxEnvironment.task_init(TASK, config))
    environments = asyncio.run(AdkSandboxEnvironment.sample_init(TASK, config, {}))
    try:
        yield runtime, environments["default"]
    finally:
        asyncio.run(AdkSandboxEnvironment.sample_cleanup(TASK, config, environments, False))
        asyncio.run(AdkSandboxEnvironment.task_cleanup(TASK, config, True))


@pytest.fixture
def sandbox_env(
    request: pytest.FixtureRequest, module_sandbox: tuple[str, SandboxEnvironment]
) -> SandboxEnvironment:
    """What inspect's checks take: the module's sandbox, with this runtime's known failures marked."""
    runtime, environment = module_sandbox
    reason = KNOWN_FAILURES[runtime].get(request.node.originalname)
    if reason is not None:
        request.node.add_marker(pytest.mark.xfail(reason=reason, strict=True))
    return environment


def provider_containers() -> list[str]:
    client = docker.from_env()
    try:
        label = f"{PROVIDER_LABEL}=adk-sandbox"
        return [c.id for c in client.containers.list(all=True, sparse=True, filters={"label": label})]
    finally:
        client.close()


# -- a real eval ----------------------------------------------------------------------------------------
def _scripted_eval_task(runtime: str) -> Any:
    """A task whose mock model calls bash, python, text_editor and bash_session, then answers."""

    # Usage given: without it mockllm counts tokens with tiktoken, which downloads its encoding.
    usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)

    def call(tool: str, **arguments: Any) -> ModelOutput:
        output = ModelOutput.for_tool_call(model="mockllm/model", tool_name=tool, tool_arguments=arguments)
        output.usage = usage
        return output

    outputs = [
        call("bash", cmd="echo hello-from-bash > /tmp/greeting && id -u"),
        call("python", code="print(open('/tmp/greeting').read().strip().upper())"),
        call("text_editor", command="create", path="/tmp/notes.md", file_text="alpha\ngamma\n"),
        call("text_editor", command="str_replace", path="/tmp/notes.md", old_str="alpha", new_str="beta"),
        call("bash_session", action="type_submit", input="cat /tmp/notes.md; echo session-$((6*7))"),
        ModelOutput.from_content(model="mockllm/model", content="done: beta"),
    ]
    outputs[-1].usage = usage

    @scorer(metrics=[accuracy()])
    def sandbox_state() -> Any:
        async def score(state: TaskState, target: Target) -> Score:
            # Each tool's result as the model saw it, and the files the tools left in the sandbox.
            results = [m for m in state.messages if m.role == "tool"]
            errors = [m.error for m in results if m.error is not None]  # type: ignore[union-attr]
            texts = [m.text for m in results]
            notes = await sandbox().read_file("/tmp/notes.md")
            checks = {
                "six tool calls answered": len(results) == 5,
                "no tool errors": not errors,
                "bash ran as nobody": texts[0].strip() == "65534" if texts else False,
                "python read bash's file": "HELLO-FROM-BASH" in texts[1] if len(texts) > 1 else False,
                "text_editor edited the file": notes == "beta\ngamma\n",
                "bash_session ran": len(texts) > 4 and "session-42" in texts[4] and "beta" in texts[4],
            }
            failed = [name for name, ok in checks.items() if not ok]
            return Score(
                value=INCORRECT if failed else CORRECT,
                explanation=f"failed: {failed}; errors: {errors}; tool results: {texts}",
            )

        return score

    return Task(
        dataset=[Sample(input="Use the tools.", target="beta")],
        solver=[use_tools([bash(), python(), text_editor(), bash_session()]), generate()],
        scorer=sandbox_state(),
        sandbox=SandboxEnvironmentSpec("adk-sandbox", AdkSandboxConfig(runtime=runtime)),
    ), get_model("mockllm/model", custom_outputs=outputs)


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
def test_inspect_eval_with_the_four_sandbox_tools(runtime: str, tmp_path: Any) -> None:
    require(INSPECT_MISSING is None, f"inspect_ai is not installed: {INSPECT_MISSING}")
    _runtime_available(runtime)
    before = set(provider_containers())
    task, model = _scripted_eval_task(runtime)
    [log] = inspect_eval(task, model=model, log_dir=str(tmp_path), display="none")
    assert log.status == "success", log.error
    assert log.samples is not None
    [sample] = log.samples
    assert sample.scores is not None
    [score] = sample.scores.values()
    assert score.value == "C", score.explanation
    assert log.results is not None
    assert log.results.scores[0].metrics["accuracy"].value == 1.0
    # The sample's container went with the sample; nothing of this eval is left.
    assert set(provider_containers()) - before == set()
