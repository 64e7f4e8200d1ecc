"""The google-adk integration driven by google-adk's own machinery.

An ``InMemoryRunner`` runs an ``Agent`` whose model is a scripted ``BaseLlm``: it answers each request
with the function calls (or code block) of its script, and records every request, so a test can check
what the model was shown. The tools run on a real Docker workspace. The schema test converts every
tool's declaration with ADK's own Gemini conversion. google-adk is imported at the top: without the
package the module fails to collect (in CI too), it never skips.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any

import pytest
from google.adk.agents import Agent
from google.adk.code_executors.code_execution_utils import CodeExecutionInput
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import InMemoryRunner
from google.adk.tools._gemini_schema_util import _to_gemini_schema
from google.genai import types
from pydantic import BaseModel, Field

from adk_sandbox.devtools import DevToolset, Workspace
from adk_sandbox.devtools.adapters.adk import (
    ONLY_LISTED_ARGUMENTS,
    AdkTool,
    SandboxCodeExecutor,
    SandboxToolset,
)
from adk_sandbox.executor import BackendUnavailableError, CodeTool, ProcessBackend, SandboxTool
from adk_sandbox.executor.backends.docker import RUST_IMAGE, DockerBackend
from adk_sandbox.executor.tool_protocol import AgentTool, ProgressCallback
from tests.conftest import containers_mounting, project_containers, require

# -- a scripted model ------------------------------------------------------------------------------------


class ScriptedLlm(BaseLlm):
    """Answers request n with ``script[n]`` (a list of parts); records every request it was sent."""

    model: str = "scripted"
    script: list[list[types.Part]]
    requests: list[LlmRequest] = Field(default_factory=list)
    tool_names: list[set[str]] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        # The contents only: the request's tools hold live sessions, which cannot be copied.
        self.requests.append(LlmRequest(contents=[c.model_copy(deep=True) for c in llm_request.contents]))
        self.tool_names.append(set(llm_request.tools_dict))
        parts = self.script[len(self.requests) - 1]
        yield LlmResponse(content=types.Content(role="model", parts=parts))


def call(call_id: str, name: str, **args: Any) -> types.Part:
    return types.Part(function_call=types.FunctionCall(id=call_id, name=name, args=args))


def text(words: str) -> types.Part:
    return types.Part(text=words)


def responses_in(request: LlmRequest) -> dict[str, dict[str, Any]]:
    """Every function response the request shows the model, by call id."""
    found: dict[str, dict[str, Any]] = {}
    for content in request.contents:
        for part in content.parts or []:
            if part.function_response is not None and part.function_response.id is not None:
                found[part.function_response.id] = dict(part.function_response.response or {})
    return found


async def run_agent(agent: Agent) -> list[str]:
    """Run one user message through ``InMemoryRunner``; the texts the agent said. Closes the runner."""
    runner = InMemoryRunner(agent=agent, app_name="adk-sandbox-test")
    said: list[str] = []
    try:
        session = await runner.session_service.create_session(app_name="adk-sandbox-test", user_id="u")
        message = types.Content(role="user", parts=[types.Part(text="go")])
        async for event in runner.run_async(user_id="u", session_id=session.id, new_message=message):
            for part in (event.content.parts or []) if event.content else []:
                if part.text:
                    said.append(part.text)
    finally:
        await runner.close()  # closes the agent's toolsets: the workspace and the extra tools
    return said


# -- schemas through ADK's Gemini conversion -------------------------------------------------------------

_SAID_IN_DESCRIPTION = {
    "exclusiveMinimum": lambda v: f"greater than {v:g}",
    "exclusiveMaximum": lambda v: f"less than {v:g}",
}
_SNAKE = {"minLength": "min_length", "maxLength": "max_length", "minItems": "min_items"}


def lost_constraints(raw: dict[str, Any], converted: types.Schema, description: str) -> list[str]:
    """What the raw JSON schema says that neither the converted Schema nor a description says."""
    lost: list[str] = []
    if raw.get("additionalProperties") is False and ONLY_LISTED_ARGUMENTS not in description:
        lost.append("additionalProperties: false")
    if sorted(raw.get("required", [])) != sorted(converted.required or []):
        lost.append("required")
    for name, field in raw["properties"].items():
        got = (converted.properties or {}).get(name)
        if got is None:
            lost.append(f"{name}: the whole field")
        else:
            lost += [f"{name}: {what}" for what in lost_in_field(field, got, raw.get("$defs", {}))]
    return lost


def lost_in_field(field: dict[str, Any], got: types.Schema, defs: dict[str, Any]) -> list[str]:
    lost: list[str] = []
    if "$ref" in field:
        name = field["$ref"].rsplit("/", 1)[-1]
        field = {**defs[name], **{k: v for k, v in field.items() if k != "$ref"}}
    if got.type is None:
        lost.append("no type (Gemini rejects it)")
    keywords = dict(field)
    if "anyOf" in keywords:
        if not got.nullable:
            lost.append("null allowed")
        for branch in keywords.pop("anyOf"):
            if branch.get("type") != "null":
                keywords = {**branch, **keywords}
    said = got.description or ""
    if "type" not in keywords and "JSON text" not in said:
        lost.append("any JSON value, not said to be JSON text")
    for keyword, value in keywords.items():
        if keyword != "title" and not kept(keyword, value, got, said):  # a title repeats the field's name
            lost.append(keyword if keyword in ("description", "default") else f"{keyword} {value!r}")
    return lost


def kept(keyword: str, value: Any, got: types.Schema, said: str) -> bool:
    """Whether the converted field (or its description ``said``) carries ``keyword: value``."""
    if keyword == "description":
        return said.startswith(value)
    if keyword == "default":
        return value is None or got.default == value  # an omitted argument is null
    if keyword == "type":
        return got.type is not None and str(got.type.value).lower() == value
    if keyword in _SAID_IN_DESCRIPTION:
        return _SAID_IN_DESCRIPTION[keyword](value) in said
    return bool(getattr(got, _SNAKE.get(keyword, keyword), None) == value)


def every_tool(root: str) -> list[AgentTool]:
    backend = ProcessBackend()
    return [*DevToolset(Workspace(root)).tools, CodeTool(backend), SandboxTool(backend)]


def test_every_declaration_survives_adks_gemini_conversion_with_nothing_lost(tmp_path: Path) -> None:
    tools = every_tool(str(tmp_path))
    assert [t.name for t in tools] == [
        "read_file", "glob", "grep", "write_file", "edit_file", "bash", "code_exec", "sandbox_exec",
    ]  # fmt: skip
    for tool in tools:
        adk = AdkTool(tool)
        declaration = adk._get_declaration()
        assert declaration.parameters is not None
        # What the model gets is exactly ADK's own conversion of the adapter's JSON schema.
        assert declaration.parameters == _to_gemini_schema(adk.json_schema)
        lost = lost_constraints(tool.parameters, declaration.parameters, declaration.description or "")
        assert lost == [], f"{tool.name} loses {lost}"


def test_the_check_finds_what_a_plain_conversion_loses(tmp_path: Path) -> None:
    # The same check on ADK's conversion of the raw pydantic schemas: the losses the issue measured.
    lost = {
        tool.name: lost_constraints(tool.parameters, _to_gemini_schema(tool.parameters), tool.description)
        for tool in every_tool(str(tmp_path))
    }
    assert "additionalProperties: false" in lost["read_file"]
    assert "timeout_secs: exclusiveMinimum 0" in lost["bash"]
    assert "timeout_secs: description" in lost["bash"]  # anyOf fields lose their description too
    assert "path: description" in lost["glob"]
    assert "input: no type (Gemini rejects it)" in lost["code_exec"]


def test_code_exec_input_travels_as_json_text_and_bad_text_is_information(tmp_path: Path) -> None:
    class Echo(AgentTool):
        name = "code_exec"
        description = "echoes its input"
        args_model = CodeTool.args_model

        async def _run(self, arguments: Any, on_progress: ProgressCallback | None) -> dict[str, Any]:
            return {"status": "success", "input": arguments.input}

    tool = AdkTool(Echo())
    context: Any = None  # the adapter does not use ADK's tool context

    async def scenario() -> list[dict[str, Any]]:
        return [
            await tool.run_async(args={"code": "x", "input": '{"n": [1, 2]}'}, tool_context=context),
            await tool.run_async(args={"code": "x", "input": '"text"'}, tool_context=context),
            await tool.run_async(args={"code": "x"}, tool_context=context),
            await tool.run_async(args={"code": "x", "input": "{not json"}, tool_context=context),
            await tool.run_async(args={"code": "x", "input": "[" * 100_000}, tool_context=context),
        ]

    obj, string, absent, bad, deep = asyncio.run(scenario())
    assert obj["input"] == {"n": [1, 2]}
    assert string["input"] == "text"
    assert absent["input"] is None
    assert bad["status"] == "error"
    assert "argument 'input' of code_exec must be JSON text" in bad["message"]
    assert deep["status"] == "error"


def test_a_read_only_workspace_gives_three_tools_and_no_bash(tmp_path: Path) -> None:
    async def names(workspace: Workspace) -> list[str]:
        return [t.name for t in await SandboxToolset(workspace).get_tools()]

    with Workspace(tmp_path, writable=False, allow_bash=True) as ws:
        assert [t.name for t in DevToolset(ws).tools] == ["read_file", "glob", "grep", "bash"]
        assert asyncio.run(names(ws)) == ["read_file", "glob", "grep"]
    with Workspace.read_only(tmp_path) as ws:
        assert asyncio.run(names(ws)) == ["read_file", "glob", "grep"]


def test_tool_filter_and_prefix_are_adks_own(tmp_path: Path) -> None:
    async def scenario() -> list[tuple[str, str | None]]:
        toolset = SandboxToolset(Workspace(tmp_path), tool_filter=["grep", "bash"], tool_name_prefix="ws")
        try:
            tools = await toolset.get_tools_with_prefix()
            return [(t.name, t._get_declaration().name) for t in tools]  # type: ignore[union-attr]
        finally:
            await toolset.close()

    assert asyncio.run(scenario()) == [("ws_grep", "ws_grep"), ("ws_bash", "ws_bash")]


# -- an agent run on Docker ------------------------------------------------------------------------------


@pytest.fixture
def rust_backend() -> Iterator[DockerBackend]:
    try:
        backend = DockerBackend(image=RUST_IMAGE)
    except BackendUnavailableError as exc:
        require(False, f"the Docker engine is not usable here: {exc}")
        raise
    with backend:
        yield backend


class Exploding(AgentTool):
    """A tool with a bug: it raises an exception the project does not know."""

    name = "explode"
    description = "Fails with an unexpected exception."

    class Args(BaseModel):
        pass

    args_model = Args

    async def _run(self, arguments: Any, on_progress: ProgressCallback | None) -> dict[str, Any]:
        raise RuntimeError("boom")


RUST_ECHO = 'fn run(input: Value) -> Value { serde_json::json!({"got": input}) }'


@pytest.mark.docker
def test_an_agent_uses_every_tool_on_docker_with_parallel_calls_and_errors_as_information(
    docker_backend: DockerBackend, rust_backend: DockerBackend, owned_workspace: Path
) -> None:
    before = set(project_containers(docker_backend._client, os.getpid()))
    workspace = Workspace(owned_workspace, sandbox=docker_backend)
    toolset = SandboxToolset(
        workspace, extra_tools=[CodeTool(rust_backend), SandboxTool(docker_backend), Exploding()]
    )
    model = ScriptedLlm(
        script=[
            # Two calls in one model turn, run in parallel by ADK.
            [
                call("w", "write_file", path="a.txt", content="hello\n"),
                call("b", "bash", command="id -u; uname -s"),
            ],
            [
                call("r", "read_file", path="a.txt"),
                call("g", "glob", pattern="*.txt"),
                call("q", "grep", pattern="hel+o"),
            ],
            # Errors: a missing file, an unknown argument, a bug in a tool -- and an edit in the same turn.
            [
                call("missing", "read_file", path="missing.txt"),
                call("extra", "glob", pattern="*", bogus=1),
                call("boom", "explode"),
                call("e", "edit_file", path="a.txt", old_string="hello", new_string="bye"),
            ],
            [
                call("c", "code_exec", code=RUST_ECHO, input='{"n": 21}'),
                call("s", "sandbox_exec", language="python", code="print(6 * 7)"),
            ],
            [call("after", "bash", command="cat a.txt")],
            [text("done")],
        ]
    )
    agent = Agent(name="coder", model=model, tools=[toolset])

    said = asyncio.run(run_agent(agent))

    assert said[-1] == "done", "the run did not reach the model's final answer"
    assert len(model.requests) == 6
    assert model.tool_names[0] == {
        *("read_file", "glob", "grep", "write_file", "edit_file", "bash"),
        *("code_exec", "sandbox_exec", "explode"),
    }
    seen = responses_in(model.requests[-1])
    assert seen["w"].get("status") != "error", seen["w"]
    assert seen["b"]["stdout"] == "1000\nLinux\n"
    assert seen["b"]["isolation"] == "container"
    assert seen["r"]["content"] == "     1\thello\n"
    assert "a.txt" in json.dumps(seen["g"])
    assert "hello" in json.dumps(seen["q"])
    # Each error came back to the model as a function response in the very next request.
    errors = responses_in(model.requests[3])
    assert errors["missing"]["status"] == "error"
    assert "missing.txt" in errors["missing"]["message"]
    assert errors["extra"]["status"] == "error"
    assert "unknown argument 'bogus'" in errors["extra"]["message"]
    assert errors["boom"] == {"status": "error", "message": "RuntimeError: boom"}
    assert errors["e"].get("status") != "error", errors["e"]
    assert seen["c"]["status"] == "success", seen["c"]
    assert seen["c"]["output"] == {"got": {"n": 21}}
    assert (seen["s"]["status"], seen["s"]["stdout"]) == ("success", "42\n")
    assert seen["after"]["stdout"] == "bye\n"
    # The runner's close closed the toolset: the workspace's session and the tools' sessions are gone.
    assert containers_mounting(docker_backend._client, owned_workspace) == []
    assert set(project_containers(docker_backend._client, os.getpid())) <= before


@pytest.mark.docker
def test_the_code_executor_runs_code_blocks_in_one_docker_session(docker_backend: DockerBackend) -> None:
    before = set(project_containers(docker_backend._client, os.getpid()))
    fence = "```python\n{}\n```"
    model = ScriptedLlm(
        script=[
            [text(fence.format("open('/tmp/kept', 'w').write('state')\nprint(6 * 7)"))],
            [text(fence.format("raise ValueError('saw ' + open('/tmp/kept').read())"))],
            [text("done")],
        ]
    )
    with SandboxCodeExecutor(docker_backend) as executor:
        agent = Agent(name="coder", model=model, code_executor=executor)
        said = asyncio.run(run_agent(agent))
        during = set(project_containers(docker_backend._client, os.getpid())) - before
    assert said[-1] == "done"
    assert len(during) == 1, "the code blocks did not share one session container"

    def results(request: LlmRequest) -> str:
        # What the model reads: ADK turns each code execution result into a ```tool_output block.
        return "\n".join(
            part.text
            for content in request.contents
            for part in content.parts or []
            if part.text and part.text.startswith("```tool_output")
        )

    assert "42" in results(model.requests[1])
    second = results(model.requests[2])
    # An error is shown to the model; the second block saw the first one's file: one session.
    assert "ValueError: saw state" in second
    assert set(project_containers(docker_backend._client, os.getpid())) <= before, "the session was left"


@pytest.mark.docker
def test_the_code_executor_reports_a_timeout_to_the_model(docker_backend: DockerBackend) -> None:
    with SandboxCodeExecutor(docker_backend, timeout_seconds=1) as executor:
        result = executor.execute_code(None, CodeExecutionInput(code="import time\ntime.sleep(30)"))  # type: ignore[arg-type]
    assert "timeout" in result.stderr
