"""NetworkPolicy: which host names a sandbox may reach through the host-side proxy, and how names resolve.

:class:`NetworkPolicy` (``allow``, ``deny``, ``hosts`` pins, ``headers``, ``upstream_ca``) decides by
name (:meth:`NetworkPolicy.decide` gives a :class:`Decision`; the address checks come after);
:func:`network_setting` reads a ``network=`` argument. See docs/network.md, section "The policy".
"""

from __future__ import annotations

import ipaddress
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from adk_sandbox.executor.errors import InvalidRequestError

__all__ = [
    "DEFAULT_PORTS",
    "Decision",
    "NetworkPolicy",
    "Rule",
    "is_numeric_host",
    "network_setting",
    "normalise_host",
]

DEFAULT_PORTS = frozenset({80, 443})
"""The ports an allow rule without ``:port`` covers."""

_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*")
# RFC 7230 token: what a header name may be.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# Header values: visible ASCII, obs-text, space and tab inside; never CR, LF, NUL or another control byte,
# which would end the header early and let a value smuggle a header or a request of its own.
_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")
# Headers a policy may not inject: they frame the message or the connection, so an injected one would
# change where a body ends or what the next bytes mean, not add a credential.
_FRAMING_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
        "proxy-connection",
        "proxy-authorization",
        "proxy-authenticate",
    }
)


def is_numeric_host(host: str) -> bool:
    """Whether ``host`` (lowercase) is an address a resolver would read as a number, not a name.

    The WHATWG URL rule ("ends in a number"): the last label is all digits or ``0x`` with hex digits.
    ``inet_aton``, which ``getaddrinfo`` falls back to, reads ``2130706433``, ``0x7f.1`` and ``127.1`` as
    127.0.0.1, so such a "name" would reach an address no name rule was written for.
    """
    labels = host.rstrip(".").split(".")
    return bool(labels) and _NUMERIC_LABEL.fullmatch(labels[-1]) is not None


def _a_label_hint(text: str) -> str:
    try:
        return f" (write it as {text.encode('idna').decode('ascii')!r})"
    except UnicodeError:
        return ""


def normalise_host(text: str) -> str:
    """A host name in the form rules compare: lowercase, no trailing dot, checked label by label.

    Raises ``ValueError`` (its message written to be read by whoever wrote the name) for an IP address in
    any spelling, a non-ASCII name, and anything that is not letters, digits and inner hyphens in labels
    of 1 to 63 characters, 253 in all.
    """
    if not text.isascii():
        raise ValueError(f"host name {text!r} is not ASCII{_a_label_hint(text)}")
    host = text.lower()
    if host.endswith("."):
        host = host[:-1]
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        pass
    else:
        raise ValueError(
            f"{text!r} is an IP address, not a host name: the policy decides by name "
            "(pin a name to an address in hosts to reach a fixed address)"
        )
    if not host or len(host) > 253:
        raise ValueError(f"host name {text!r} must be 1 to 253 characters")
    if is_numeric_host(host):
        raise ValueError(
            f"{text!r} is a number a resolver reads as an IP address, not a host name "
            "(pin a name to an address in hosts to reach a fixed address)"
        )
    for label in host.split("."):
        if not _LABEL.fullmatch(label):
            raise ValueError(
                f"host name {text!r} has an invalid label {label!r}: labels are 1 to 63 letters, digits "
                "and inner hyphens"
            )
    return host


@dataclass(frozen=True)
class Rule:
    """One parsed ``allow`` or ``deny`` entry: what it matches and the text it was written as."""

    text: str
    """The rule as written in the policy (normalised), quoted in decisions."""
    host: str
    """An exact name; for a wildcard, the suffix after ``*.``; empty for ``*``."""
    wildcard: bool
    """``*.suffix`` (any name strictly under the suffix) or ``*`` (any name)."""
    port: int | None
    """The one port it covers; None when written without a port."""

    @classmethod
    def parse(cls, text: str) -> Self:
        """Parse ``name``, ``*.suffix`` or ``*``, each with an optional ``:port``; ``ValueError`` if bad."""
        name, port = text, None
        if text.count(":") > 1 and not text.startswith("["):
            # More than one colon is an IPv6 address (with or without a port), never a name and a port.
            raise ValueError(f"rule {text!r} is an IP address, not a host name: the policy decides by name")
        if ":" in text:
            name, _, port_text = text.rpartition(":")
            if not port_text.isascii() or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
                raise ValueError(
                    f"rule {text!r}: the port must be a number from 1 to 65535 (IP addresses and "
                    "IPv6 literals are not rules: the policy decides by name)"
                )
            port = int(port_text)
        if name == "*":
            return cls(text=text.lower(), host="", wildcard=True, port=port)
        wildcard = name.startswith("*.")
        if "*" in (name[2:] if wildcard else name):
            raise ValueError(f"rule {text!r}: '*' may only stand alone or as the first label ('*.suffix')")
        try:
            host = normalise_host(name[2:] if wildcard else name)
        except ValueError as error:
            raise ValueError(f"rule {text!r}: {error}") from None
        shown = ("*." if wildcard else "") + host + (f":{port}" if port is not None else "")
        return cls(text=shown, host=host, wildcard=wildcard, port=port)

    def matches_name(self, host: str) -> bool:
        """Whether the rule's name part matches ``host`` (already normalised), whatever the port."""
        if not self.wildcard:
            return host == self.host
        return not self.host or host.endswith("." + self.host)

    def matches(self, host: str, port: int, *, default_ports: frozenset[int] | None) -> bool:
        """Whether the rule matches ``host:port``; a rule without a port covers ``default_ports``.

        ``default_ports`` None means every port (how a deny rule without a port reads).
        """
        if not self.matches_name(host):
            return False
        if self.port is not None:
            return port == self.port
        return default_ports is None or port in default_ports


@dataclass(frozen=True)
class Decision:
    """What :meth:`NetworkPolicy.decide` concluded about one ``host:port``."""

    allowed: bool
    """Whether the name may be connected to (the address checks come after, on what it resolves to)."""
    rule: str
    """The rule that decided (``allow pypi.org``, ``deny *.evil.test``), or why none did."""
    message: str
    """A sentence for the body of a 403, for whoever (often a model) reads the refusal."""


class NetworkPolicy(BaseModel):
    """Which host names a sandbox may reach, and how the host side resolves them.

    Default: nothing is allowed. See docs/network.md, "The policy", for the rules and their order.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    allow: tuple[str, ...] = ()
    """Rules for names that may be reached: ``pypi.org``, ``*.pythonhosted.org``, ``git.example:8443``,
    ``*``. Without a port a rule covers 80 and 443."""
    deny: tuple[str, ...] = ()
    """Rules for names that may not be reached, whatever ``allow`` says; without a port, every port."""
    hosts: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    """Pins, like ``/etc/hosts`` for the policy's resolver: a name -> the addresses it connects to, in
    order, without asking DNS. A pinned address is used even if it is loopback or private (that is how a
    test reaches its own server); pinning a name does not allow it."""
    headers: dict[str, dict[str, str]] = Field(default_factory=dict)
    """Per host name, headers the host side adds to requests (credentials); the sandbox never sees them.
    Added only where the host side itself speaks HTTP to the server over TLS, never in clear text."""
    upstream_ca: tuple[str, ...] = ()
    """CA certificates (PEM) the host side trusts, besides the system's, when it verifies a server it
    re-encrypts to (the hosts with ``headers``): for tests and private CAs. Certificates only, never a
    key; hosts without headers are verified by the sandbox's own client, never by this."""

    @field_validator("allow", "deny")
    @classmethod
    def _rules_parse(cls, rules: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(Rule.parse(rule).text for rule in rules)

    @field_validator("hosts")
    @classmethod
    def _pins_are_names_and_addresses(cls, hosts: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        pins: dict[str, tuple[str, ...]] = {}
        for name, addresses in hosts.items():
            try:
                host = normalise_host(name)
            except ValueError as error:
                raise ValueError(f"hosts: {error}") from None
            if host in pins:
                raise ValueError(f"hosts: {name!r} is pinned twice (names compare case-insensitively)")
            if not addresses:
                raise ValueError(f"hosts: {name!r} needs at least one address")
            parsed = []
            for address in addresses:
                try:
                    parsed.append(str(ipaddress.ip_address(address.strip("[]"))))
                except ValueError:
                    raise ValueError(
                        f"hosts: {address!r} (for {name!r}) is not an IP address like '127.0.0.1' or '::1'"
                    ) from None
            pins[host] = tuple(dict.fromkeys(parsed))
        return pins

    @field_validator("headers")
    @classmethod
    def _headers_are_safe(cls, headers: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        checked: dict[str, dict[str, str]] = {}
        for name, fields in headers.items():
            try:
                host = normalise_host(name)
            except ValueError as error:
                raise ValueError(f"headers: {error} (headers are given per exact host name)") from None
            if host in checked:
                raise ValueError(f"headers: {name!r} is given twice (names compare case-insensitively)")
            seen: set[str] = set()
            for field, value in fields.items():
                if not _TOKEN.fullmatch(field):
                    raise ValueError(f"headers for {name!r}: {field!r} is not a valid header name")
                if field.lower() in _FRAMING_HEADERS:
                    raise ValueError(
                        f"headers for {name!r}: {field!r} frames the request or the connection and cannot "
                        "be injected; inject credentials such as Authorization instead"
                    )
                if field.lower() in seen:
                    raise ValueError(f"headers for {name!r}: {field!r} is given twice")
                seen.add(field.lower())
                if not _VALUE.fullmatch(value):
                    raise ValueError(
                        f"headers for {name!r}: the value of {field!r} contains CR, LF, NUL or another "
                        "control character, which would split the request"
                    )
            checked[host] = dict(fields)
        return checked

    @field_validator("upstream_ca")
    @classmethod
    def _upstream_ca_are_certificates(cls, certificates: tuple[str, ...]) -> tuple[str, ...]:
        for pem in certificates:
            if "PRIVATE KEY" in pem:
                raise ValueError("upstream_ca: give CA certificates only, never a private key")
            try:
                ssl.create_default_context().load_verify_locations(cadata=pem)
            except (ssl.SSLError, ValueError) as error:
                raise ValueError(f"upstream_ca: not a PEM certificate ({error})") from None
        return certificates

    @model_validator(mode="after")
    def _headers_go_to_allowed_names(self) -> Self:
        # Headers for a name no allow rule covers could never be sent: a typo in a credential's host
        # would otherwise fail silently as "the server said 401".
        rules = self.allow_rules
        for host in self.headers:
            if not any(rule.matches_name(host) for rule in rules):
                raise ValueError(
                    f"headers are given for {host!r}, which no allow rule allows; add it to allow"
                )
        return self

    @property
    def allow_rules(self) -> tuple[Rule, ...]:
        """The ``allow`` entries, parsed."""
        return tuple(Rule.parse(rule) for rule in self.allow)

    @property
    def deny_rules(self) -> tuple[Rule, ...]:
        """The ``deny`` entries, parsed."""
        return tuple(Rule.parse(rule) for rule in self.deny)

    def pinned(self, host: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, ...] | None:
        """The addresses ``host`` is pinned to, or None when it is not pinned (resolve it by DNS)."""
        try:
            name = normalise_host(host)
        except ValueError:
            return None
        addresses = self.hosts.get(name)
        return None if addresses is None else tuple(ipaddress.ip_address(a) for a in addresses)

    def headers_for(self, host: str) -> dict[str, str]:
        """The headers to inject for ``host`` (exact name), empty when there are none."""
        try:
            return dict(self.headers.get(normalise_host(host), {}))
        except ValueError:
            return {}

    def decide(self, host: str, port: int) -> Decision:
        """Whether the sandbox may connect to ``host:port`` by name; docs/network.md, "The policy"."""
        shown = f"{host}:{port}"
        if not 1 <= port <= 65535:
            return self._refuse(shown, "not a valid port", f"port {port} is not from 1 to 65535")
        try:
            name = normalise_host(host)
        except ValueError as error:
            return self._refuse(shown, "not a host name", str(error))
        shown = f"{name}:{port}"
        for rule in self.deny_rules:
            if rule.matches(name, port, default_ports=None):
                return self._refuse(shown, f"deny {rule.text}", f"the deny rule {rule.text!r} matches it")
        for rule in self.allow_rules:
            if rule.matches(name, port, default_ports=DEFAULT_PORTS):
                return Decision(
                    allowed=True, rule=f"allow {rule.text}", message=f"{shown} is allowed by {rule.text!r}"
                )
        return self._refuse(shown, "no rule allows it", self._what_is_allowed(name))

    def _what_is_allowed(self, name: str) -> str:
        if not self.allow:
            return "no rule allows it: this sandbox's network policy allows no host"
        near = [r.text for r in self.allow_rules if r.matches_name(name)]
        if near:
            # The name is allowed on other ports: saying so saves a model from guessing at host spellings.
            return (
                f"no rule allows this port (the name is allowed by {', '.join(near)}; no port means 80, 443)"
            )
        listed = ", ".join(self.allow[:10]) + (
            f" and {len(self.allow) - 10} more" if len(self.allow) > 10 else ""
        )
        return f"no rule allows it (allowed: {listed})"

    @staticmethod
    def _refuse(shown: str, rule: str, why: str) -> Decision:
        return Decision(
            allowed=False,
            rule=rule,
            message=f"the sandbox's network policy refused {shown}: {why}",
        )


def network_setting(network: object) -> bool | NetworkPolicy:
    """A backend's ``network=``: ``False``, ``True``, a :class:`NetworkPolicy` or a mapping of its fields.

    Strictly those (pydantic alone would take ``"yes"``, ``1`` or ``"off"`` as a bool);
    :class:`~adk_sandbox.executor.errors.InvalidRequestError` for anything else, or for a mapping that is
    no policy (saying which field). The ``mode="before"`` validator of every backend's config.
    """
    if isinstance(network, bool | NetworkPolicy):
        return network
    if isinstance(network, Mapping):
        try:
            return NetworkPolicy.model_validate(dict(network))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'policy'}: {e['msg'].removeprefix('Value error, ')}"
                for e in exc.errors()
            )
            raise InvalidRequestError(f"network: not a NetworkPolicy: {problems}") from None
    raise InvalidRequestError(
        f"network must be False, True or a NetworkPolicy (a mapping such as {{'allow': ['pypi.org']}}), "
        f"not {network!r}"
    )
