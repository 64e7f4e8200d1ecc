"""The programs that run inside a sandbox, as files: never imported on the host, built and shipped.

``agent.c`` and ``loader.c``: the agent, built by :mod:`adk_sandbox.executor.channel.static_agent` (a
wheel carries it built under ``bin/<machine>/``); the one program every engine starts in a sandbox.
"""
