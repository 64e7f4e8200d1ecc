"""The host side of a sandbox's network policy, engine-neutral and pure: what may be reached, and how.

:class:`NetworkPolicy` decides; :mod:`.http_head`, :mod:`.tls_hello`, :mod:`.addresses`, :mod:`.log`,
:mod:`.relay` and :mod:`.intercept` (needs ``cryptography``, imported on its own) carry one proxied
connection. Nothing here imports a backend, docker-py or :mod:`adk_sandbox.devtools`. Depth: docs/network.md.
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
