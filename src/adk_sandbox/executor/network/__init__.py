"""The host side of a sandbox's network policy, engine-neutral and pure: what may be reached, and how.

A sandbox with a :class:`NetworkPolicy` keeps no route out. A proxy endpoint inside it carries each
connection over the session's channel to the host side, which decides with the modules here:

* :mod:`.policy`: :class:`NetworkPolicy` (allow and deny rules by name, pins, injected headers) and its
  :meth:`~NetworkPolicy.decide`;
* :mod:`.http_head`: the proxy request head, parsed strictly, and the short answers (400, 403, 502, 504);
* :mod:`.tls_hello`: the server name of a TLS ClientHello, checked against the name decided;
* :mod:`.addresses`: which resolved addresses may be connected to, and the resolver that returns only
  those (the decision is on the address connected, never on a name resolved twice);
* :mod:`.log`: the bounded per-session connection log;
* :mod:`.relay`: the host side of one proxied connection, all of the above in order (:func:`relay`);
* :mod:`.intercept`: for hosts with injected headers, TLS terminated with a per-session CA, the headers
  added, and TLS again to the verified server (imported on its own: it needs ``cryptography``).

Nothing here imports a backend, docker-py or :mod:`adk_sandbox.devtools` (``tests/unit/test_layering.py``).
The decision rules are written down in ``docs/network.md``.
"""

from adk_sandbox.executor.network.addresses import (
    RefusedAddressError,
    ResolutionFailedError,
    refusal,
    resolve,
)
from adk_sandbox.executor.network.http_head import HeadError, ProxyRequest, head_end, parse_head
from adk_sandbox.executor.network.log import ConnectionEntry, ConnectionLog, LogSnapshot
from adk_sandbox.executor.network.policy import Decision, NetworkPolicy
from adk_sandbox.executor.network.relay import ByteStream, relay
from adk_sandbox.executor.network.tls_hello import ServerName, server_name

__all__ = [
    "ByteStream",
    "ConnectionEntry",
    "ConnectionLog",
    "Decision",
    "HeadError",
    "LogSnapshot",
    "NetworkPolicy",
    "ProxyRequest",
    "RefusedAddressError",
    "ResolutionFailedError",
    "ServerName",
    "head_end",
    "parse_head",
    "refusal",
    "relay",
    "resolve",
    "server_name",
]
