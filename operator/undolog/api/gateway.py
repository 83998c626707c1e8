"""The MCP gateway's configuration (`undolog mcp --config FILE`, a ConfigMap in the chart): its
upstream MCP servers, and for each tool what undoes it.

A file, not a custom resource: it says which processes the gateway starts and where it
connects, as a proxy's configuration does, and it is read once at start by the one Deployment
that uses it. Unknown fields are refused, naming the field (a misspelt `compensation` would
otherwise leave a tool unmapped and refused).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any, Literal, Self

from pydantic import ConfigDict, Field, model_validator

from undolog.api.common import DNS_LABEL, DNS_SUBDOMAIN, JsonObject, Model

TOOL_NAME = r"^[A-Za-z0-9_.-]{1,128}$"  # MCP's tool names (2025-11-25)
QUALIFIED_TOOL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\.[A-Za-z0-9_.-]{1,128}$"


class Strict(Model):
    model_config = Model.model_config | ConfigDict(extra="forbid")


class OnClose(StrEnum):
    """What a session's open saga becomes when the session ends without a commit."""

    ABORT = "abort"
    COMMIT = "commit"


class Unmapped(StrEnum):
    """A tool that is neither mapped nor read-only."""

    REFUSE = "refuse"
    PASS = "pass"  # called, and recorded as a step with no compensation
    CONFIRM = "confirm"  # the user is asked first (it will not be undone); declined: not called


class Compensations(StrEnum):
    """Where tools' undo comes from besides the configuration's own mappings."""

    CONFIGURED = "configured"  # only the configuration
    FROM_ANNOTATIONS = "fromAnnotations"  # also what servers advertise (SEP-3172 recovery, x-compensation-pair)


class SecretName(Strict):
    name: str = Field(max_length=253, pattern=DNS_SUBDOMAIN, description="A Secret in the gateway's namespace.")


class ClientCredentials(Strict):
    """An OAuth 2 client-credentials grant: the gateway's own access token for the upstream."""

    token_url: str = Field(
        pattern=r"^https?://", max_length=2048, description="The authorization server's token endpoint."
    )
    secret: SecretName = Field(description="Its keys client_id and client_secret (sent as the form's fields).")
    audience: str | None = Field(
        default=None, max_length=2048, description="The `audience` asked for (RFC 8707's resource)."
    )
    scopes: list[str] = Field(default_factory=list, max_length=50)


class UpstreamCredentials(Strict):
    """The gateway's own credential for an upstream (never the agent's): one of these."""

    headers_from: SecretName | None = Field(
        default=None,
        description="A Secret whose keys are HTTP headers sent with every request to the upstream (Authorization: "
        "Bearer ..., an API key), read again at most every 10 s (a rotation shows within it).",
    )
    client_credentials: ClientCredentials | None = Field(
        default=None,
        description="A token from an authorization server, asked for again before it expires, sent as the bearer.",
    )
    client_certificate: SecretName | None = Field(
        default=None,
        description="A Secret with tls.crt and tls.key: the certificate the gateway presents in TLS (and ca.crt, the "
        "authority the upstream's own certificate is checked against besides the system's), read again every 10 s.",
    )

    @model_validator(mode="after")
    def one_kind(self) -> Self:
        given = [self.headers_from, self.client_credentials, self.client_certificate]
        if sum(kind is not None for kind in given) != 1:
            raise ValueError("credentials: exactly one of headersFrom, clientCredentials or clientCertificate")
        return self


class Upstream(Strict):
    """An MCP server the gateway fronts: a streamable HTTP `url`, or a stdio `command`."""

    url: str | None = Field(default=None, pattern=r"^https?://", description="Its streamable HTTP endpoint.")
    command: list[str] | None = Field(default=None, min_length=1, description="A local server: argv, over stdio.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment of the command.")
    credentials: UpstreamCredentials | None = Field(
        default=None,
        description="What the gateway presents to it (an HTTP upstream): its compensations are then served to the "
        "operator by the gateway too (operatorCalls), so an undo carries the same credential.",
    )
    connect_seconds: float = Field(
        default=60,
        gt=0,
        le=3600,
        description="How long a connection to it may take to open (a command's start, its answer to initialize): "
        "past it the gateway does not start, saying so, and an agent's request that needed a new one fails.",
    )
    call_seconds: float = Field(
        default=300,
        gt=0,
        le=86400,
        description="How long a request sent to it (a tool call, a read, a list) may wait for its answer: past "
        "it the gateway asks the server to cancel and the request fails, saying so (a mapped step's effect may have "
        "happened: it is undone with the saga). A longer job is a task (the tasks extension), which answers at once.",
    )

    @model_validator(mode="after")
    def one_way_in(self) -> Self:
        if (self.url is None) == (self.command is None):
            raise ValueError("an upstream needs exactly one of url or command")
        if self.credentials is not None and self.url is None:
            raise ValueError("credentials are for an upstream reached by url; give a command its env")
        return self


class Compensation(Strict):
    """What undoes a tool call: another MCP tool (`tool: tracker.close_issue`, called by the
    operator through the Webhook named `tracker.close-issue`) or a Webhook `function`. String
    args may refer to the call's arguments (`${args.repo}`) and its result (`${output.number}`)."""

    tool: str | None = Field(default=None, pattern=QUALIFIED_TOOL, description="<upstream>.<tool>.")
    function: str | None = Field(default=None, max_length=253, pattern=DNS_SUBDOMAIN, description="A Webhook.")
    version: str = Field(default="v1", max_length=63, pattern=DNS_LABEL)
    args: JsonObject = Field(default_factory=dict)

    @model_validator(mode="after")
    def one_undo(self) -> Self:
        if (self.tool is None) == (self.function is None):
            raise ValueError("a compensation needs exactly one of tool or function")
        return self

    @property
    def webhook(self) -> str:
        """The Webhook the operator calls: a tool's is named `<upstream>.<tool>`, '_' as '-'."""
        if self.function is not None:
            return self.function
        assert self.tool is not None
        return webhook_of(self.tool)


def webhook_of(tool: str) -> str:
    """The Webhook the operator calls a tool by: `<upstream>.<tool>`, lower case, '_' as '-'."""
    return tool.lower().replace("_", "-")


class BeforeImage(Strict):
    """A read-only tool the gateway calls before the mutating one (`tool: files.read_text_file`,
    args as expressions over the call's `args`): its result is the compensation's `before`, the
    state to put back (the undo of an overwrite, an update, a delete)."""

    tool: str = Field(pattern=QUALIFIED_TOOL, description="<upstream>.<tool>, read-only.")
    args: JsonObject = Field(default_factory=dict)


class AfterImage(Strict):
    """What the step leaves (a guard): a read-only tool called right after the call (`tool` and
    `args` default to the before-image's), of whose result `holds` (CEL over `state` and `args`) selects
    what must still hold when the step is undone. The operator reads it again before the undo
    (through the Webhook named after the tool) and, if the selection changed, halts the entry as
    Conflict instead of overwriting the later change."""

    tool: str | None = Field(default=None, pattern=QUALIFIED_TOOL, description="<upstream>.<tool>, read-only.")
    args: JsonObject | None = Field(default=None, description="Expressions over the call's `args`.")
    holds: str | None = Field(
        default=None,
        max_length=4096,
        description="CEL over `state` (the read's result) and `args` (the call's), e.g. `state.content`; absent: "
        "the whole result.",
    )

    @model_validator(mode="after")
    def args_with_tool(self) -> Self:
        if self.args is not None and self.tool is None:
            raise ValueError("after.args are the arguments of after.tool: name the tool too")
        return self


class ObjectMapping(Strict):
    """The Kubernetes object a tool changes, undone natively by the operator: read over the API
    before and after the call, and on an abort put back on the fields the call changed, only
    where nothing changed them since. Each field is text with expressions over the call's
    `args` (`${args.name}`, `${has(args.namespace) ? args.namespace : 'default'}`)."""

    resource: str = Field(
        max_length=1024, description="As kubectl names it: deployment, deployments.apps, cm (an expression, or text)."
    )
    name: str = Field(max_length=1024, description="The object's name.")
    namespace: str | None = Field(
        default=None,
        max_length=1024,
        description="Its namespace; absent: the saga's (ignored for a cluster-scoped one).",
    )
    service_account: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="Read and undo as this ServiceAccount of the saga's namespace; absent: as the caller (its "
        "ServiceAccount, or its OAuth identity as the cluster names it).",
    )
    changes: Any = Field(
        default=None,
        description="The shape of what the call writes, as a merge patch (an expression such as "
        "`${args.patchData}`, or an object such as {spec: {replicas: 0}}): only those fields are undone, so another "
        "writer's change to other fields while the call ran is kept; absent or null: every field that differs.",
    )


class ToolRule(Strict):
    """One tool: read-only (passes straight through), or its compensation (and what to read
    before the call, for it, and after it, for its guard)."""

    read_only: bool = False
    compensation: Compensation | None = None
    before: BeforeImage | None = None
    after: AfterImage | None = None
    kubernetes: ObjectMapping | None = Field(
        default=None, description="The Kubernetes object it changes, undone natively (instead of a compensation)."
    )
    confirm: bool = Field(
        default=False, description="Ask the user before the call (it will not be undone); declined: not called."
    )

    @property
    def guard_read(self) -> BeforeImage | None:
        """The read of its guard (right after the call, and again before the undo): the after
        image's own tool, else the before-image's; None without a guard."""
        if self.after is None:
            return None
        if self.after.tool is not None:
            return BeforeImage(tool=self.after.tool, args=self.after.args or {})
        return self.before

    @model_validator(mode="after")
    def one_kind(self) -> Self:
        undone = self.compensation is not None or self.kubernetes is not None
        if self.read_only == (undone or self.confirm):
            raise ValueError("a tool is either readOnly: true, has a compensation (or kubernetes), or confirm: true")
        if self.confirm and undone:
            raise ValueError("a tool with a compensation can be undone: confirm: true is for those that cannot")
        if self.kubernetes is not None and (self.compensation or self.before or self.after):
            raise ValueError(
                "kubernetes is the tool's whole undo: it reads the object itself (no compensation, before or after)"
            )
        return self


class OperatorCalls(Strict):
    """The operator's calls of the compensation tools of stdio upstreams, which have no URL of
    their own: the gateway serves them at <url>/upstreams/<upstream>/mcp (its HTTP port) and
    keeps a Webhook for each, named as the compensation names it."""

    url: str | None = Field(
        default=None, pattern=r"^https?://", description="Where the operator reaches this gateway (its Service)."
    )
    signing_secret: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="A Secret in `namespace` (labelled undolog.io/webhook-headers=true) whose keys sign the "
        "operator's calls (the Webhooks' spec.signing); a call not signed with one is refused 401. Without it any "
        "client that reaches the port can call those tools.",
    )


class Issuer(Strict):
    """An OAuth authorization server whose JWT access tokens the gateway accepts."""

    issuer: str = Field(pattern=r"^https?://", max_length=2048, description="Its `iss`, exactly as in its tokens.")
    jwks_uri: str | None = Field(
        default=None,
        pattern=r"^https?://",
        max_length=2048,
        description="Where it publishes its keys; default: its metadata's jwks_uri (/.well-known/openid-configuration, "
        "else /.well-known/oauth-authorization-server).",
    )
    algorithms: list[str] = Field(
        default_factory=lambda: ["RS256", "ES256", "PS256", "EdDSA"],
        min_length=1,
        description="The signature algorithms accepted (never `none`, never HMAC).",
    )

    @model_validator(mode="after")
    def asymmetric(self) -> Self:
        refused = [a for a in self.algorithms if a.lower() == "none" or a.upper().startswith("HS")]
        if refused:
            raise ValueError(f"algorithms: {', '.join(refused)} refused: only public-key signatures prove an issuer")
        return self


class Auth(Strict):
    """Who may call the gateway: bearer JWTs of configured issuers, and the cluster's own
    ServiceAccount tokens, each issued for `resource` (the gateway's audience)."""

    resource: str = Field(
        pattern=r"^https?://",
        max_length=2048,
        description="The gateway's own resource URL (https://undolog-gateway.agents.svc/mcp): a token's audience "
        "must name it (RFC 8707), and the Protected Resource Metadata says it.",
    )
    issuers: list[Issuer] = Field(default_factory=list, max_length=20)
    service_accounts: bool = Field(
        default=False,
        description="Accept the cluster's ServiceAccount tokens issued for `resource` (a projected token with that "
        "audience), checked by TokenReview.",
    )
    clock_skew_seconds: int = Field(default=30, ge=0, le=300, description="Allowed on exp and nbf.")

    @model_validator(mode="after")
    def some_way_in(self) -> Self:
        if not self.issuers and not self.service_accounts:
            raise ValueError("auth: name issuers, or serviceAccounts: true, or both (or `auth: none`)")
        return self


class Tenancy(Strict):
    """Which namespace a caller's sagas go to: its principal in `table`, else what `rule` gives,
    else a ServiceAccount's own namespace, else the gateway's `namespace`."""

    table: dict[str, str] = Field(
        default_factory=dict,
        description="By principal name (<issuer>#<subject>, system:serviceaccount:<ns>:<name>), its namespace.",
    )
    rule: str | None = Field(
        default=None,
        max_length=4096,
        description="CEL over `principal` (name, issuer, subject, claims, serviceAccount) giving the namespace, "
        "e.g. `principal.claims.team`; checked when the configuration loads.",
    )
    namespaces: list[str] = Field(
        default_factory=list,
        max_length=1000,
        description="The namespaces the gateway puts sagas in; a caller whose namespace is not one is refused. "
        "Empty: any the gateway's RBAC lets it write.",
    )

    @model_validator(mode="after")
    def namespaces_named(self) -> Self:
        for where, namespace in [
            *(("table." + k, v) for k, v in self.table.items()),
            *(("namespaces", n) for n in self.namespaces),
        ]:
            if not re.fullmatch(DNS_LABEL, namespace):
                raise ValueError(f"tenancy.{where}: {namespace!r} is not a namespace name")
        return self


class PolicyAction(StrEnum):
    ALLOW = "allow"  # the call goes on as the mapping says; later rules are not asked
    DENY = "deny"  # refused, naming the rule; nothing is sent upstream
    CONFIRM = "confirm"  # the user is asked first (as confirm: true asks), then it goes on as mapped


class Policy(Strict):
    """One rule: when `when` (CEL over `principal`, `tool` and `args`) holds, `action`. The first
    rule that holds decides; none: the mapping decides alone."""

    name: str = Field(max_length=63, pattern=DNS_LABEL, description="Named in a refusal and in the log.")
    when: str = Field(
        max_length=4096,
        description="CEL: `principal` (name, issuer, subject, claims, serviceAccount; null without auth), `tool` "
        "(<upstream>.<tool>), `args` (the call's arguments). A rule that cannot be evaluated refuses the call.",
    )
    action: PolicyAction


class CallerLimits(Strict):
    """Per caller (its principal; callers without one share one), in each gateway replica."""

    calls_per_second: float | None = Field(default=None, gt=0, description="tools/call requests a second.")
    burst: int | None = Field(default=None, ge=1, description="Calls at once past the rate; default the rate.")
    open_sagas: int | None = Field(
        default=None, ge=1, description="Sagas open at once (not ended by a commit or an abort) in its namespace."
    )


AUTH_UNSAID = (
    "auth: say who may call the gateway: `auth: {resource: <its URL>, issuers: [...], serviceAccounts: true}`, or "
    "`auth: none` to serve anyone who reaches its port"
)


class GatewayConfig(Strict):
    namespace: str = Field(max_length=63, pattern=DNS_LABEL, description="Where sessions' sagas are created.")
    org: str | None = Field(default=None, max_length=63, description="spec.orgId of the sagas.")
    deadline_seconds: int | None = Field(
        default=3600, ge=1, description="A session's saga is aborted by the operator past it (the gateway gone)."
    )
    on_close: OnClose = OnClose.ABORT
    unmapped: Unmapped = Unmapped.REFUSE
    compensations: Compensations = Compensations.CONFIGURED
    idle_seconds: float = Field(default=1800, gt=0, description="A session with no request for this long ends.")
    upstreams: dict[str, Upstream] = Field(min_length=1)
    tools: dict[str, ToolRule] = Field(default_factory=dict, description="Keyed <upstream>.<tool>.")
    operator_calls: OperatorCalls = Field(default_factory=OperatorCalls)
    tenancy: Tenancy = Field(default_factory=Tenancy)
    policies: list[Policy] = Field(default_factory=list, max_length=200, description="Asked in order, per call.")
    limits: CallerLimits = Field(default_factory=CallerLimits)
    auth: Auth | Literal["none"] | None = Field(
        default=None,
        description="Who may call it over HTTP, which it refuses to serve without it: `none` serves anyone who "
        "reaches the port (said in the log). Over stdio the caller is the process that started it.",
    )

    @model_validator(mode="after")
    def policies_named_once(self) -> Self:
        names = [policy.name for policy in self.policies]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"policies: each name once ({', '.join(repeated)} repeated)")
        return self

    @model_validator(mode="after")
    def known_upstreams(self) -> Self:
        for name in self.upstreams:
            if not re.fullmatch(DNS_LABEL, name):
                raise ValueError(f"upstreams.{name}: a name of lower-case letters, digits and '-'")
        for tool, rule in self.tools.items():
            if not re.fullmatch(QUALIFIED_TOOL, tool):
                raise ValueError(f"tools.{tool}: a key of the form <upstream>.<tool>, e.g. tracker.create_issue")
            if rule.before is not None and rule.compensation is None:
                raise ValueError(f"tools.{tool}.before: a before-image is read only for a compensation")
            if rule.after is not None and rule.compensation is None:
                raise ValueError(f"tools.{tool}.after: a guard is read only for a compensation")
            if rule.after is not None and rule.after.tool is None and rule.before is None:
                raise ValueError(
                    f"tools.{tool}.after: name its tool (or give the mapping a before-image to read again)"
                )
            before = rule.before.tool if rule.before else None
            after = rule.after.tool if rule.after else None
            for named in (tool, rule.compensation.tool if rule.compensation else None, before, after):
                if named is not None and named.split(".", 1)[0] not in self.upstreams:
                    known = ", ".join(sorted(self.upstreams))
                    raise ValueError(f"tools.{tool}: {named!r} names no upstream (upstreams: {known})")
        return self
