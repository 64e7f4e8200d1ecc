"""adk-sandbox devtools: the workspace and the six agent tools (read_file, write_file, edit_file, glob,
grep, bash) on top of :mod:`executor`. The tools arrive in a later issue; this package is the home they
import into.
"""

__all__: list[str] = []
