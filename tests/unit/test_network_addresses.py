"""Which addresses a sandbox may reach, and the resolver that decides on the address connected."""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Any

import pytest

from adk_sandbox.executor.network.addresses import (
    ENGINE_REASON,
    RefusedAddressError,
    ResolutionFailedError,
    infrastructure_addresses,
    machine_addresses,
    refusal,
    resolve,
)
from adk_sandbox.executor.network.policy import NetworkPolicy

ip = ipaddress.ip_address


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("127.255.255.254", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "carrier-grade NAT"),
        ("100.127.255.255", "carrier-grade NAT"),
        ("169.254.1.1", "link-local"),
        ("169.254.169.254", "metadata"),
        ("169.254.170.2", "metadata"),
        ("100.100.100.200", "metadata"),
        ("0.0.0.0", "unspecified"),  # noqa: S104 - an address refused, not bound
        ("0.1.2.3", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("255.255.255.255", "reserved"),
        ("240.0.0.1", "reserved"),
        ("192.0.2.1", "documentation"),
        ("198.51.100.7", "documentation"),
        ("203.0.113.9", "documentation"),
        ("198.18.0.1", "benchmarking"),
        ("192.0.0.8", "reserved"),
        ("192.88.99.1", "reserved"),
        ("::", "unspecified"),
        ("::1", "loopback"),
        ("fe80::1", "link-local"),
        ("fe80::1%eth0", "link-local"),
        ("febf::1", "link-local"),
        ("fc00::1", "private"),
        ("fd12:3456::1", "private"),
        ("fd00:ec2::254", "metadata"),
        ("fec0::1", "site-local"),
        ("ff02::1", "multicast"),
        ("ff05::2", "multicast"),
        ("2001:db8::1", "documentation"),
        ("3fff::1", "documentation"),
        ("100::1", "outside IPv6 global unicast"),
        ("4000::1", "outside IPv6 global unicast"),
        ("64:ff9b:1::1", "local-use NAT64"),
        # An IPv6 address that carries an IPv4 one is judged by it: the attacker's favourite disguises.
        ("::ffff:127.0.0.1", "IPv4-mapped form of 127.0.0.1, loopback"),
        ("::ffff:7f00:1", "IPv4-mapped form of 127.0.0.1, loopback"),
        ("::ffff:169.254.169.254", "IPv4-mapped form of 169.254.169.254, a cloud metadata service"),
        ("::ffff:10.0.0.1", "private"),
        ("::ffff:8.8.8.8", "IPv4-mapped form of 8.8.8.8 (connect to IPv4 addresses as such)"),
        ("::127.0.0.1", "IPv4-compatible"),
        ("::8.8.8.8", "IPv4-compatible"),
        ("::ffff:0:127.0.0.1", "SIIT"),
        ("64:ff9b::127.0.0.1", "NAT64 form of 127.0.0.1, loopback"),
        ("64:ff9b::a9fe:a9fe", "NAT64 form of 169.254.169.254, a cloud metadata service"),
        ("2002:7f00:1::1", "6to4"),
        ("2002:808:808::1", "6to4"),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),
    ],
)
def test_refused_addresses_say_why(address: str, reason: str) -> None:
    why = refusal(ip(address))
    assert why is not None
    assert reason in why


@pytest.mark.parametrize(
    "address",
    ["8.8.8.8", "1.1.1.1", "151.101.0.223", "100.63.255.255", "100.128.0.1", "172.32.0.1", "169.253.1.1",
     "2a04:4e42::223", "2606:4700::1111", "64:ff9b::808:808"],
)  # fmt: skip
def test_public_addresses_pass(address: str) -> None:
    assert refusal(ip(address)) is None


def test_the_engines_own_addresses_are_refused_in_every_form() -> None:
    engine = frozenset(
        {ipaddress.ip_network("203.0.113.0/24"), ip("8.8.4.4"), ipaddress.ip_network("2a00::/64")}
    )
    assert refusal(ip("8.8.4.4"), extra_refused=engine) == ENGINE_REASON
    assert refusal(ip("2a00::5"), extra_refused=engine) == ENGINE_REASON
    assert refusal(ip("203.0.113.5"), extra_refused=engine) == ENGINE_REASON
    nat64 = refusal(ip("64:ff9b::808:404"), extra_refused=engine)
    assert nat64 is not None
    assert ENGINE_REASON in nat64
    assert refusal(ip("8.8.8.8"), extra_refused=engine) is None


def fake_getaddrinfo(table: dict[str, list[str]]) -> Any:
    calls: list[tuple[str, int]] = []

    def getaddrinfo(host: str, port: int, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        calls.append((host, port))
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        out: list[tuple[Any, ...]] = []
        for address in table[host]:
            if ":" in address:
                out.append((socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0)))
            else:
                out.append((socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)))
        return out

    getaddrinfo.calls = calls  # type: ignore[attr-defined]
    return getaddrinfo


POLICY = NetworkPolicy(allow=["*.test"], hosts={"local.test": ["127.0.0.1", "::1"]})


def test_a_public_name_resolves_to_its_addresses_in_order_without_duplicates() -> None:
    lookup = fake_getaddrinfo({"pub.test": ["8.8.8.8", "2606:4700::1111", "8.8.8.8"]})
    assert resolve("Pub.Test.", 443, POLICY, lookup) == (ip("8.8.8.8"), ip("2606:4700::1111"))
    assert lookup.calls == [("pub.test", 443)]


def test_a_pinned_name_uses_its_pins_only_even_loopback_and_never_asks_dns() -> None:
    lookup = fake_getaddrinfo({"local.test": ["8.8.8.8"]})
    assert resolve("local.test", 8443, POLICY, lookup) == (ip("127.0.0.1"), ip("::1"))
    assert lookup.calls == []


def test_a_name_resolving_to_a_private_address_is_refused_rebinding() -> None:
    lookup = fake_getaddrinfo({"rebind.test": ["10.0.0.5"]})
    with pytest.raises(RefusedAddressError) as caught:
        resolve("rebind.test", 443, POLICY, lookup)
    assert caught.value.reasons == ((ip("10.0.0.5"), "private (RFC 1918)"),)
    assert "10.0.0.5 is private" in str(caught.value)
    assert "pin the name" in str(caught.value)


def test_a_name_resolving_to_the_metadata_service_in_a_disguise_is_refused() -> None:
    lookup = fake_getaddrinfo({"meta.test": ["::ffff:169.254.169.254", "169.254.169.254"]})
    with pytest.raises(RefusedAddressError, match="metadata"):
        resolve("meta.test", 80, POLICY, lookup)


def test_mixed_answers_keep_only_the_allowed_addresses() -> None:
    lookup = fake_getaddrinfo({"mixed.test": ["127.0.0.1", "8.8.8.8", "fd00::1", "2606:4700::1111"]})
    assert resolve("mixed.test", 443, POLICY, lookup) == (ip("8.8.8.8"), ip("2606:4700::1111"))


def test_the_decision_is_per_lookup_so_a_rebinding_name_is_caught_the_second_time() -> None:
    answers = iter([["8.8.8.8"], ["127.0.0.1"]])

    def rebinding(host: str, port: int, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in next(answers)]

    assert resolve("flip.test", 443, POLICY, rebinding) == (ip("8.8.8.8"),)
    with pytest.raises(RefusedAddressError):
        resolve("flip.test", 443, POLICY, rebinding)


def test_engine_addresses_are_dropped_from_answers() -> None:
    lookup = fake_getaddrinfo({"eng.test": ["8.8.4.4", "8.8.8.8"]})
    engine = frozenset({ip("8.8.4.4")})
    assert resolve("eng.test", 443, POLICY, lookup, extra_refused=engine) == (ip("8.8.8.8"),)


@pytest.mark.parametrize("name", ["2130706433", "0x7f.1", "127.1", "127.0.0.1", "::1", "a..test", ""])
def test_a_numeric_or_bad_name_never_reaches_getaddrinfo(name: str) -> None:
    lookup = fake_getaddrinfo({})
    with pytest.raises(ResolutionFailedError):
        resolve(name, 443, POLICY, lookup)
    assert lookup.calls == []


def test_an_unknown_name_is_a_resolution_failure() -> None:
    with pytest.raises(ResolutionFailedError, match=r"nowhere\.test could not be resolved"):
        resolve("nowhere.test", 443, POLICY, fake_getaddrinfo({}))


def test_an_answer_with_no_usable_address_is_a_resolution_failure() -> None:
    def odd(host: str, port: int, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        return [(socket.AF_UNIX, socket.SOCK_STREAM, 0, "", "/x"), (socket.AF_INET, 1, 6, "", ("junk", 1))]

    with pytest.raises(ResolutionFailedError, match="no IPv4 or IPv6 address"):
        resolve("odd.test", 443, POLICY, odd)


def test_the_real_resolver_refuses_localhost() -> None:
    with pytest.raises((RefusedAddressError, ResolutionFailedError)):
        resolve("localhost", 80, NetworkPolicy(allow=["localhost"]))


FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 127.0.0.0/8 2 0 2
        |-- 127.0.0.1
           /32 host LOCAL
     |-- 8.8.4.4
        /32 host LOCAL
     |-- 10.0.0.0
        /24 link UNICAST
"""
IF_INET6 = (
    "00000000000000000000000000000001 01 80 10 80       lo\n"
    "2a001450400100000000000000000005 02 40 00 80 eth0\n"
)


def test_machine_addresses_are_read_from_the_local_routing_table(tmp_path: Path) -> None:
    (tmp_path / "fib_trie").write_text(FIB_TRIE)
    (tmp_path / "if_inet6").write_text(IF_INET6)
    found = machine_addresses(tmp_path / "fib_trie", tmp_path / "if_inet6")
    assert found == {ip("127.0.0.1"), ip("8.8.4.4"), ip("::1"), ip("2a00:1450:4001::5")}
    assert machine_addresses(tmp_path / "missing", tmp_path / "missing") == frozenset()


def test_infrastructure_addresses_keep_only_what_refusal_would_let_through() -> None:
    def dns(host: str, port: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        assert host == "engine.example"
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("9.9.9.9", 0)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.9", 0)),  # private: its own reason
        ]

    found = infrastructure_addresses(["engine.example", "[2a00::7]", "127.0.0.1"], getaddrinfo=dns)
    assert {ip("9.9.9.9"), ip("2a00::7")} <= found
    assert not any(refusal(address) for address in found)  # loopback and private keep their own reasons
    assert refusal(ip("9.9.9.9"), extra_refused=frozenset(found)) == ENGINE_REASON
