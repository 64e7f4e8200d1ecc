"""rustc's ``--error-format=json`` output turned into structured diagnostics with user line numbers.

rustc writes one JSON object per line on stderr: diagnostics (``"$message_type": "diagnostic"``) and, with
``--json=artifacts``, a notice per artifact written (``"emit": "metadata"`` marks the end of type
checking, i.e. of the *check* stage). Anything else on stderr (a shell error, a crash) is kept as text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from adk_sandbox.executor.rust.harness import SOURCE_FILE

__all__ = [
    "HARNESS_FILE",
    "CompilerOutput",
    "Diagnostic",
    "DiagnosticChild",
    "DiagnosticSpan",
    "is_metadata_notice",
    "parse_compiler_output",
]

HARNESS_FILE = "<harness>"
"""``file_name`` of spans inside the generated harness; their lines count from the harness's first line."""

# Summaries that repeat what the diagnostics already say; kept in the rendered text only.
_SUMMARY = re.compile(r"^(aborting due to|\d+ warnings? emitted|for more information about)", re.IGNORECASE)


class DiagnosticSpan(BaseModel):
    """A region of source a diagnostic points at (1-based lines and columns, end inclusive as rustc)."""

    model_config = ConfigDict(frozen=True)

    file_name: str
    """``main.rs`` for the user's code, ``<harness>`` for the generated harness, else rustc's file name."""
    line_start: int
    line_end: int
    column_start: int
    column_end: int
    is_primary: bool = True
    """The span the diagnostic is mainly about (rustc may add secondary ones)."""
    label: str | None = None
    """rustc's short text at the span (``expected `i64`, found `&str```)."""


class DiagnosticChild(BaseModel):
    """A note or help attached to a diagnostic (``help: consider borrowing here``)."""

    model_config = ConfigDict(frozen=True)

    level: str
    message: str


class Diagnostic(BaseModel):
    """One compiler message: ``level`` (error, warning, ...), ``message``, ``code`` (E0308) and spans."""

    model_config = ConfigDict(frozen=True)

    level: str
    message: str
    code: str | None = None
    spans: list[DiagnosticSpan] = []
    children: list[DiagnosticChild] = []


@dataclass
class CompilerOutput:
    """Everything rustc said on stderr, sorted."""

    diagnostics: list[Diagnostic] = field(default_factory=list)
    """Errors and warnings, summaries left out, spans mapped to the user's lines."""
    rendered: str = ""
    """Human-readable text: rustc's own rendering of each diagnostic plus any non-JSON lines."""
    metadata_emitted: bool = False
    """Type checking finished (rustc wrote the crate metadata): the check stage is over."""
    link_emitted: bool = False
    """The executable was written: the build stage is over."""

    @property
    def errors(self) -> list[Diagnostic]:
        """The diagnostics of level ``error`` (including internal compiler errors)."""
        return [d for d in self.diagnostics if d.level.startswith("error")]


def is_metadata_notice(line: str) -> bool:
    """True if ``line`` is rustc's notice that it wrote the crate metadata (check stage finished)."""
    if '"artifact"' not in line:
        return False
    notice = _json_object(line)
    if notice is None:
        return False
    return notice.get("$message_type") == "artifact" and notice.get("emit") == "metadata"


def parse_compiler_output(stderr: str, user_lines: int) -> CompilerOutput:
    """Parse rustc's JSON stderr; spans in :data:`SOURCE_FILE` past ``user_lines`` are the harness's."""
    parsed = CompilerOutput()
    rendered: list[str] = []
    for line in stderr.splitlines():
        message = _json_object(line)
        if message is None:
            if line.strip():
                rendered.append(line + "\n")
            continue
        kind = message.get("$message_type", "diagnostic")
        if kind == "artifact":
            parsed.metadata_emitted |= message.get("emit") == "metadata"
            parsed.link_emitted |= message.get("emit") == "link"
            continue
        if kind != "diagnostic" or "message" not in message:
            continue
        text = message.get("rendered")
        if isinstance(text, str):
            rendered.append(text)
        if not _SUMMARY.match(str(message.get("message", ""))):
            parsed.diagnostics.append(_diagnostic(message, user_lines))
    parsed.rendered = "".join(rendered)
    return parsed


def _json_object(line: str) -> dict[str, Any] | None:
    if not line.startswith("{"):
        return None
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: nested too deep to be one of rustc's messages
        return None
    return value if isinstance(value, dict) else None


def _diagnostic(message: dict[str, Any], user_lines: int) -> Diagnostic:
    code = message.get("code")
    spans = [_span(span, user_lines) for span in message.get("spans") or () if isinstance(span, dict)]
    children = [
        DiagnosticChild(level=str(child.get("level", "")), message=str(child.get("message", "")))
        for child in message.get("children") or ()
        if isinstance(child, dict) and child.get("message")
    ]
    return Diagnostic(
        level=str(message.get("level", "error")),
        message=str(message.get("message", "")),
        code=str(code["code"]) if isinstance(code, dict) and code.get("code") else None,
        spans=spans,
        children=children,
    )


def _span(span: dict[str, Any], user_lines: int) -> DiagnosticSpan:
    file_name = str(span.get("file_name", ""))
    line_start = int(span.get("line_start", 0))
    line_end = int(span.get("line_end", line_start))
    if file_name == SOURCE_FILE and line_start > user_lines:
        # In the generated harness: its own numbering, so no line number outside the user's code ever
        # looks like one of the user's lines.
        file_name = HARNESS_FILE
        line_start -= user_lines
        line_end -= user_lines
    label = span.get("label")
    return DiagnosticSpan(
        file_name=file_name,
        line_start=line_start,
        line_end=line_end,
        column_start=int(span.get("column_start", 0)),
        column_end=int(span.get("column_end", 0)),
        is_primary=bool(span.get("is_primary", True)),
        label=label if isinstance(label, str) else None,
    )
