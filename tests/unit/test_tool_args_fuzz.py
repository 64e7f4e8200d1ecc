"""code_exec / sandbox_exec keep errors-as-information for any argument text or value: a status JSON, never
an exception (deep nesting included), and no execution for arguments that are refused.

The backend is a recorder: what is tested is argument handling, which is pure logic.
"""

from __future__ import annotations

import json
import math
import string
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adk_sandbox.executor import CodeTool, SandboxTool
from adk_sandbox.executor.testing import FakeBackend
from adk_sandbox.executor.tools import MAX_ARGUMENT_DEPTH, MAX_INPUT_DEPTH, CodeExecArgs

STATUSES = {"success", "compile_error", "runtime_error", "timeout", "memory_exceeded", "rejected", "error"}
DEEP = 1990  # far past Python's recursion limit of 1000
RUN = "fn run(input: Value) -> Value { input }"


def _tools() -> list[tuple[str, SandboxTool | CodeTool, FakeBackend]]:
    sandbox_backend, code_backend = FakeBackend(), FakeBackend()
    return [
        ("sandbox_exec", SandboxTool(sandbox_backend), sandbox_backend),
        ("code_exec", CodeTool(code_backend), code_backend),
    ]


def _assert_status(result: Any) -> None:
    assert isinstance(result, dict)
    assert result["status"] in STATUSES, result
    json.dumps(result)  # JSON-ready
    if result["status"] == "error":
        assert isinstance(result["message"], str) and result["message"]


def _nested_list(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def _nested_dict(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = {"k": value}
    return value


DEEP_TEXTS = {
    "bare array": "[" * DEEP + "]" * DEEP,
    "as input": '{"code": "fn run", "input": ' + "[" * DEEP + "]" * DEEP + "}",
    "nested objects": '{"a": ' * DEEP + "1" + "}" * DEEP,
    "as language": '{"language": ' + "[" * DEEP + "]" * DEEP + ', "code": "true"}',
    "unclosed": "[" * DEEP,
}


@pytest.mark.parametrize("text", DEEP_TEXTS.values(), ids=DEEP_TEXTS.keys())
def test_deeply_nested_argument_text_is_an_error_result(text: str) -> None:
    for _, tool, backend in _tools():
        result = tool.run_sync(text)
        assert result["status"] == "error"
        assert "nested" in result["message"] and str(MAX_ARGUMENT_DEPTH) in result["message"]
        assert backend.requests == []


def test_nesting_up_to_the_bound_is_parsed() -> None:
    inner = MAX_ARGUMENT_DEPTH - 1  # the arguments object is one level
    text = json.dumps({"language": "command", "code": "true", "stdin": None, "x": _nested_list(inner - 1)})
    result = SandboxTool(FakeBackend()).run_sync(text)
    # Parsed all the way: the refusal is about the field, not the depth.
    assert "nested" not in result["message"]
    assert "unknown argument 'x'" in result["message"]


@pytest.mark.parametrize("make", [_nested_list, _nested_dict], ids=["lists", "dicts"])
def test_deep_input_values_are_refused_with_serde_jsons_limit(make: Any) -> None:
    backend = FakeBackend()
    tool = CodeTool(backend)
    result = tool.run_sync({"code": RUN, "input": make(DEEP)})
    assert result["status"] == "error"
    assert f"more than {MAX_INPUT_DEPTH} levels" in result["message"]
    result = tool.run_sync({"code": RUN, "input": make(MAX_INPUT_DEPTH + 1)})
    assert f"more than {MAX_INPUT_DEPTH} levels" in result["message"]
    assert backend.requests == []


def test_input_at_serde_jsons_limit_is_accepted() -> None:
    assert (
        CodeExecArgs.model_validate({"code": RUN, "input": _nested_list(MAX_INPUT_DEPTH)}).input is not None
    )


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        (math.nan, "JSON cannot represent"),
        ([1, math.inf], "JSON cannot represent"),
        ({1: "x"}, "not a string"),
        ({"s": {1, 2}}, "set"),
        (b"bytes", "bytes"),
    ],
)
def test_input_that_is_not_json_data_is_refused(value: Any, needle: str) -> None:
    result = CodeTool(FakeBackend()).run_sync({"code": RUN, "input": value})
    assert result["status"] == "error"
    assert needle in result["message"]


def test_a_cyclic_input_is_refused_not_recursed() -> None:
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    result = CodeTool(FakeBackend()).run_sync({"code": RUN, "input": cyclic})
    assert f"more than {MAX_INPUT_DEPTH} levels" in result["message"]


# -- fuzzing ------------------------------------------------------------------------------------------

JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=30,
)
FIELDS = st.sampled_from(["language", "code", "stdin", "timeout_secs", "input", "extra", ""])
ARGUMENT_DICTS = st.dictionaries(
    FIELDS, JSON_VALUES | st.sampled_from(["command", "python", RUN]), max_size=5
)
NESTING = st.builds(
    lambda opener, depth, leaf: opener * depth + leaf + {"[": "]", "{": "}"}.get(opener[-1], "") * depth,
    st.sampled_from(["[", '{"a": ', '[{"a": ']),
    st.integers(min_value=0, max_value=3000),
    st.sampled_from(["1", '"x"', "", "]", "}"]),
)
JSON_LIKE_TEXT = st.text(alphabet=string.printable + '[]{}":,\\', max_size=200)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        ARGUMENT_DICTS,
        ARGUMENT_DICTS.map(json.dumps),
        NESTING,
        JSON_LIKE_TEXT,
        st.text(max_size=50),
        JSON_VALUES.map(json.dumps),
    )
)
def test_any_arguments_give_a_status_never_an_exception(arguments: Any) -> None:
    for _, tool, _backend in _tools():
        _assert_status(tool.run_sync(arguments))


@settings(max_examples=100, deadline=None)
@given(JSON_VALUES, st.integers(min_value=0, max_value=2500))
def test_any_input_value_nested_anyhow_gives_a_status(leaf: Any, depth: int) -> None:
    value, text = leaf, json.dumps(leaf)
    for level in range(depth):  # built without recursion: json.dumps itself could not nest this deep
        value = [value] if level % 2 else {"k": value}
    openers = "".join("[" if level % 2 else '{"k": ' for level in reversed(range(depth)))
    closers = "".join("]" if level % 2 else "}" for level in range(depth))
    _, tool, _backend = _tools()[1]
    _assert_status(tool.run_sync({"code": RUN, "input": value}))
    _assert_status(
        tool.run_sync('{"code": ' + json.dumps(RUN) + ', "input": ' + openers + text + closers + "}")
    )
