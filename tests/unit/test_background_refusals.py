"""``ExecRequest(background=True)`` is refused where nothing could keep a command's processes."""

from __future__ import annotations

import pytest

from adk_sandbox.executor import ExecRequest, InvalidRequestError, Language, ProcessBackend
from adk_sandbox.executor.backends.wasm import _check_wasm_request


def test_the_host_process_backend_refuses_background() -> None:
    request = ExecRequest(language=Language.COMMAND, code="sleep 300 &", timeout=5, background=True)
    with pytest.raises(InvalidRequestError, match="cannot keep background processes"):
        ProcessBackend().execute(request)


def test_the_wasm_backend_refuses_background() -> None:
    request = ExecRequest(language=Language.WASM, code="(module)", timeout=5, background=True)
    with pytest.raises(InvalidRequestError, match="background"):
        _check_wasm_request(request)


def test_background_defaults_to_false() -> None:
    assert ExecRequest(language=Language.COMMAND, code="true", timeout=5).background is False
