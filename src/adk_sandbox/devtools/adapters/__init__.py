"""Adapters that put the project's tools and sandboxes into agent frameworks, each a thin module.

:mod:`.mcp` (an MCP server, extra ``mcp``), :mod:`.adk` (a google-adk toolset and code executor, extra
``adk``) and :mod:`.inspect_sandbox` (an inspect_ai sandbox provider, extra ``inspect``). Tool failures
reach the model as information (:func:`~adk_sandbox.executor.tool_protocol.call_tool`); importing this
package imports no framework. Depth: docs/INTEGRATIONS.md.
"""
