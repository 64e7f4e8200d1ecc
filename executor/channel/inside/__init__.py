"""The programs that run inside a sandbox, as files: never imported on the host, shipped as text.

``agent.py`` (the Python agent), ``supervisor.py`` (the exec transport's supervisor), ``setid_filter.py``
and ``prelude.py`` (spliced into both), ``agent.c`` and ``loader.c`` (the static agent). The host reads
them as package data (:mod:`adk_sandbox.executor.channel.programs`,
:mod:`adk_sandbox.executor.channel.static_agent`); they are checked by ruff and ``mypy --strict`` like
any module, but run with ``python3 -I -S`` (standard library only, Python >= 3.6).
"""
