"""The egress policy (pure): deny wins, defaults refuse loopback, link-local and the like,
mapped IPv6 addresses are judged as the IPv4 address they reach, own ports are refused."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from undolog.decisions.egress import EgressPolicy, rule

DEFAULT = EgressPolicy.build()


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "127.9.9.9", "::1", "169.254.169.254", "fe80::1", "0.0.0.0", "::", "224.0.0.1", "::ffff:127.0.0.1"],
)
def test_the_defaults_refuse_loopback_link_local_and_the_like(address: str) -> None:
    assert DEFAULT.refusal(address, 80) is not None


@pytest.mark.parametrize("address", ["10.1.2.3", "192.168.1.1", "203.0.113.9", "2001:db8::1"])
def test_other_addresses_are_allowed_by_default(address: str) -> None:
    assert DEFAULT.refusal(address, 443) is None


def test_allow_lists_narrow_and_deny_wins() -> None:
    policy = EgressPolicy.build(allow=["10.0.0.0/8:443"], deny=["10.9.0.0/16"])
    assert policy.refusal("10.1.0.1", 443) is None
    assert "allowed: 10.0.0.0/8:443" in (policy.refusal("10.1.0.1", 80) or "")
    assert "denied: 10.9.0.0/16" in (policy.refusal("10.9.0.1", 443) or "")
    assert "allowed" in (policy.refusal("192.168.0.1", 443) or "")


def test_loopback_opt_in_keeps_the_operators_own_ports_refused() -> None:
    policy = EgressPolicy.build(allow_loopback=True, own_addresses=["10.0.0.5"], own_ports=[8080, 9090])
    assert policy.refusal("127.0.0.1", 5000) is None
    assert policy.refusal("127.0.0.1", 9090) is not None
    assert policy.refusal("10.0.0.5", 8080) is not None
    assert policy.refusal("10.0.0.5", 443) is None
    assert policy.refusal("169.254.169.254", 80) is not None  # never: metadata services


def test_rules_parse_and_refuse_nonsense() -> None:
    assert str(rule("10.0.0.0/8:443,8443")) == "10.0.0.0/8:443,8443"
    assert str(rule("[fd00::/8]:443")) == "fd00::/8:443"
    for bad in ("10.0.0.0/8:0", "not-an-address", "10.0.0.0/8:http"):
        with pytest.raises(ValueError, match=r"CIDR|ports"):
            rule(bad)


@given(st.ip_addresses(v=4), st.integers(1, 65535))
def test_a_mapped_address_is_judged_as_the_address_it_reaches(address: ipaddress.IPv4Address, port: int) -> None:
    mapped = f"::ffff:{address}"
    assert (DEFAULT.refusal(mapped, port) is None) == (DEFAULT.refusal(str(address), port) is None)
