"""NetworkPolicy: the rules' syntax, the decision table, and what validation refuses."""

from __future__ import annotations

import ipaddress

import pytest
from pydantic import ValidationError

from adk_sandbox.executor.network.policy import (
    NetworkPolicy,
    Rule,
    is_numeric_host,
    normalise_host,
)

POLICY = NetworkPolicy(
    allow=["pypi.org", "*.pythonhosted.org", "git.example.com:8443", "*.api.test:9000"],
    deny=["evil.pythonhosted.org", "*.bad.pythonhosted.org"],
)


@pytest.mark.parametrize(
    ("host", "port", "allowed", "rule"),
    [
        ("pypi.org", 443, True, "allow pypi.org"),
        ("pypi.org", 80, True, "allow pypi.org"),
        ("PyPI.ORG.", 443, True, "allow pypi.org"),  # case and a trailing dot do not matter
        ("pypi.org", 8080, False, "no rule allows it"),  # no port in the rule: 80 and 443 only
        ("pypi.org", 22, False, "no rule allows it"),
        ("www.pypi.org", 443, False, "no rule allows it"),  # an exact rule is exact
        ("files.pythonhosted.org", 443, True, "allow *.pythonhosted.org"),
        ("a.b.pythonhosted.org", 443, True, "allow *.pythonhosted.org"),  # any depth
        ("pythonhosted.org", 443, False, "no rule allows it"),  # the wildcard is strictly below
        ("xpythonhosted.org", 443, False, "no rule allows it"),  # a suffix of labels, not of characters
        ("pythonhosted.org.evil.test", 443, False, "no rule allows it"),
        ("evil.pythonhosted.org", 443, False, "deny evil.pythonhosted.org"),  # deny wins
        ("evil.pythonhosted.org", 8443, False, "deny evil.pythonhosted.org"),  # a portless deny: any port
        ("x.bad.pythonhosted.org", 443, False, "deny *.bad.pythonhosted.org"),
        ("bad.pythonhosted.org", 443, True, "allow *.pythonhosted.org"),
        ("git.example.com", 8443, True, "allow git.example.com:8443"),
        ("git.example.com", 443, False, "no rule allows it"),  # a port rule covers that port only
        ("v1.api.test", 9000, True, "allow *.api.test:9000"),
        ("v1.api.test", 443, False, "no rule allows it"),
        ("other.test", 443, False, "no rule allows it"),
    ],
)
def test_the_decision_table(host: str, port: int, allowed: bool, rule: str) -> None:
    decision = POLICY.decide(host, port)
    assert (decision.allowed, decision.rule) == (allowed, rule)
    assert decision.message


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "10.0.0.1",
        "::1",
        "[::1]",
        "::ffff:127.0.0.1",
        "[::ffff:127.0.0.1]",
        "2130706433",  # 127.0.0.1 as one decimal number
        "0x7f.1",  # hex and the short form
        "0x7f000001",
        "127.1",
        "0177.0.0.1",  # octal
        "017700000001",
        "1.2.3.0x4",
        "169.254.169.254.",
        "evil.0x10",
    ],
)
def test_an_ip_literal_in_any_spelling_is_refused_even_by_a_catch_all(host: str) -> None:
    decision = NetworkPolicy(allow=["*"]).decide(host, 443)
    assert not decision.allowed
    assert decision.rule == "not a host name"
    assert "pin a name" in decision.message


@pytest.mark.parametrize(
    "host",
    ["", ".", "a..b", "-a.test", "a-.test", "a_b.test", "a b.test", "a/b.test", "x" * 64 + ".test",
     "a." * 127 + "test", "bücher.test", "a%2eb.test", "a\0.test", "*.test", "a:b"],
)  # fmt: skip
def test_what_is_not_a_host_name_is_refused(host: str) -> None:
    decision = NetworkPolicy(allow=["*"]).decide(host, 443)
    assert not decision.allowed
    assert decision.rule == "not a host name"


@pytest.mark.parametrize("port", [0, -1, 65536, 100000])
def test_an_impossible_port_is_refused(port: int) -> None:
    decision = NetworkPolicy(allow=["*"]).decide("a.test", port)
    assert (decision.allowed, decision.rule) == (False, "not a valid port")


def test_a_catch_all_allows_every_name_on_the_default_ports_and_a_deny_still_wins() -> None:
    policy = NetworkPolicy(allow=["*"], deny=["*.internal.test"])
    assert policy.decide("anything.test", 443).allowed
    assert not policy.decide("anything.test", 25).allowed
    assert policy.decide("db.internal.test", 443).rule == "deny *.internal.test"
    assert NetworkPolicy(allow=["*:8080"]).decide("x.test", 8080).allowed


def test_the_default_policy_allows_nothing_and_says_so() -> None:
    decision = NetworkPolicy().decide("pypi.org", 443)
    assert not decision.allowed
    assert decision.rule == "no rule allows it"
    assert "allows no host" in decision.message


def test_a_refusal_tells_a_model_what_it_could_do() -> None:
    by_port = POLICY.decide("pypi.org", 8080).message
    assert "pypi.org:8080" in by_port
    assert "the name is allowed by pypi.org" in by_port
    assert "80, 443" in by_port
    by_name = POLICY.decide("npmjs.org", 443).message
    assert "allowed: pypi.org, *.pythonhosted.org" in by_name
    denied = POLICY.decide("evil.pythonhosted.org", 443).message
    assert "deny rule 'evil.pythonhosted.org'" in denied
    many = NetworkPolicy(allow=[f"h{i}.test" for i in range(25)]).decide("x.test", 443).message
    assert "and 15 more" in many
    assert len(many) < 400


@pytest.mark.parametrize(
    ("text", "host", "wildcard", "port", "shown"),
    [
        ("pypi.org", "pypi.org", False, None, "pypi.org"),
        ("PyPI.org.", "pypi.org", False, None, "pypi.org"),
        ("*.Example.com:8443", "example.com", True, 8443, "*.example.com:8443"),
        ("*", "", True, None, "*"),
        ("*:80", "", True, 80, "*:80"),
        ("xn--bcher-kva.test", "xn--bcher-kva.test", False, None, "xn--bcher-kva.test"),
    ],
)
def test_rules_parse(text: str, host: str, wildcard: bool, port: int | None, shown: str) -> None:
    rule = Rule.parse(text)
    assert (rule.host, rule.wildcard, rule.port, rule.text) == (host, wildcard, port, shown)


@pytest.mark.parametrize(
    ("rule", "says"),
    [
        ("10.0.0.1", "IP address"),
        ("10.0.0.1:443", "IP address"),
        ("[::1]:443", "IP address"),
        ("::1", "IP address"),
        ("2130706433", "resolver reads as an IP address"),
        ("pypi.org:0", "port"),
        ("pypi.org:65536", "port"),
        ("pypi.org:https", "port"),
        ("pypi.org:", "port"),
        ("pypi.org:+443", "port"),
        ("pypi.org:٤٤٣", "port"),  # Arabic-Indic digits are digits to str.isdigit
        ("a.*.test", "'*' may only stand alone"),
        ("*a.test", "'*' may only stand alone"),
        ("**.test", "'*' may only stand alone"),
        ("bücher.test", "xn--bcher-kva.test"),
        ("", "1 to 253"),
        ("a_b.test", "invalid label"),
        ("http://pypi.org", "port"),
    ],
)
def test_bad_rules_are_refused_with_a_reason(rule: str, says: str) -> None:
    with pytest.raises(ValidationError, match=None) as caught:
        NetworkPolicy(allow=[rule])
    assert says in str(caught.value)
    with pytest.raises(ValidationError):
        NetworkPolicy(deny=[rule])


def test_the_policy_is_frozen_and_strict() -> None:
    with pytest.raises(ValidationError):
        POLICY.allow = ("x.test",)  # type: ignore[misc]
    with pytest.raises(ValidationError, match="extra"):
        NetworkPolicy(allowed=["pypi.org"])  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        NetworkPolicy(allow="pypi.org")


def test_pins_normalise_and_are_looked_up_by_name() -> None:
    policy = NetworkPolicy(
        allow=["local.test"], hosts={"Local.Test.": ["127.0.0.1", "[::1]", "127.0.0.1"], "b.test": ["::1"]}
    )
    assert policy.hosts == {"local.test": ("127.0.0.1", "::1"), "b.test": ("::1",)}
    assert policy.pinned("LOCAL.test") == (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))
    assert policy.pinned("other.test") is None
    assert policy.pinned("not a name") is None


def test_a_pin_does_not_allow_a_name() -> None:
    policy = NetworkPolicy(hosts={"local.test": ["127.0.0.1"]})
    assert not policy.decide("local.test", 443).allowed


@pytest.mark.parametrize(
    ("hosts", "says"),
    [
        ({"local.test": []}, "at least one address"),
        ({"local.test": ["localhost"]}, "not an IP address"),
        ({"local.test": ["127.0.0.1:80"]}, "not an IP address"),
        ({"127.0.0.1": ["127.0.0.1"]}, "IP address, not a host name"),
        ({"*.test": ["127.0.0.1"]}, "invalid label"),
        ({"a.test": ["127.0.0.1"], "A.test": ["127.0.0.2"]}, "pinned twice"),
    ],
)
def test_bad_pins_are_refused(hosts: dict[str, list[str]], says: str) -> None:
    with pytest.raises(ValidationError) as caught:
        NetworkPolicy(hosts=hosts)
    assert says in str(caught.value)


def test_headers_are_kept_per_exact_name() -> None:
    policy = NetworkPolicy(allow=["*.api.test"], headers={"V1.Api.Test": {"Authorization": "Bearer s3cr3t"}})
    assert policy.headers_for("v1.api.test") == {"Authorization": "Bearer s3cr3t"}
    assert policy.headers_for("v2.api.test") == {}
    assert policy.headers_for("[::1]") == {}


@pytest.mark.parametrize(
    ("headers", "says"),
    [
        ({"api.test": {"Authorization": "Bearer x\r\nX-Evil: 1"}}, "CR, LF"),
        ({"api.test": {"Authorization": "Bearer x\nX-Evil: 1"}}, "CR, LF"),
        ({"api.test": {"Authorization": "a\0b"}}, "CR, LF, NUL"),
        ({"api.test": {"Authorization": "a\x7fb"}}, "control"),
        ({"api.test": {"Bad Name": "x"}}, "not a valid header name"),
        ({"api.test": {"X-A:": "x"}}, "not a valid header name"),
        ({"api.test": {"X-A\r\n": "x"}}, "not a valid header name"),
        ({"api.test": {"Host": "other.test"}}, "frames the request"),
        ({"api.test": {"Content-Length": "0"}}, "frames the request"),
        ({"api.test": {"transfer-encoding": "chunked"}}, "frames the request"),
        ({"api.test": {"X-A": "1", "x-a": "2"}}, "given twice"),
        ({"*.api.test": {"X-A": "1"}}, "exact host name"),
        ({"other.test": {"X-A": "1"}}, "which no allow rule allows"),
    ],
)
def test_bad_headers_are_refused(headers: dict[str, dict[str, str]], says: str) -> None:
    with pytest.raises(ValidationError) as caught:
        NetworkPolicy(allow=["api.test"], headers=headers)
    assert says in str(caught.value)


def test_names_normalise() -> None:
    assert normalise_host("PyPI.Org.") == "pypi.org"
    assert normalise_host("xn--bcher-kva.test") == "xn--bcher-kva.test"
    assert normalise_host("a" * 63 + ".test") == "a" * 63 + ".test"
    with pytest.raises(ValueError, match="xn--bcher-kva"):
        normalise_host("bücher.test")


@pytest.mark.parametrize(
    ("host", "numeric"),
    [("1", True), ("0x", True), ("0xff", True), ("a.123", True), ("123.a", False), ("0xg", False),
     ("a.0x1f.", True), ("pypi.org", False), ("1a", False)],
)  # fmt: skip
def test_numeric_names_are_told_apart(host: str, numeric: bool) -> None:
    assert is_numeric_host(host) is numeric
