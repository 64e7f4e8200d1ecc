"""The one shape every agent-facing tool has, and the one way adapters call a tool.

:class:`AgentTool` (name, description, ``args_model``, ``async run``), :func:`parse_arguments` and
:func:`text_rules` for arguments, :func:`call_tool` / :class:`ToolOutcome` for adapters, and the
errors :class:`ToolError`, :class:`InvalidArgumentsError`, :class:`UnknownToolError`.
See docs/DEVTOOLS.md, sections "One tool protocol" and "Errors".
"""

from __future__ import annotations

import json
import logging
import re
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, BeforeValidator, ValidationError
from pydantic_core import PydanticCustomError

from adk_sandbox.executor.errors import ExecutorError
from adk_sandbox.executor.types import Stream

__all__ = [
    "MAX_ARGUMENT_DEPTH",
    "AgentTool",
    "InvalidArgumentsError",
    "ProgressCallback",
    "ToolError",
    "ToolOutcome",
    "UnknownToolError",
    "call_tool",
    "error_payload",
    "find_tool",
    "parse_arguments",
    "text_rules",
]

_log = logging.getLogger(__name__)

ProgressCallback = Callable[[Stream, str], "Awaitable[None] | None"]
"""``on_progress(stream, chunk)``: output while a command runs, on the event loop.

A plain function is called; a coroutine function is awaited. Calls are made one at a time, in order.
Tools that produce no progress ignore it.
"""

MAX_ARGUMENT_DEPTH = 200
"""Deepest nesting of arrays and objects accepted in the JSON text of a call's arguments.

Checked on the text before it is parsed: Python's parser (and everything that walks the result) recurses
once per level, so a few thousand ``[`` would otherwise end in ``RecursionError``.
"""

_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[{]|[\]}]', re.DOTALL)

# Every surrogate code point in a Python str is a lone one: json.loads joins an escaped pair into one
# character, so what is left cannot be encoded as UTF-8 (file names, file content, argv, stdin).
_SURROGATE = re.compile("[\ud800-\udfff]")


class ToolError(Exception):
    """Base of every error a tool raises; ``str(error)`` is the message for the model."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidArgumentsError(ToolError, ValueError):
    """The tool's arguments failed validation; the message names the field and the reason."""


class UnknownToolError(ToolError, LookupError):
    """No tool of that name exists."""


def _json_text_too_deep(text: str, limit: int) -> bool:
    """Whether arrays/objects in JSON ``text`` nest deeper than ``limit`` (strings skipped; not recursive)."""
    depth = 0
    for token in _JSON_TOKENS.finditer(text):
        char = token.group()[0]
        if char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth -= 1
    return False


def text_rules(
    *,
    nul: str | None = None,
    max_chars: int | None = None,
    kind: str = "it",
    limit: str | None = None,
    pass_surrogates: bool = False,
) -> BeforeValidator:
    r"""A pydantic validator for a text argument, used as ``Annotated[str, <it>]``; worded for the model.

    Refuses a lone surrogate (``"\ud800"`` is valid JSON but not Unicode text: nothing can encode it as
    UTF-8), unless ``pass_surrogates`` leaves that to a later check of the caller's own. ``nul`` names what
    cannot hold a NUL byte (``"a shell command"``); without it NUL bytes pass (file content may hold them).
    ``max_chars`` bounds the length, ``kind`` naming the value in that message (``"a glob pattern"``) and
    ``limit`` the limit it states (default: ``max_chars`` characters).
    :func:`parse_arguments` puts the argument's name before each message.

    It runs before pydantic's own ``str`` checks: with a constraint such as ``min_length`` pydantic-core
    answers a lone surrogate with "unable to parse raw data as a unicode string", which tells the model
    nothing. Values that are not ``str`` pass on to pydantic's type check.
    """
    stated_limit = limit or f"{max_chars} characters"

    def check(value: object) -> object:
        if not isinstance(value, str):
            return value
        if max_chars is not None and len(value) > max_chars:
            raise PydanticCustomError(
                "text_too_long",
                "is {length} characters long; {kind} may be at most {limit}",
                {"length": len(value), "kind": kind, "limit": stated_limit},
            )
        if nul is not None and (at := value.find("\0")) != -1:
            raise PydanticCustomError(
                "text_nul_byte",
                "contains a NUL byte (\\x00) at position {at}, which {holder} cannot hold; remove it",
                {"at": at, "holder": nul},
            )
        if not pass_surrogates and (surrogate := _SURROGATE.search(value)) is not None:
            raise PydanticCustomError(
                "text_lone_surrogate",
                "contains a lone surrogate (U+{code} at position {at}), which is not valid Unicode text "
                "and cannot be encoded as UTF-8; send the character itself, or remove it",
                {"code": f"{ord(surrogate.group()):04X}", "at": surrogate.start()},
            )
        return value

    return BeforeValidator(check)


def parse_arguments(tool: str, model: type[BaseModel], arguments: object) -> BaseModel:
    """Validate ``arguments`` (a mapping or its JSON text) with ``model``; raise one clear message if not.

    The message names each field and why (``missing required argument 'path'``, ``unknown argument 'x'``,
    ``argument 'limit': ...``) and lists the accepted arguments, for the model to correct its call.
    """
    if isinstance(arguments, str):
        if _json_text_too_deep(arguments, MAX_ARGUMENT_DEPTH):
            raise InvalidArgumentsError(
                f"arguments for {tool} are nested more than {MAX_ARGUMENT_DEPTH} levels deep (arrays and "
                "objects); pass flatter JSON"
            )
        try:
            arguments = json.loads(arguments)
        except RecursionError:
            raise InvalidArgumentsError(
                f"arguments for {tool} are nested too deeply to be read; pass flatter JSON"
            ) from None
        except ValueError as exc:
            raise InvalidArgumentsError(f"arguments for {tool} are not valid JSON: {exc}") from None
    if not isinstance(arguments, Mapping):
        raise InvalidArgumentsError(
            f"arguments for {tool} must be a JSON object, got {type(arguments).__name__}"
        )
    try:
        return model.model_validate(dict(arguments))
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False):
            where = ".".join(str(part) for part in error["loc"]) or "(arguments)"
            if error["type"] == "missing":
                problems.append(f"missing required argument '{where}'")
            elif error["type"] == "extra_forbidden":
                problems.append(f"unknown argument '{where}'")
            else:
                problems.append(f"argument '{where}': {error['msg']}")
        accepted = ", ".join(model.model_fields)
        raise InvalidArgumentsError(
            f"invalid arguments for {tool}: {'; '.join(problems)} (accepted arguments: {accepted})"
        ) from None
    except RecursionError:
        raise InvalidArgumentsError(
            f"arguments for {tool} are nested too deeply to be read; pass flatter JSON"
        ) from None


class AgentTool(ABC):
    """One tool as an agent framework sees it: name, description, argument schema, and ``run``.

    Subclasses set ``name``, ``description`` and ``args_model`` (as class or instance attributes) and
    implement :meth:`_run` on parsed arguments.
    """

    name: str
    description: str
    args_model: type[BaseModel]
    errors_are_results: ClassVar[bool] = False
    """True: every failure is returned as ``{"status": "error", "message"}``; False: raised as ToolError."""

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments (from the pydantic model; unknown arguments are refused)."""
        return self.args_model.model_json_schema()

    def parse(self, arguments: object) -> BaseModel:
        """The validated arguments (a mapping or JSON text); raises :class:`InvalidArgumentsError`."""
        return parse_arguments(self.name, self.args_model, arguments)

    async def run(
        self, arguments: Mapping[str, Any] | str, on_progress: ProgressCallback | None = None
    ) -> dict[str, Any]:
        """Validate ``arguments`` and run the tool; a JSON-ready dict (errors: see ``errors_are_results``).

        A ``ValueError`` from below the tool (a dependency refusing a value the argument model let through:
        pydantic's ``ValidationError``, ``UnicodeEncodeError``, "embedded null byte") becomes an
        :class:`InvalidArgumentsError` chained to it, and is logged with its traceback: the model reads an
        argument error instead of a dependency's exception, and the gap in the argument model stays
        visible. Project errors (``ToolError``, ``ExecutorError``) pass unchanged, and any other exception
        propagates as before: it is a bug, not a bad argument.
        """
        try:
            parsed = self.parse(arguments)
            return await self._run_guarded(parsed, on_progress)
        except InvalidArgumentsError as exc:
            if self.errors_are_results:
                return error_payload(str(exc))
            raise

    async def _run_guarded(self, parsed: BaseModel, on_progress: ProgressCallback | None) -> dict[str, Any]:
        try:
            return await self._run(parsed, on_progress)
        except (ToolError, ExecutorError):
            raise  # documented errors (InvalidRequestError is a ValueError too, and keeps its type)
        except ValueError as exc:  # UnicodeError and pydantic's ValidationError are ValueErrors
            _log.warning(
                "tool %s: a value its arguments let through was refused below it", self.name, exc_info=True
            )
            raise InvalidArgumentsError(_refusal_message(self.name, exc)) from exc

    @abstractmethod
    async def _run(self, arguments: Any, on_progress: ProgressCallback | None) -> dict[str, Any]:
        """Run on validated arguments (an instance of ``args_model``)."""


def _refusal_message(tool: str, exc: ValueError) -> str:
    """The message of an argument refused below the tool: the reason without the dependency's noise."""
    if isinstance(exc, ValidationError):
        reasons = []
        for error in exc.errors(include_url=False):
            where = ".".join(str(part) for part in error["loc"])
            reason = error["msg"].removeprefix("Value error, ")
            reasons.append(f"{where}: {reason}" if where else reason)
        detail = "; ".join(reasons)
    elif isinstance(exc, UnicodeEncodeError) and _SURROGATE.match(exc.object, exc.start):
        char = exc.object[exc.start]
        detail = (
            f"text holding U+{ord(char):04X} (a lone surrogate) is not valid Unicode and cannot be encoded "
            "as UTF-8; send the character itself, or remove it"
        )
    else:
        detail = str(exc) or type(exc).__name__
    return f"the arguments of {tool} cannot be used: {detail}"


def error_payload(message: str) -> dict[str, Any]:
    """The one error result shape: ``{"status": "error", "message": message}``."""
    return {"status": "error", "message": message}


@dataclass(frozen=True)
class ToolOutcome:
    """What :func:`call_tool` returns: the tool's result, or the error the model should read."""

    ok: bool
    """False when the call failed (a raised error, or a result with ``status: "error"``)."""
    payload: dict[str, Any]
    """The result dict; on failure ``{"status": "error", "message": ...}``. Always JSON-ready."""

    @property
    def message(self) -> str:
        """The error message (empty when ``ok``)."""
        return "" if self.ok else str(self.payload.get("message", ""))


async def call_tool(
    tool: AgentTool, arguments: Mapping[str, Any] | str, on_progress: ProgressCallback | None = None
) -> ToolOutcome:
    """Run ``tool``; every failure becomes an error outcome, so an adapter's agent run never aborts.

    Project errors (:class:`ToolError`, :class:`~adk_sandbox.executor.errors.ExecutorError`) keep their
    message. Anything else is a bug or a broken dependency: it is logged with its traceback and reported by
    type and message. ``CancelledError`` propagates.
    """
    try:
        result = await tool.run(arguments, on_progress)
    except (ToolError, ExecutorError) as exc:
        return ToolOutcome(False, error_payload(str(exc)))
    except Exception as exc:
        _log.exception("tool %s failed unexpectedly", tool.name)
        return ToolOutcome(False, error_payload(f"{type(exc).__name__}: {exc}"))
    return ToolOutcome(result.get("status") != "error", result)


def find_tool(tools: Sequence[AgentTool], name: str) -> AgentTool:
    """The tool called ``name``; :class:`UnknownToolError` naming the available ones otherwise."""
    for tool in tools:
        if tool.name == name:
            return tool
    available = ", ".join(t.name for t in tools)
    raise UnknownToolError(f"unknown tool '{name}'; available tools: {available}")
