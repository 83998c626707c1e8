"""The seam between the operator and participants: a prepared call in, an outcome out.

A transport sends one attempt of one call and reports what came back in protocol-neutral
terms (decisions.retry.CallOutcome). HTTP is one transport (calls.http), an MCP server's
tool another (calls.mcp); the unit tests of the operator layer use a fake one. Retries,
recording and timing live above it (calls.runner).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from undolog.api import Limits
from undolog.decisions.outage import DEFAULT_OUTAGE_BUDGET_SECONDS
from undolog.decisions.retry import CallOutcome


@dataclass(frozen=True)
class Target:
    """Where and how a registered function is called."""

    url: str
    timeout_seconds: float  # a limit on the whole attempt, whatever the participant sends
    ca_bundle: str | None = None
    participant: str = ""  # whose pace and outages these calls share: the Webhook, <namespace>/<name>
    limits: Limits | None = None
    outage_budget_seconds: float = DEFAULT_OUTAGE_BUDGET_SECONDS
    # Secret header values: never logged, never copied to status or events.
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    signing_keys: tuple[str, ...] = field(default=(), repr=False)  # Standard Webhooks secrets, in order
    client_certificate: tuple[bytes, bytes] | None = field(default=None, repr=False)  # PEM chain and key (mTLS)
    tool: str | None = None  # an MCP server's tool: the call is its tools/call (calls.mcp), not a POST of the body

    @property
    def protocol(self) -> str:
        """Which transport carries the call."""
        return MCP if self.tool is not None else HTTP


@dataclass(frozen=True)
class PreparedCall:
    """One attempt, ready to send: the target, the resolved arguments, the wire headers."""

    target: Target
    body: dict[str, Any]
    headers: dict[str, str]
    # Told when the attempt leaves, its participant slot taken: time spent queued behind the
    # operator's own calls is not the participant's.
    leaving: Callable[[], None] = field(default=lambda: None, repr=False, compare=False)


HTTP, MCP = "http", "mcp"


class Transport(Protocol):
    async def send(self, call: PreparedCall) -> CallOutcome:
        """Send one attempt; never raises for what the participant or the network did."""
        ...

    async def close(self) -> None: ...


@dataclass
class Transports:
    """The transports by protocol, as one: each call goes by its target's. Each is made on its
    first call (the MCP transport loads the `mcp` package, which an operator calling only HTTP
    participants never needs)."""

    makers: dict[str, Callable[[], Transport]]
    made: dict[str, Transport] = field(default_factory=dict)

    async def send(self, call: PreparedCall) -> CallOutcome:
        protocol = call.target.protocol
        transport = self.made.get(protocol)
        if transport is None:
            transport = self.made[protocol] = self.makers[protocol]()
        return await transport.send(call)

    async def close(self) -> None:
        for transport in self.made.values():
            await transport.close()
