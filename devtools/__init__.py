"""adk-sandbox devtools: the workspace and the six agent tools on top of :mod:`executor`.

The tools (read_file, write_file, edit_file, glob, grep, bash) arrive in a later issue; this package is
the home they import into.
"""

__all__: list[str] = []
