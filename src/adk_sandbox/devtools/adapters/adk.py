"""google-adk integration (extra ``adk``): the project's tools as an ADK toolset, and a code executor.

:class:`SandboxToolset` (a ``BaseToolset`` of a workspace's tools plus extra tools),
:class:`AdkTool` (one ``AgentTool`` as a ``BaseTool``; never raises), :func:`gemini_parameters` (its
declaration for ADK's Gemini conversion) and :class:`SandboxCodeExecutor` (the model's code blocks).
See docs/INTEGRATIONS.md, section "google-adk", for usage and every case.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

from google.adk.code_executors.base_code_executor import BaseCodeExecutor
from google.adk.code_executors.code_execution_utils import CodeExecutionInput, CodeExecutionResult
from google.adk.tools._gemini_schema_util import _to_gemini_schema
from google.adk.tools.base_tool import BaseTool
from google.adk.tools.base_toolset import BaseToolset, ToolPredicate
from google.genai import types
from pydantic import Field, PrivateAttr

from adk_sandbox.devtools.toolset import DevToolset
from adk_sandbox.devtools.workspace import Workspace
from adk_sandbox.executor.backend import SandboxBackend, SessionFactory
from adk_sandbox.executor.backends.factory import BackendConfig, make_backend
from adk_sandbox.executor.tool_protocol import AgentTool, call_tool, error_payload
from adk_sandbox.executor.tools import DEFAULT_TIMEOUT_SECS, SandboxTool

if TYPE_CHECKING:
    from google.adk.agents.invocation_context import InvocationContext
    from google.adk.agents.readonly_context import ReadonlyContext
    from google.adk.tools.tool_context import ToolContext

__all__ = [
    "ONLY_LISTED_ARGUMENTS",
    "AdkTool",
    "SandboxCodeExecutor",
    "SandboxToolset",
    "gemini_parameters",
]

ONLY_LISTED_ARGUMENTS = "Takes only the arguments listed in its schema; any other argument is refused."
"""Appended to every tool's description: ``additionalProperties: false``, which Gemini's Schema drops."""

# JSON-schema keywords the Gemini Schema carries with the same meaning: kept as they are.
_CARRIED = frozenset(
    {"type", "description", "properties", "required", "items", "enum", "default", "minimum", "maximum",
     "minLength", "maxLength", "minItems", "maxItems", "pattern"}
)  # fmt: skip
# Keywords with no meaning for the model: the field's name says what pydantic's title says.
_NO_MEANING = frozenset({"title"})


def _phrase(keyword: str, value: Any) -> str | None:
    """The English a description carries for a keyword the Gemini Schema cannot; None: not one of those."""
    if keyword == "exclusiveMinimum":
        return f"Must be greater than {value:g}."
    if keyword == "exclusiveMaximum":
        return f"Must be less than {value:g}."
    if keyword == "multipleOf":
        return f"Must be a multiple of {value:g}."
    if keyword == "const":
        return f"Must be {json.dumps(value)}."
    return None


def _with_sentences(description: str | None, sentences: Iterable[str]) -> str:
    parts = [description.strip()] if description else []
    parts += sentences
    return " ".join(part if part.endswith((".", ")")) else part + "." for part in parts)


class _Converter:
    """Rewrites one tool's JSON schema into the subset that survives ADK's Gemini conversion."""

    def __init__(self, tool: str, root: Mapping[str, Any]) -> None:
        self.tool = tool
        self.defs: Mapping[str, Any] = root.get("$defs", {})
        self.json_text_fields: list[str] = []

    def _deref(self, schema: Mapping[str, Any]) -> dict[str, Any]:
        schema = dict(schema)
        while "$ref" in schema:
            name = str(schema.pop("$ref")).rsplit("/", 1)[-1]
            schema = {**self.defs[name], **schema}  # the field's own keys (its description) win
        return schema

    def field(self, name: str, schema: Mapping[str, Any], nested: bool = False) -> dict[str, Any]:
        """One property: typed, flattened, every constraint kept or written into its description."""
        flat, sentences = self._flatten(name, schema, nested)
        out: dict[str, Any] = {}
        for keyword, value in flat.items():
            if keyword in _NO_MEANING:
                continue
            if keyword == "items":
                out["items"] = self.field(f"{name}[]", value, nested=True)
            elif keyword == "properties":
                out.update(self.object(flat, where=name))
            elif keyword in ("required", "additionalProperties") and flat.get("type") == "object":
                continue  # handled by object()
            elif keyword in _CARRIED:
                out[keyword] = value
            elif (phrase := _phrase(keyword, value)) is not None:
                sentences.append(phrase)
            else:  # never silently: a new constraint in a tool's model must be given a Gemini form here
                raise ValueError(f"{self.tool}.{name}: JSON-schema keyword {keyword!r} has no Gemini form")
        if sentences:
            out["description"] = _with_sentences(out.get("description"), sentences)
        return out

    def _flatten(
        self, name: str, schema: Mapping[str, Any], nested: bool
    ) -> tuple[dict[str, Any], list[str]]:
        """``$ref`` inlined, ``Optional[X]`` made X-or-null, any-JSON made JSON text; sentences to add."""
        flat = self._deref(schema)
        sentences: list[str] = []
        if "anyOf" in flat:
            branches = [self._deref(b) for b in flat.pop("anyOf")]
            typed = [b for b in branches if b.get("type") != "null"]
            if len(typed) != 1 or len(branches) != 2:
                raise ValueError(f"{self.tool}.{name}: a union of several types has no Gemini Schema form")
            # Optional[X]: X's own keywords, the field's description and default, and null allowed.
            inner = typed[0]
            flat = {**inner, **flat, "type": [inner["type"], "null"]}
        if "type" not in flat:
            if nested:
                raise ValueError(f"{self.tool}.{name}: a nested value of any JSON type has no Gemini form")
            # Any JSON value: Gemini rejects a property without a type, so it travels as JSON text.
            self.json_text_fields.append(name)
            flat["type"] = "string"
            sentences.append(
                'Give it as JSON text: e.g. {"n": 3}, [1, 2], "text" (quoted), 42, true or null.'
            )
        if flat.get("default", 0) is None:
            del flat["default"]  # not required: leaving the argument out already means null
        return flat, sentences

    def object(self, schema: Mapping[str, Any], where: str) -> dict[str, Any]:
        """The properties and required list of an object schema (``additionalProperties`` said elsewhere)."""
        extra = schema.get("additionalProperties", True)
        if extra not in (True, False):
            raise ValueError(f"{self.tool}.{where}: typed additionalProperties have no Gemini Schema form")
        if extra is False and where != "":
            raise ValueError(f"{self.tool}.{where}: a closed nested object has no Gemini Schema form")
        properties = {
            key: self.field(key, value, nested=where != "")
            for key, value in schema.get("properties", {}).items()
        }
        return {"type": "object", "properties": properties, "required": list(schema.get("required", []))}


def gemini_parameters(tool: AgentTool) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The tool's argument schema rewritten for ADK's Gemini conversion, and its JSON-text fields.

    Kept: types, descriptions, required, enum, default, minimum/maximum, lengths, pattern. Rewritten:
    ``$ref`` inlined; ``Optional[X]`` (``anyOf`` with null) flattened to X, nullable, with its description
    (ADK's conversion drops an ``anyOf`` field's description); a value of any JSON type becomes a string of
    JSON text (decoded by :class:`AdkTool` before the call). Said in the field's description:
    ``exclusiveMinimum`` / ``exclusiveMaximum`` / ``multipleOf`` / ``const``. Dropped: pydantic's titles
    (no meaning) and ``default: null`` (an omitted argument is null). ``additionalProperties: false`` is
    said in the tool's description (:data:`ONLY_LISTED_ARGUMENTS`). Any other keyword raises
    ``ValueError``, so a constraint added to a tool's model can never be lost silently.
    """
    converter = _Converter(tool.name, tool.parameters)
    schema = converter.object(tool.parameters, where="")
    return schema, tuple(converter.json_text_fields)


class AdkTool(BaseTool):
    """One :class:`~adk_sandbox.executor.tool_protocol.AgentTool` as a google-adk ``BaseTool``.

    The declaration is :func:`gemini_parameters` through ADK's own Gemini conversion, with
    :data:`ONLY_LISTED_ARGUMENTS` appended to the description. ``run_async`` never raises (cancellation
    aside): failures are ``{"status": "error", "message": ...}`` results the model reads and acts on.
    """

    def __init__(self, tool: AgentTool) -> None:
        super().__init__(name=tool.name, description=f"{tool.description} {ONLY_LISTED_ARGUMENTS}")
        self.tool = tool
        """The wrapped tool."""
        self.json_schema, self._json_text_fields = gemini_parameters(tool)
        # Built once: the schema is fixed for the tool's life, and ADK asks for it before every model call.
        self._parameters = _to_gemini_schema(self.json_schema)

    def __repr__(self) -> str:
        return f"AdkTool({self.tool.name!r})"

    def _get_declaration(self) -> types.FunctionDeclaration:
        # A fresh declaration each time: ADK's toolset prefixing renames the one it is handed.
        return types.FunctionDeclaration(
            name=self.name, description=self.description, parameters=self._parameters.model_copy(deep=True)
        )

    async def run_async(self, *, args: dict[str, Any], tool_context: ToolContext) -> dict[str, Any]:
        """Run the tool with the model's arguments; the result dict, or an error result the model reads."""
        arguments = dict(args)
        for name in self._json_text_fields:
            text = arguments.get(name)
            if not isinstance(text, str):
                continue  # absent, or a model that sent the JSON value itself: the tool validates it
            try:
                arguments[name] = json.loads(text)
            except (ValueError, RecursionError) as exc:
                return error_payload(
                    f"argument '{name}' of {self.tool.name} must be JSON text (a string such as "
                    f"'{{\"n\": 3}}' or '[1, 2]'; a string value needs its own quotes: '\"text\"'): {exc}"
                )
        return (await call_tool(self.tool, arguments)).payload


class SandboxToolset(BaseToolset):
    """The workspace's tools (and ``extra_tools``) for a google-adk agent: ``Agent(tools=[toolset])``.

    The tools are ``DevToolset(workspace).tools`` in its order, then ``extra_tools`` (e.g. a
    :class:`~adk_sandbox.executor.tools.CodeTool` or :class:`~adk_sandbox.executor.tools.SandboxTool`). A
    workspace that is not writable exposes read_file, glob and grep only: bash is left out even where the
    workspace allows it, because a command could change the files the read-only toolset promises to leave
    alone.

    ``close()`` (ADK's runner calls it when it closes) closes the workspace and every extra tool that has a
    ``close`` method -- the sessions and containers they opened -- unless ``owns_resources`` is false.
    ``tool_filter`` and ``tool_name_prefix`` are ADK's own toolset options.
    """

    def __init__(
        self,
        workspace: Workspace,
        extra_tools: Sequence[AgentTool] = (),
        *,
        owns_resources: bool = True,
        tool_filter: ToolPredicate | list[str] | None = None,
        tool_name_prefix: str | None = None,
    ) -> None:
        super().__init__(tool_filter=tool_filter, tool_name_prefix=tool_name_prefix)
        self.workspace = workspace
        tools = [t for t in DevToolset(workspace).tools if workspace.writable or t.name != "bash"]
        self._extra = tuple(extra_tools)
        self._tools = [AdkTool(tool) for tool in (*tools, *self._extra)]
        names = [tool.name for tool in self._tools]
        if len(set(names)) != len(names):
            raise ValueError(f"two tools share a name: {names}")
        self._owns = owns_resources

    async def get_tools(self, readonly_context: ReadonlyContext | None = None) -> list[BaseTool]:
        """The tools, as ``tool_filter`` selects them."""
        return [tool for tool in self._tools if self._is_tool_selected(tool, readonly_context)]

    async def close(self) -> None:
        """Close the workspace and the extra tools (their sessions and containers); idempotent."""
        if self._owns:
            # Removing a container blocks: off the event loop, which may be serving other sessions.
            await asyncio.to_thread(self.close_sync)

    def close_sync(self) -> None:
        """:meth:`close` for synchronous code (also when ``owns_resources`` is false: an explicit ask)."""
        for tool in self._extra:
            close = getattr(tool, "close", None)
            if callable(close):
                close()
        self.workspace.close()


class SandboxCodeExecutor(BaseCodeExecutor):
    """A google-adk code executor that runs the model's Python code blocks in a sandbox backend.

    ``Agent(code_executor=SandboxCodeExecutor(DockerBackend()))``. Each code block runs as
    ``python`` in ``backend``; given a :class:`~adk_sandbox.executor.SessionFactory` (``DockerBackend``) every
    block runs in **one** session opened on the first (one container; files a block writes are there for the
    next, Python variables are not: ``stateful`` is false), removed by :meth:`close` -- the session
    handling of :class:`~adk_sandbox.executor.tools.SandboxTool`, which runs the code. A failure to run is
    reported in ``stderr`` of the result, never raised, so it reaches the model instead of ending the run.

    ``backend`` may also be a backend config (``{"type": "microvm"}``, any :data:`BackendConfig`): the
    backend is made from it (:func:`~adk_sandbox.make_backend`) and closed with the executor.

    ``timeout_seconds`` (default 30) bounds each block, clamped to 1..300 like ``sandbox_exec``.
    ``input_files`` of a code execution input are not copied into the sandbox: a result says so.
    """

    stateful: bool = Field(default=False, frozen=True, exclude=True)
    optimize_data_file: bool = Field(default=False, frozen=True, exclude=True)
    timeout_seconds: int | None = Field(default=int(DEFAULT_TIMEOUT_SECS), gt=0)

    _tool: SandboxTool = PrivateAttr()
    _made: SandboxBackend | None = PrivateAttr(default=None)

    def __init__(
        self, backend: SandboxBackend | SessionFactory | BackendConfig | Mapping[str, Any], **data: Any
    ) -> None:
        super().__init__(**data)
        if not isinstance(backend, SandboxBackend | SessionFactory):
            backend = self._made = make_backend(backend)
        self._tool = SandboxTool(backend)

    def execute_code(
        self, invocation_context: InvocationContext, code_execution_input: CodeExecutionInput
    ) -> CodeExecutionResult:
        """Run the code block; its stdout, stderr and exit code (ADK calls this in a worker thread)."""
        if code_execution_input.input_files:
            names = ", ".join(f.name for f in code_execution_input.input_files)
            return CodeExecutionResult(
                stderr=f"input files ({names}) are not available in this sandbox; the code was not run"
            )
        timeout = float(self.timeout_seconds or DEFAULT_TIMEOUT_SECS)
        result = self._tool.run_sync(
            {"language": "python", "code": code_execution_input.code, "timeout_secs": timeout}
        )
        if result["status"] == "error":
            return CodeExecutionResult(stderr=str(result["message"]))
        stderr = str(result["stderr"])
        notes = {
            "timeout": f"the code was killed after the {timeout:g} s timeout",
            "memory_exceeded": "the code was killed: it exceeded the sandbox's memory limit",
        }
        if (note := notes.get(result["status"])) is not None:
            stderr = f"{stderr}\n[{note}]" if stderr else f"[{note}]"
        if result["truncated"]:
            stderr += "\n[output truncated]"
        return CodeExecutionResult(stdout=str(result["stdout"]), stderr=stderr, exit_code=result["exit_code"])

    def close(self) -> None:
        """Close the session opened for the code blocks (its container is removed). Idempotent."""
        self._tool.close()
        if self._made is not None:
            self._made.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
