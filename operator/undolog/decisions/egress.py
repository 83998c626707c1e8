"""Where the operator may call: an address and port allowed or refused (pure).

Whoever may create a Webhook and a Saga decides where the operator sends requests and can read
the answers back, so by default the operator never calls loopback, link-local (cloud metadata
services), unspecified, multicast or broadcast addresses, nor its own ports. The check is made
on the address actually connected to, after name resolution (undolog.calls.http), so a name
that resolves to a refused address is refused too.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

LOOPBACK = ("127.0.0.0/8", "::1/128")
ALWAYS_DENIED = (
    "169.254.0.0/16",  # link-local: cloud metadata services
    "fe80::/10",
    "0.0.0.0/8",  # "this host": connecting to it reaches loopback
    "::/128",
    "224.0.0.0/4",  # multicast
    "ff00::/8",
    "255.255.255.255/32",
)
EVERYWHERE = ("0.0.0.0/0", "::/0")


@dataclass(frozen=True)
class Rule:
    """A network, and the ports it applies to (all ports when empty)."""

    network: Network
    ports: frozenset[int] = frozenset()

    def matches(self, address: Address, port: int) -> bool:
        return (
            address.version == self.network.version
            and address in self.network
            and (not self.ports or port in self.ports)
        )

    def __str__(self) -> str:
        ports = ",".join(str(p) for p in sorted(self.ports))
        return f"{self.network}" + (f":{ports}" if ports else "")


def rule(text: str) -> Rule:
    """`CIDR` or `CIDR:PORT[,PORT...]`, e.g. `10.0.0.0/8:443,8443` or `[fd00::/8]:443`."""
    text = text.strip()
    ports = ""
    if text.startswith("["):  # [v6-cidr]:ports
        network, _, rest = text[1:].partition("]")
        ports = rest.removeprefix(":")
    elif text.count(":") == 1:  # v4-cidr:ports
        network, _, ports = text.partition(":")
    else:
        network = text
    try:
        parsed = ipaddress.ip_network(network, strict=False)
        port_set = frozenset(int(p) for p in ports.split(",") if p)
    except ValueError as error:
        raise ValueError(f"{text!r} is not CIDR[:PORT,...] ({error})") from None
    if any(not 1 <= p <= 65535 for p in port_set):
        raise ValueError(f"{text!r}: ports are 1 to 65535")
    return Rule(parsed, port_set)


def rules(texts: Iterable[str]) -> tuple[Rule, ...]:
    return tuple(rule(t) for t in texts)


def normalized(address: str) -> Address:
    """An address as connected to; an IPv4-mapped IPv6 address is the IPv4 address it maps."""
    parsed = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        return parsed.ipv4_mapped
    return parsed


@dataclass(frozen=True)
class EgressPolicy:
    """Deny wins: an address is called only if an allow rule matches and no deny rule does."""

    allow: tuple[Rule, ...] = field(default_factory=lambda: rules(EVERYWHERE))
    deny: tuple[Rule, ...] = field(default_factory=lambda: rules(LOOPBACK + ALWAYS_DENIED))

    @classmethod
    def build(
        cls,
        *,
        allow: Iterable[str] = (),
        deny: Iterable[str] = (),
        allow_loopback: bool = False,
        own_addresses: Iterable[str] = (),
        own_ports: Iterable[int] = (),
    ) -> EgressPolicy:
        """The default denials, plus `deny`, plus the operator's own ports on its own addresses
        (and on loopback); loopback itself only with `allow_loopback`."""
        defaults = ALWAYS_DENIED if allow_loopback else LOOPBACK + ALWAYS_DENIED
        ports = frozenset(p for p in own_ports if p)
        own = [Rule(ipaddress.ip_network(a), ports) for a in {*LOOPBACK, *own_addresses}] if ports else []
        return cls(
            allow=rules(allow) or rules(EVERYWHERE),
            deny=rules(defaults) + rules(deny) + tuple(own),
        )

    def refusal(self, address: str, port: int) -> str | None:
        """Why a connection to address:port is refused; None when it is allowed."""
        try:
            parsed = normalized(address)
        except ValueError:
            return f"{address} is not an IP address"
        denied = next((r for r in self.deny if r.matches(parsed, port)), None)
        if denied is not None:
            return f"{parsed}:{port} is refused by the operator's egress policy (denied: {denied})"
        if not any(r.matches(parsed, port) for r in self.allow):
            allowed = ", ".join(str(r) for r in self.allow)
            return f"{parsed}:{port} is refused by the operator's egress policy (allowed: {allowed})"
        return None
