"""Strategies for fuzzing tool arguments, and the checks of what a call may end in.

Shared by tests/unit/test_tool_argument_fuzz.py (host) and
tests/integration/test_tool_argument_fuzz_docker.py (Docker).
Arguments are JSON-like: what ``json.loads`` can hand a tool (NaN and Infinity included, and lone
surrogates from ``"\\ud800"`` escapes), plus the text of such JSON.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st
from pydantic import BaseModel

from adk_sandbox.devtools import DevToolset, errors
from adk_sandbox.devtools.tools.bash import BashArgs
from adk_sandbox.devtools.tools.edit_file import EditFileArgs
from adk_sandbox.devtools.tools.glob import GlobArgs
from adk_sandbox.devtools.tools.grep import GrepArgs
from adk_sandbox.devtools.tools.read_file import ReadFileArgs
from adk_sandbox.devtools.tools.write_file import WriteFileArgs
from adk_sandbox.executor import errors as executor_errors
from adk_sandbox.executor.tools import SandboxExecArgs
from adk_sandbox.executor.types import Language

HUGE = "a" * 10_000_000
"""Ten megabytes of text: used in explicit examples (generating it would only slow hypothesis down)."""

MAX_MESSAGE_CHARS = 20_000
"""An error message longer than this echoes an argument back instead of explaining it."""

STATUSES = {"success", "runtime_error", "timeout", "memory_exceeded", "error"}

DOCUMENTED_TOOL_ERRORS = tuple(getattr(errors, name) for name in errors.__all__)
DOCUMENTED_EXECUTOR_ERRORS = tuple(getattr(executor_errors, name) for name in executor_errors.__all__)

_ODD_CHARS = st.sampled_from(
    ["\x00", "\ud800", "\udbff", "\udc00", "\udfff", "\x1b", "\r", "\n", "\t", "\x7f", "\x85", "\u2028",
     "\ufeff", "\ufffd", "\U0010ffff", "'", '"', "\\", "$", "`", "*", "?", "{", "}", "[", "]", "(", ")",
     "|", "/", ".", "~", " ", ","]
)  # fmt: skip
TEXT = st.text(st.one_of(st.characters(exclude_categories=[]), _ODD_CHARS), max_size=40)
"""Any characters, NUL and lone surrogates included, with shell, glob and regex syntax over-represented."""

_NUMBERS = st.one_of(
    st.integers(),
    st.sampled_from([0, -1, 2**31, 2**63, -(2**63), 10**400, -(10**400)]),
    st.floats(),  # NaN and both infinities included
)
SCALARS = st.one_of(st.none(), st.booleans(), _NUMBERS, TEXT)
VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(TEXT, children, max_size=3),
    max_leaves=8,
)
"""Any JSON-like value: wrong types, nested lists and objects."""

_PATHS = st.one_of(
    st.sampled_from(
        ["a.txt", "sub", "sub/b.py", "late-nul.txt", ".", "/", "..", "../x", "new/dir/f.txt", "~"]
    ),
    TEXT,
)
_GLOBS = st.one_of(st.sampled_from(["*", "**/*.py", "sub/*", "{a,b}*", "[", "*.{txt,py}", "\\"]), TEXT)
_REGEXES = st.one_of(st.sampled_from(["a", "^b", "(a|b)+", "(", "\\", "a{2,}", "\\x00", "."]), TEXT)
_OPTIONAL_NUMBER = st.one_of(st.none(), _NUMBERS)

WELL_TYPED: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "read_file": st.fixed_dictionaries({"path": _PATHS}, optional={"offset": _NUMBERS, "limit": _NUMBERS}),
    "write_file": st.fixed_dictionaries({"path": _PATHS, "content": TEXT}),
    "edit_file": st.fixed_dictionaries(
        {"path": _PATHS, "old_string": st.one_of(st.just("alpha"), TEXT), "new_string": TEXT},
        optional={"replace_all": st.booleans()},
    ),
    "glob": st.fixed_dictionaries({"pattern": _GLOBS}, optional={"path": st.none() | _PATHS}),
    "grep": st.fixed_dictionaries(
        {"pattern": _REGEXES},
        optional={"path": st.none() | _PATHS, "glob": st.none() | _GLOBS, "case_insensitive": st.booleans()},
    ),
    "bash": st.fixed_dictionaries({"command": TEXT}, optional={"timeout_secs": _OPTIONAL_NUMBER}),
}
"""Every known field present with the right type, holding hostile text or an odd number."""

_MODELS: dict[str, type[BaseModel]] = {
    "read_file": ReadFileArgs,
    "write_file": WriteFileArgs,
    "edit_file": EditFileArgs,
    "glob": GlobArgs,
    "grep": GrepArgs,
    "bash": BashArgs,
    "sandbox_exec": SandboxExecArgs,
}


def any_arguments(tool: str, well_typed: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[Any]:
    """Arguments of every shape for ``tool``: well typed, mistyped, unknown keys, not an object, JSON text."""
    keys = st.one_of(st.sampled_from([*_MODELS[tool].model_fields, "extra", ""]), TEXT)
    loose = st.dictionaries(keys, VALUES, max_size=4)
    return st.one_of(
        well_typed,
        well_typed.map(json.dumps),  # as an adapter receives it: JSON text, surrogates escaped
        loose,
        st.builds(lambda typed, extra: {**typed, **extra}, well_typed, loose),  # known plus unknown keys
        VALUES,  # not an object at all
        VALUES.map(json.dumps),
        TEXT,  # not JSON at all
    )


_FILE_TOOLS = ["read_file", "write_file", "edit_file", "glob", "grep"]
WORKSPACE_CALLS = st.sampled_from(_FILE_TOOLS).flatmap(
    lambda tool: st.tuples(st.just(tool), any_arguments(tool, WELL_TYPED[tool]))
)
"""``(tool, arguments)`` for the five file tools."""

BASH_CALLS = any_arguments("bash", WELL_TYPED["bash"])

_LANGUAGES = st.one_of(st.sampled_from([language.value for language in Language]), TEXT)
SANDBOX_CALLS = any_arguments(
    "sandbox_exec",
    st.one_of(
        # Hostile code and stdin run with the shortest timeout; odd timeouts run a harmless command.
        st.fixed_dictionaries(
            {"language": _LANGUAGES, "code": TEXT, "timeout_secs": st.just(1)},
            optional={"stdin": st.none() | TEXT},
        ),
        st.fixed_dictionaries(
            {"language": st.just("command"), "code": st.just("true"), "timeout_secs": _NUMBERS}
        ),
    ),
)


async def seed_workspace(tools: DevToolset) -> None:
    """Files the fuzz can hit: text, a subdirectory, a NUL past the binary sniff; a.txt read for edit_file."""
    await tools.run("write_file", {"path": "a.txt", "content": "alpha\nbeta\n"})
    await tools.run("write_file", {"path": "sub/b.py", "content": "print('b')\n"})
    await tools.run("write_file", {"path": "late-nul.txt", "content": "x" * 9000 + "\x00tail\n"})
    await tools.run("read_file", {"path": "a.txt"})


def assert_workspace_outcome(tool: str, outcome: dict[str, Any] | BaseException) -> None:
    """A JSON-ready result, or a documented error (bash: also its backend's ``ExecutorError``)."""
    if isinstance(outcome, BaseException):
        documented = DOCUMENTED_TOOL_ERRORS + (DOCUMENTED_EXECUTOR_ERRORS if tool == "bash" else ())
        if not isinstance(outcome, documented):
            raise AssertionError(
                f"{tool} raised {type(outcome).__name__}, not a documented error"
            ) from outcome
        message = str(outcome)
        assert message, f"{tool}: {type(outcome).__name__} without a message"
        assert len(message) < MAX_MESSAGE_CHARS, f"{tool}: a {len(message)}-character message"
        if isinstance(outcome, errors.InvalidArgumentsError) and outcome.__cause__ is not None:
            # The last line of defence caught it: the argument model lets the value through.
            raise AssertionError(f"{tool}: refused below its argument model: {message}") from outcome
        return
    assert isinstance(outcome, dict)
    json.dumps(outcome)


def assert_sandbox_outcome(result: Any) -> None:
    """A status dict; an error's message is words for the model, not a dependency's exception."""
    assert isinstance(result, dict), result
    assert result["status"] in STATUSES, result
    json.dumps(result)
    if result["status"] == "error":
        message = result["message"]
        assert isinstance(message, str) and message
        assert len(message) < MAX_MESSAGE_CHARS, f"a {len(message)}-character message"
        for noise in ("errors.pydantic.dev", "UnicodeEncodeError", "ValidationError", "Traceback"):
            assert noise not in message, message
