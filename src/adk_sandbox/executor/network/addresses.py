"""Which addresses the host side may connect to for a sandbox, and the resolver that picks them.

:func:`resolve` resolves a name itself and keeps only the addresses :func:`refusal` lets through
(:class:`RefusedAddressError`, :class:`ResolutionFailedError`), so the check is on the address actually
connected (DNS rebinding); :func:`machine_addresses` and :func:`infrastructure_addresses` give the
engine's own. See docs/network.md, section "Addresses".
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from adk_sandbox.executor.network.policy import NetworkPolicy, normalise_host

__all__ = [
    "ENGINE_REASON",
    "IPAddress",
    "IPNetwork",
    "RefusedAddressError",
    "ResolutionFailedError",
    "infrastructure_addresses",
    "machine_addresses",
    "refusal",
    "resolve",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network

# Most specific first: the first match names the reason, so metadata comes before link-local.
_REFUSED_V4: tuple[tuple[ipaddress.IPv4Network, str], ...] = (
    (_V4("169.254.169.254/32"), "a cloud metadata service"),
    (_V4("169.254.170.2/32"), "a cloud metadata service (ECS task metadata)"),
    (_V4("100.100.100.200/32"), "a cloud metadata service (Alibaba)"),
    (_V4("0.0.0.0/8"), "unspecified ('this network')"),
    (_V4("127.0.0.0/8"), "loopback"),
    (_V4("10.0.0.0/8"), "private (RFC 1918)"),
    (_V4("172.16.0.0/12"), "private (RFC 1918)"),
    (_V4("192.168.0.0/16"), "private (RFC 1918)"),
    (_V4("100.64.0.0/10"), "shared address space (carrier-grade NAT)"),
    (_V4("169.254.0.0/16"), "link-local"),
    (_V4("192.0.0.0/24"), "reserved (IETF protocol assignments)"),
    (_V4("192.0.2.0/24"), "reserved (documentation)"),
    (_V4("198.51.100.0/24"), "reserved (documentation)"),
    (_V4("203.0.113.0/24"), "reserved (documentation)"),
    (_V4("192.88.99.0/24"), "reserved (6to4 relay anycast)"),
    (_V4("198.18.0.0/15"), "reserved (benchmarking)"),
    (_V4("224.0.0.0/4"), "multicast"),
    (_V4("240.0.0.0/4"), "reserved (including broadcast)"),
)

_REFUSED_V6: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_V6("fd00:ec2::254/128"), "a cloud metadata service"),
    (_V6("::/128"), "unspecified"),
    (_V6("::1/128"), "loopback"),
    (_V6("64:ff9b:1::/48"), "private (local-use NAT64)"),
    (_V6("2001::/32"), "a Teredo tunnel (deprecated; the tunnel decides where it goes)"),
    (_V6("2002::/16"), "a 6to4 tunnel (deprecated; the tunnel decides where it goes)"),
    (_V6("2001:db8::/32"), "reserved (documentation)"),
    (_V6("3fff::/20"), "reserved (documentation)"),
    (_V6("2001:10::/28"), "reserved (ORCHID)"),
    (_V6("2001:20::/28"), "reserved (ORCHIDv2)"),
    (_V6("fc00::/7"), "private (unique local)"),
    (_V6("fe80::/10"), "link-local"),
    (_V6("fec0::/10"), "private (site-local, deprecated)"),
    (_V6("ff00::/8"), "multicast"),
)
_GLOBAL_UNICAST = _V6("2000::/3")
_NAT64 = _V6("64:ff9b::/96")
_IPV4_COMPATIBLE = _V6("::/96")
_SIIT = _V6("::ffff:0:0:0/96")

ENGINE_REASON = "an address of the sandbox engine's own host"


class RefusedAddressError(Exception):
    """Every address a name resolved to (or the one asked for) is refused; ``reasons`` says why, each.

    Raised by :func:`resolve` to the relay, which answers the sandbox with a 403; it never reaches a user
    of the library.
    """

    def __init__(self, name: str, reasons: Sequence[tuple[IPAddress, str]]) -> None:
        self.name = name
        self.reasons = tuple(reasons)
        listed = "; ".join(f"{address} is {why}" for address, why in self.reasons)
        super().__init__(
            f"{name} resolves only to addresses a sandbox may not reach ({listed}); pin the name in the "
            "policy's hosts if that address is really meant"
        )


class ResolutionFailedError(Exception):
    """The name does not resolve (no such name, or DNS failed); the relay answers with a 502."""

    def __init__(self, name: str, detail: str) -> None:
        self.name = name
        super().__init__(f"{name} could not be resolved by the host: {detail}")


def _embedded_v4(address: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, str] | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped, "IPv4-mapped"
    if address in _SIIT:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF), "IPv4-translated (SIIT)"
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF), "NAT64"
    if address in _IPV4_COMPATIBLE and int(address) > 1:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF), "IPv4-compatible (deprecated)"
    return None


def _in(address: IPAddress, refused: Iterable[IPAddress | IPNetwork]) -> bool:
    for item in refused:
        if isinstance(item, ipaddress.IPv4Address | ipaddress.IPv6Address):
            if address == item:
                return True
        elif address.version == item.version and address in item:
            return True
    return False


def refusal(  # noqa: PLR0911 - one answer per kind of address, in the order they are told apart
    address: IPAddress,
    *,
    extra_refused: frozenset[IPAddress | IPNetwork] = frozenset(),
) -> str | None:
    """Why a sandbox may not connect to ``address``, or None when it may.

    ``extra_refused`` holds the engine's own addresses (the Docker host, the Kubernetes API server, the
    gateway of the engine's networks): addresses or networks the caller knows are the infrastructure.
    The reason is a phrase ("loopback", "IPv4-mapped form of 169.254.169.254, a cloud metadata service").
    """
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id:
        # A zone index only means something for link-local and multicast; judge the bare address.
        address = ipaddress.IPv6Address(int(address))
    if _in(address, extra_refused):
        return ENGINE_REASON
    if isinstance(address, ipaddress.IPv4Address):
        for network, why in _REFUSED_V4:
            if address in network:
                return why
        if not address.is_global:
            return "reserved (not globally routable)"
        return None
    embedded = _embedded_v4(address)
    if embedded is not None:
        inner, form = embedded
        inner_why = refusal(inner, extra_refused=extra_refused)
        if inner_why is not None:
            return f"the {form} form of {inner}, {inner_why}"
        if form != "NAT64":
            # A kernel sends an IPv4-mapped address to the IPv4 address, but a public one is reached
            # just as well by that IPv4 address itself: these forms are only ever a disguise here.
            return f"the {form} form of {inner} (connect to IPv4 addresses as such)"
        return None
    for network6, why in _REFUSED_V6:
        if address in network6:
            return why
    if address not in _GLOBAL_UNICAST:
        return "reserved (outside IPv6 global unicast 2000::/3)"
    return None


GetAddrInfo = Callable[..., Sequence[tuple[Any, Any, Any, Any, Any]]]
"""The shape of :func:`socket.getaddrinfo` (what :func:`resolve` calls; tests pass a fake)."""

_FIB_TRIE = Path("/proc/net/fib_trie")
_IF_INET6 = Path("/proc/net/if_inet6")


def machine_addresses(fib_trie: Path = _FIB_TRIE, if_inet6: Path = _IF_INET6) -> frozenset[IPAddress]:
    """The addresses of this machine's own interfaces (Linux; elsewhere empty).

    Read from the kernel's local routing table (each ``/32 host LOCAL`` entry of ``/proc/net/fib_trie``
    names the address above it) and from ``/proc/net/if_inet6``: interface addresses without the ``ip``
    command, and without asking DNS what this machine is called.
    """
    found: set[IPAddress] = set()
    with contextlib.suppress(OSError):
        last: str | None = None
        for line in fib_trie.read_text().splitlines():
            stripped = line.strip()
            if stripped.startswith("|--"):
                last = stripped[3:].strip()
            elif stripped.startswith("/32 host LOCAL") and last is not None:
                with contextlib.suppress(ValueError):
                    found.add(ipaddress.IPv4Address(last))
    with contextlib.suppress(OSError):
        for line in if_inet6.read_text().splitlines():
            fields = line.split()
            if fields and len(fields[0]) == 32:
                with contextlib.suppress(ValueError):
                    found.add(ipaddress.IPv6Address(int(fields[0], 16)))
    return frozenset(found)


def infrastructure_addresses(
    hosts: Iterable[str] = (), getaddrinfo: GetAddrInfo = socket.getaddrinfo
) -> frozenset[IPAddress]:
    """The addresses a sandbox's connections are refused besides :func:`refusal`'s ranges: ``extra_refused``.

    This machine's own addresses (the relay connects from here: a service on this machine's public address,
    a Docker engine listening on TCP among them, is the infrastructure, not the internet) and those of
    ``hosts``, the names of the engine's machine (a remote Docker host, the Kubernetes API server), each
    an address or a name resolved now (one that does not resolve adds nothing: the engine is not reached
    by it either). Only addresses :func:`refusal` would let through are kept, so a loopback or private one
    keeps its own reason in the 403.
    """
    found: set[IPAddress] = set(machine_addresses())
    for host in hosts:
        bare = host.strip("[]")
        try:
            found.add(ipaddress.ip_address(bare))
            continue
        except ValueError:
            pass
        with contextlib.suppress(OSError, UnicodeError):
            for family, _type, _proto, _canon, sockaddr in getaddrinfo(bare, None, type=socket.SOCK_STREAM):
                if family in (socket.AF_INET, socket.AF_INET6):
                    with contextlib.suppress(ValueError):
                        found.add(ipaddress.ip_address(str(sockaddr[0]).partition("%")[0]))
    return frozenset(address for address in found if refusal(address) is None)


def resolve(
    name: str,
    port: int,
    policy: NetworkPolicy,
    getaddrinfo: GetAddrInfo = socket.getaddrinfo,
    *,
    extra_refused: frozenset[IPAddress | IPNetwork] = frozenset(),
) -> tuple[IPAddress, ...]:
    """The addresses to try, in order, for a connection to ``name:port`` the policy allowed by name.

    A pinned name gives its pinned addresses only, DNS never asked, and none of them refused (the user
    pinned them on purpose). Otherwise the name is resolved here and each address checked by
    :func:`refusal`: refused ones are dropped (a name with one public and one private address connects to
    the public one only), and :class:`RefusedAddressError` is raised when none is left. Raises
    :class:`ResolutionFailedError` when the name does not resolve. Always addresses, never a name: the
    caller connects to exactly what was checked.
    """
    pinned = policy.pinned(name)
    if pinned is not None:
        return pinned
    try:
        host = normalise_host(name)
    except ValueError as error:
        # The policy refuses these before resolving; checked again so no caller can hand getaddrinfo a
        # "name" that inet_aton would read as an address.
        raise ResolutionFailedError(name, str(error)) from None
    try:
        infos = getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as error:
        raise ResolutionFailedError(host, str(error) or type(error).__name__) from None
    found: list[IPAddress] = []
    for family, _type, _proto, _canon, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        try:
            address = ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])
        except ValueError:
            continue
        if address not in found:
            found.append(address)
    if not found:
        raise ResolutionFailedError(host, "no IPv4 or IPv6 address")
    allowed: list[IPAddress] = []
    refused: list[tuple[IPAddress, str]] = []
    for address in found:
        why = refusal(address, extra_refused=extra_refused)
        if why is None:
            allowed.append(address)
        else:
            refused.append((address, why))
    if not allowed:
        raise RefusedAddressError(host, refused)
    return tuple(allowed)
