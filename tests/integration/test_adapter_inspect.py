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
import shlex
import subprocess
import sys
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
    from inspect_ai.util import OutputLimitExceededError, SandboxEnvironment, SandboxEnvironmentSpec, sandbox
    from inspect_ai.util._sandbox.limits import override_max_exec_output_size
    from inspect_ai.util._sandbox.self_check import *  # noqa: F403 - inspect's checks, collected here

    from adk_sandbox.devtools.adapters.inspect_sandbox import (
        PROVIDER_LABEL,
        AdkSandboxConfig,
        AdkSandboxEnvironment,
        resolve_config,
    )

    INSPECT_MISSING = None
except ImportError as exc:  # pragma: no cover - the inspect extra is not installed
    if IN_CI:
        raise
    INSPECT_MISSING = str(exc)

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

TASK = "test_adapter_inspect"

#: Checks this provider fails, per runtime, and why (strict xfails: each must really fail). None now: the
#: task profile (the default) lets ``test_exec_as_user`` add its user with ``adduser`` as root.
KNOWN_FAILURES: dict[str, dict[str, str]] = {"runc": {}, "runsc": {}}


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


# -- what the checks do not cover -------------------------------------------------------------------------
def test_config_from_a_yaml_file(tmp_path: Any) -> None:
    require(INSPECT_MISSING is None, f"inspect_ai is not installed: {INSPECT_MISSING}")
    path = tmp_path / "adk-sandbox.yaml"
    path.write_text("runtime: runsc\nlimits: {memory_mb: 512}\ntmpfs: {/var/tmp: 32}\n")
    config = resolve_config(str(path))
    assert (config.runtime, config.limits.memory_mb, config.tmpfs) == ("runsc", 512, {"/var/tmp": 32})
    assert config.network is False
    path.write_text("runtime: runsc\nnetwrok: true\n")
    with pytest.raises(ValueError, match="netwrok"):
        resolve_config(str(path))
    path.write_text("user: app:app\n")  # names, looked up in the container
    assert resolve_config(str(path)).user == "app:app"
    path.write_text("user: 'a b'\n")
    with pytest.raises(ValueError, match="user"):
        resolve_config(str(path))
    # inspect round-trips the model through an eval log's spec.
    assert AdkSandboxEnvironment.config_deserialize(config.model_dump()) == config
    assert hash(config) == hash(AdkSandboxConfig.model_validate(config.model_dump()))


async def test_exec_as_users_by_name_and_an_unknown_one(sandbox_env: SandboxEnvironment) -> None:
    assert (await sandbox_env.exec(["id", "-u"])).stdout == "0\n"  # the task profile: the image's user
    assert (await sandbox_env.exec(["id", "-u"], user="root")).stdout == "0\n"
    assert (await sandbox_env.exec(["id", "-un"], user="daemon")).stdout == "daemon\n"
    assert (await sandbox_env.exec(["id", "-u"], user="1234")).stdout == "1234\n"
    unknown = await sandbox_env.exec(["id"], user="no-such-user")
    assert (unknown.success, unknown.returncode) == (False, 126)
    assert "no-such-user" in unknown.stderr


async def test_exec_output_over_inspects_limit_raises(sandbox_env: SandboxEnvironment) -> None:
    with override_max_exec_output_size(1024), pytest.raises(OutputLimitExceededError) as raised:
        await sandbox_env.exec(["sh", "-c", "head -c 5000 /dev/zero | tr '\\0' x"])
    assert raised.value.truncated_output == "x" * 1024
    assert (await sandbox_env.exec(["sh", "-c", "head -c 1000 /dev/zero | tr '\\0' x"])).stdout == "x" * 1000


def attached(command: str, script: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` on a terminal through ``command`` (``adk-sandbox attach ID``), as a person's would."""
    argv = shlex.split(command)
    assert argv[:2] == ["adk-sandbox", "attach"], command
    done = subprocess.run(
        [sys.executable, "-m", "adk_sandbox", *argv[1:], "--", "sh", "-c", script],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.replace("\r\n", "\n"), done.stderr
    )


async def test_connection_attaches_a_terminal(sandbox_env: SandboxEnvironment) -> None:
    """``inspect sandbox connect`` gives ``adk-sandbox attach ID``: a terminal in the sample's session."""
    connection = await sandbox_env.connection()
    done = attached(connection.command, "id -u; pwd; tty")
    lines = done.stdout.split("\n")
    assert lines[:2] == ["0", "/home/sandbox"], done.stderr  # the image's USER (none: root) and WORKDIR
    assert lines[2].startswith("/dev/pts/"), done.stdout
    as_nobody = attached((await sandbox_env.connection(user="nobody")).command, "id -u")
    assert as_nobody.stdout == "65534\n", as_nobody.stderr


async def test_the_hardened_profile_runs_as_nobody_in_tmp_on_a_read_only_root() -> None:
    """``profile="hardened"`` keeps the old shape: nobody, /tmp, a read-only root, also for connect."""
    require(INSPECT_MISSING is None, f"inspect_ai is not installed: {INSPECT_MISSING}")
    _runtime_available("runc")
    config = AdkSandboxConfig(profile="hardened")
    environments = await AdkSandboxEnvironment.sample_init("hardened", config, {})
    environment = environments["default"]
    try:
        done = await environment.exec(["sh", "-c", "id -u; pwd; touch /etc/x || echo refused"], user="root")
        assert done.stdout.split("\n")[1:] == ["/tmp", "refused", ""], done
        assert (await environment.exec(["id", "-u"])).stdout == "65534\n"
        await environment.write_file("note.txt", "kept")
        assert (await environment.exec(["cat", "/tmp/note.txt"])).stdout == "kept"
        connection = await environment.connection()
        shown = attached(connection.command, "id -u; pwd")
        assert shown.stdout == "65534\n/tmp\n", shown.stderr
    finally:
        await AdkSandboxEnvironment.sample_cleanup("hardened", config, environments, False)
        await AdkSandboxEnvironment.task_cleanup("hardened", config, True)


async def test_a_network_policy_from_the_config_reaches_only_what_it_allows() -> None:
    """``network: {allow: [...], hosts: {...}}`` as YAML gives it: network none, a proxy, the host decides."""
    require(INSPECT_MISSING is None, f"inspect_ai is not installed: {INSPECT_MISSING}")
    _runtime_available("runc")
    from tests.integration.test_docker_egress import FETCH, Upstream  # noqa: PLC0415 - docker tests' server

    upstream = Upstream()
    network = {"allow": [f"allowed.test:{upstream.port}"], "hosts": {"allowed.test": ["127.0.0.1"]}}
    config = AdkSandboxConfig.model_validate({"network": network})
    environments = await AdkSandboxEnvironment.sample_init("policy", config, {})
    try:
        fetch = f"URL = 'http://allowed.test:{upstream.port}/inspect'\n{FETCH}"
        done = await environments["default"].exec(["python3", "-c", fetch])
        assert done.stdout.startswith("200 "), done
        other = f"URL = 'http://other.test:{upstream.port}/'\n{FETCH}"
        refused = await environments["default"].exec(["python3", "-c", other])
        assert refused.stdout.startswith("403 ") and "no rule allows it" in refused.stdout, refused
        assert len(upstream.received) == 1
    finally:
        await AdkSandboxEnvironment.sample_cleanup("policy", config, environments, False)
        await AdkSandboxEnvironment.task_cleanup("policy", config, True)
        upstream.close()


async def test_cli_cleanup_removes_a_kept_sample_by_its_session_id() -> None:
    require(INSPECT_MISSING is None, f"inspect_ai is not installed: {INSPECT_MISSING}")
    _runtime_available("runc")
    config = AdkSandboxConfig()
    environments = await AdkSandboxEnvironment.sample_init("cli-cleanup", config, {})
    environment = environments["default"]
    assert isinstance(environment, AdkSandboxEnvironment)
    container = environment._session.container_id
    assert container in provider_containers()
    await AdkSandboxEnvironment.cli_cleanup(environment._session.session_id)
    assert container not in provider_containers()
    await AdkSandboxEnvironment.sample_cleanup("cli-cleanup", config, environments, False)
    await AdkSandboxEnvironment.task_cleanup("cli-cleanup", config, True)


async def test_kept_samples_are_listed_and_cli_cleanup_removes_one_by_its_container_id(
    capsys: pytest.CaptureFixture[str],
) -> None:
    require(INSPECT_MISSING is None, f"inspect_ai is not installed: {INSPECT_MISSING}")
    _runtime_available("runc")
    task, config = "cli-cleanup-by-id", AdkSandboxConfig()
    samples = [await AdkSandboxEnvironment.sample_init(task, config, {}) for _ in range(2)]
    first, second = (environments["default"].as_type(AdkSandboxEnvironment) for environments in samples)
    backend = AdkSandboxEnvironment._backend(task, config)
    try:
        # --no-sandbox-cleanup: the containers are kept and each is listed with the command removing it.
        await AdkSandboxEnvironment.task_cleanup(task, config, False)
        kept = capsys.readouterr().out
        for environment in (first, second):
            assert f"left running: {environment._session.container_id[:12]}" in kept
            assert f"cleanup adk-sandbox {environment._session.session_id}`" in kept
        short = first._session.container_id[:12]
        await AdkSandboxEnvironment.cli_cleanup(short)
        assert capsys.readouterr().out == f"removed adk-sandbox container {short}\n"
        assert first._session.container_id not in provider_containers()
        assert second._session.container_id in provider_containers()
        await AdkSandboxEnvironment.cli_cleanup(second._session.container_id)
        assert second._session.container_id not in provider_containers()
        await AdkSandboxEnvironment.cli_cleanup(second._session.container_id)
        assert "no adk-sandbox container matches" in capsys.readouterr().out
        for environments in samples:
            await AdkSandboxEnvironment.sample_cleanup(task, config, environments, False)
        with pytest.raises(ConnectionError, match="removed"):  # the session is closed now
            await first.connection()
    finally:
        backend.close()


# -- a real eval ----------------------------------------------------------------------------------------
ALL_TOOLS = ("bash", "python", "text_editor", "bash_session")


def _scripted_eval_task(runtime: str, tools: tuple[str, ...]) -> Any:
    """A task whose mock model calls each of ``tools`` in the sandbox, then answers; scored from both."""
    # Usage given: without it mockllm counts tokens with tiktoken, which downloads its encoding.
    usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)

    def call(tool: str, **arguments: Any) -> ModelOutput:
        output = ModelOutput.for_tool_call(model="mockllm/model", tool_name=tool, tool_arguments=arguments)
        output.usage = usage
        return output

    script = [
        call("bash", command="echo hello-from-bash > /tmp/greeting && id -u"),
        call("python", code="print(open('/tmp/greeting').read().strip().upper())"),
        call("text_editor", command="create", path="/tmp/notes.md", file_text="alpha\ngamma\n"),
        call("text_editor", command="str_replace", path="/tmp/notes.md", old_str="alpha", new_str="beta"),
        call("bash_session", action="type_submit", input="cat /tmp/notes.md; echo session-$((6*7))"),
    ]
    outputs = [output for output in script if output.message.tool_calls[0].function in tools]  # type: ignore[index]
    final = ModelOutput.from_content(model="mockllm/model", content="done")
    final.usage = usage
    outputs.append(final)

    @scorer(metrics=[accuracy()])
    def sandbox_state() -> Any:
        async def score(state: TaskState, target: Target) -> Score:
            # Each tool's result as the model saw it, and the files the tools left in the sandbox.
            results = {}
            for message in state.messages:
                if message.role == "tool":
                    assert message.function is not None
                    results.setdefault(message.function, []).append(message)
            errors = [m.error for ms in results.values() for m in ms if m.error is not None]
            text = {tool: "\n".join(m.text for m in ms) for tool, ms in results.items()}
            checks = {"every call answered": sum(map(len, results.values())) == len(outputs) - 1}
            checks["no tool errors"] = not errors
            if "bash" in tools:
                checks["bash ran as the image's user (root)"] = text.get("bash", "").strip() == "0"
            if "python" in tools:
                checks["python read bash's file"] = "HELLO-FROM-BASH" in text.get("python", "")
            if "text_editor" in tools:
                notes = await sandbox().read_file("/tmp/notes.md")
                checks["text_editor created and edited the file"] = notes == "beta\ngamma\n"
            if "bash_session" in tools:
                checks["bash_session ran"] = "session-42" in text.get("bash_session", "")
            failed = [name for name, ok in checks.items() if not ok]
            return Score(
                value=INCORRECT if failed else CORRECT,
                explanation=f"failed: {failed}; errors: {errors}; tool results: {text}",
            )

        return score

    factories = {"bash": bash, "python": python, "text_editor": text_editor, "bash_session": bash_session}
    return Task(
        dataset=[Sample(input="Use the tools.", target="done")],
        solver=[use_tools([factories[name]() for name in tools]), generate()],
        scorer=sandbox_state(),
        sandbox=SandboxEnvironmentSpec("adk-sandbox", AdkSandboxConfig(runtime=runtime)),
    ), get_model("mockllm/model", custom_outputs=outputs)


def _eval_scores_correct(runtime: str, tools: tuple[str, ...], log_dir: str) -> None:
    require(INSPECT_MISSING is None, f"inspect_ai is not installed: {INSPECT_MISSING}")
    _runtime_available(runtime)
    before = set(provider_containers())
    task, model = _scripted_eval_task(runtime, tools)
    [log] = inspect_eval(task, model=model, log_dir=log_dir, display="none")
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


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
def test_inspect_eval_with_the_four_sandbox_tools(runtime: str, tmp_path: Any) -> None:
    # Under gVisor this needs runsc 20240729 or later (scripts/setup installs it): inspect verifies its
    # tool directory with coreutils `stat`, whose statx call older runsc rejects with EINVAL.
    _eval_scores_correct(runtime, ALL_TOOLS, str(tmp_path))
