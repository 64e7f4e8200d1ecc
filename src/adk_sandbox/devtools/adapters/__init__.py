"""Adapters that put the project's tools and sandboxes into agent frameworks, each a thin module.

* :mod:`adk_sandbox.devtools.adapters.mcp` — an MCP server over stdio (extra ``mcp``; ``adk-sandbox mcp``).
* :mod:`adk_sandbox.devtools.adapters.adk` — a google-adk toolset and code executor (extra ``adk``).
* :mod:`adk_sandbox.devtools.adapters.inspect_sandbox` — an inspect_ai sandbox provider,
``sandbox="adk-sandbox"``
  (extra ``inspect``; registered through inspect's plugin entry point).

Every tool adapter takes :class:`~adk_sandbox.executor.tool_protocol.AgentTool` objects and calls them through
:func:`~adk_sandbox.executor.tool_protocol.call_tool`, so a tool's failure is information for the model, never
the end of an agent's run. Importing this package imports no framework: each module imports its own.
"""
