"""The in-sandbox agent: one long-lived process per session that runs every command (protocol version 1).

The agent is ``inside/agent.c``, a static binary started through **one** exec per sandbox (a stream the
engine opens: :mod:`.streams`) by the loader of :mod:`.static_agent`, as ``adk-sandbox-agent
[setid-allowed] [<protected>]`` with stdin attached. Frames (:mod:`.frames`) travel on its stdin and
stdout; its stderr carries diagnostics only. No file is installed in the image, no port, socket or mount
is needed. This module holds what the host and the agent agree on besides the frames: its name and
arguments.

What it does:

* At start: ``prctl(PR_SET_DUMPABLE, 0)``, so commands (same uid, no capabilities) cannot open
  ``/proc/<agent>/fd/*`` nor ptrace it (they can still signal it: the host copes with that); moves its
  framing pipes to private descriptors (``/dev/null`` on 0 and 1); becomes a child subreaper
  (``PR_SET_CHILD_SUBREAPER``, refused by older gVisor: the *lenient* mode below); kills processes earlier
  agents of the container left behind (another agent, or orphans re-parented to PID 1 that are not among
  the ``protected`` survey of the container's own processes); sends HELLO.
* The set-id filter is a per-channel choice made on the argv, the one thing every engine's exec carries:
  without :data:`SETID_ALLOWED_WORD` (the default) the agent installs it on itself at start; with it (a
  sandbox whose workspace only travels as a copy and never as a bind mount, where package managers
  must install set-uid programs) it installs none. HELLO says which is in force (``"setid"``:
  ``"refused"`` or ``"allowed"``; ``"unavailable"`` when the filter could not be installed, and then
  nothing runs), so the host checks it got what it asked for.
* RUN: forks a **shim** for the command (a copy of the agent, itself a child subreaper, non-dumpable), with
  the command's pipes on 0, 1, 2 and every other descriptor closed; the shim carries the set-id seccomp
  filter of :mod:`.setid` that the agent installed on itself at start (with no_new_privs: inherited by
  everything it starts, never lifted; once per agent rather than per command), enters the cwd, and
  spawns the command (``vfork`` and exec)
  into its own session (``setsid``) with exactly the RUN's environment (it travels in the frame, never on
  an argv). When the command exits and the shim has no child left, nothing of the
  command is left either (every orphan comes back to the shim). Orphans of the
  command are re-parented to its shim, so each process is attributed to its command by descent alone. The
  shim reaps everything; when the command exits it SIGSTOPs then SIGKILLs every process below itself (read
  from the ppid fields of ``/proc/*/stat``, which nothing can hide), reports the command's status to the
  agent on a private pipe and exits.
* Output: read in chunks, at most ``max_output_bytes`` per stream sent as STDOUT/STDERR frames; the rest
  is read and discarded *inside the container* and only counted in EXIT.
* Timeout (enforced here too) and KILL: stop then kill the shim and everything below it. A shim killed by
  its own command (same uid) leaves its processes re-parented to the agent: any child of the agent that is
  not a live shim is such a stray and is killed with its descendants (a neighbour's orphans go to the
  neighbour's live shim, never to the agent, so they are never strays).
* Background (RUN ``"background": true``): at the command's normal exit the shim reports its status and
  stays as the *keeper* of what is left (reaping until nothing is); the agent sends EXIT once the output
  already in the pipes is read, then reads and drops what the group writes, never counts a keeper as a
  stray, and kills every group at the end of its stdin. At most ``MAX_GROUPS`` (16) background commands,
  running or kept: one more gets ERROR ``"refused": true``. Timeout and KILL kill the tree as for any command.
* Lenient mode (no child subreapers): orphans go to PID 1. After every command the agent kills children of
  PID 1 that are not protected and cannot be attributed to a live command (its session id, or its marker
  ``ADK_SANDBOX_EXEC`` in the environment); a neighbour's orphan that cleared its environment *and* called
  ``setsid`` is killed too (the weaker mode, as documented for the supervisor).
* End of its stdin (the host went away): kills every command's tree and exits.
* FILE: forks a **worker** per operation (non-dumpable, other descriptors closed, umask 0, the set-id
  filter installed) that performs it as the agent's user and streams bytes over pipes, so the loop never
  waits on a file. A write's data reaches the worker as (u32 length, bytes) chunks ending with a 0 length:
  a pipe ending without that mark is an abandoned write. The temporary file of a write is named by the
  agent, which removes it when the worker dies or is KILLed. A write replacing an existing regular file
  first opens it ``O_WRONLY|O_NOFOLLOW`` (no truncation) as the proof the user may write it (else EACCES,
  nothing changed) and gives the replacement its mode and owner. Reads open with ``O_NONBLOCK`` and refuse
  non-regular files. Workers are not strays. See docs/DOCKER.md, "File operations".
* EXIT carries ``oom_kills``: the difference of the memory cgroup's ``oom_kill`` counter, read inside the
  container before and after the command (null when unreadable).

* LISTEN (the proxy endpoint of a network policy; HELLO ``"proxy": 1``): a non-blocking listener on
  ``127.0.0.1``; each accepted connection gets a connection channel of its own (OPEN), its bytes travel as
  DATA both ways, never parsed, within per-direction windows returned by CREDIT (a connection is read
  only while the host has room for it, and holds at most a window of the host's bytes); at most
  ``MAX_CONNS`` (256) at once, one more is closed at once. See :mod:`.frames` and :mod:`.connections`.
Signals go through a pidfd after re-checking the target's start time (a reused pid is never hit).
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
