"""The in-sandbox agent: one long-lived process per session that runs every command (protocol version 1).

The agent itself is ``inside/agent.c``, started by :mod:`.static_agent`; frames are :mod:`.frames`. This
module holds what the host and the agent agree on besides the frames: :data:`AGENT_ARGV0`,
:data:`SETID_ALLOWED_WORD`, :data:`KEEPER_WORD` and :func:`agent_arguments`.
See docs/docker/agent-channel.md, section "The agent channel", for what the agent does.
"""

from __future__ import annotations

__all__ = ["AGENT_ARGV0", "KEEPER_WORD", "SETID_ALLOWED_WORD", "agent_arguments"]

#: The agent's name (its argv[0]): names it in ``ps`` and in ``/proc/PID/cmdline``.
AGENT_ARGV0 = "adk-sandbox-agent"

#: The opt-in word that starts an agent without the set-id filter. It comes right after the agent's
#: name, before the optional protected list: a word with a fixed spelling in a fixed place, never
#: mistaken for the list (digits, ``:`` and ``,``); the generated C header carries the same spelling.
SETID_ALLOWED_WORD = "setid-allowed"

#: The word that starts the agent as a container's keeper (its first process, ``keeper <lifetime>`` before
#: the rest): it forks the agent proper as the user the host names on stdin (``inside/agent.c``, "the
#: keeper"; docs/pause.md says why a checkpoint needs it).
KEEPER_WORD = "keeper"


def agent_arguments(protected: str | None, *, setid_allowed: bool = False) -> list[str]:
    """What follows the agent's name on its argv: ``[setid-allowed] [<protected>]``."""
    return [*([SETID_ALLOWED_WORD] if setid_allowed else []), *([protected] if protected else [])]
