"""The programs that run inside a sandbox, as files: never imported on the host, shipped as text or built.

``agent.c`` and ``loader.c`` (the agent, built by :mod:`adk_sandbox.executor.channel.static_agent`; a
wheel carries it built under ``bin/<machine>/``), ``supervisor.py`` (the exec transport's supervisor) with
``setid_filter.py`` and ``prelude.py`` spliced into it (:mod:`adk_sandbox.executor.channel.programs`). The
Python files are checked by ruff and ``mypy --strict`` like any module, but run with ``python3 -I -S``
(standard library only, Python >= 3.6).
"""
