"""Saga: one session of multi-step work and its phase."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import ClassVar

from pydantic import Field, JsonValue

from undolog.api.common import (
    LABEL_VALUE,
    MAX_DEPENDENCIES,
    MAX_MESSAGE,
    MAX_SAGA_NAME,
    STEP_NAME,
    Call,
    Condition,
    EntryName,
    JsonObject,
    Model,
    Plural,
    Resource,
    StepName,
    UserFacing,
)

# A deadline later than this is no deadline: start + 10^12 s is past year 9999, which Python's
# datetime cannot hold (OverflowError on every event of the saga).
MAX_DEADLINE_SECONDS = 100 * 365 * 24 * 3600


class StepType(StrEnum):
    COMPENSATABLE = "Compensatable"
    PIVOT = "Pivot"
    RETRIABLE = "Retriable"


class OnFailure(StrEnum):
    HALT = "Halt"
    CONTINUE = "Continue"


class Outcome(StrEnum):
    COMMIT = "Commit"
    ABORT = "Abort"


class SagaPhase(StrEnum):
    ACTIVE = "Active"
    COMPLETED = "Completed"
    FAILED = "Failed"
    COMPENSATING = "Compensating"
    COMPENSATED = "Compensated"
    HALTED = "Halted"
    REWINDING = "Rewinding"  # undoing the entries above spec.rewind.toPosition, then Active again


# Nothing is left to do: the saga is finished (Ready), and retention may delete it.
TERMINAL: frozenset[SagaPhase] = frozenset({SagaPhase.COMPLETED, SagaPhase.COMPENSATED})


class RewindState(StrEnum):
    REWINDING = "Rewinding"
    DONE = "Done"
    REFUSED = "Refused"


class SagaReason(StrEnum):
    """Why the saga is in its phase (status.reason, the conditions' reasons, Event reasons)."""

    STARTED = "Started"
    COMMITTED = "Committed"
    ABORTED = "Aborted"
    DELETED = "Deleted"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    STEP_FAILED = "StepFailed"
    STEP_NOT_REGISTERED = "StepNotRegistered"
    INVALID_REFERENCE = "InvalidReference"
    FORWARD_RECOVERY_EXHAUSTED = "ForwardRecoveryExhausted"
    ABORT_REFUSED = "AbortRefused"
    COMPENSATING = "Compensating"
    LATE_ENTRY = "LateEntry"
    COMPENSATED = "Compensated"
    COMPENSATION_FAILED = "CompensationFailed"
    FUNCTION_NOT_FOUND = "FunctionNotFound"
    PARTICIPANT_UNAVAILABLE = "ParticipantUnavailable"
    CONFLICT = "Conflict"  # a compensation would overwrite a later change: a person decides
    ENTRY_LOST = "EntryLost"
    UNOWNED_ENTRIES = "UnownedEntries"
    ENTRY_SKIPPED = "EntrySkipped"
    RETRY_REQUESTED = "RetryRequested"
    LEDGER_WRITE_REFUSED = "LedgerWriteRefused"
    REWINDING = "Rewinding"
    REWOUND = "Rewound"
    REWIND_REFUSED = "RewindRefused"


MAX_STEPS = 50
MAX_LOST_ENTRIES = 100  # named in status.lostEntries; more are counted (lostEntriesOmitted)


# CEL on spec.steps. Ranks Compensatable=0, Pivot=1, Retriable=2 must never go down. Each rule
# names the first step that breaks it. Two-variable comprehensions (Kubernetes >= 1.32) keep
# the cost estimate within budget where map()/filter() results would not.
def _rank(step: str) -> str:
    return f"({step}.type == 'Compensatable' ? 0 : ({step}.type == 'Pivot' ? 1 : 2))"


_OUT_OF_ORDER = f"i > 0 && {_rank('self[i - 1]')} > {_rank('s')}"
_BAD_DEPENDENCY = "has(s.dependsOn) && s.dependsOn.exists(d, !self.exists(j, t, j < i && t.name == d))"
_ORDER_HINT = "order spec.steps as Compensatable steps, then at most one Pivot, then Retriable steps"
_STEP_RULES: list[dict[str, JsonValue]] = [
    {
        "rule": "self.all(i, s, self.all(j, t, j >= i || t.name != s.name))",
        "messageExpression": (
            "'step name \"' + self.transformList(i, s, self.exists(j, t, j < i && t.name == s.name), s.name)[0]"
            " + '\" is used more than once: spec.steps[].name must be unique'"
        ),
    },
    {
        "rule": "self.filter(s, s.type == 'Pivot').size() <= 1",
        "messageExpression": (
            "'step \"' + self.transformList(i, s, s.type == 'Pivot', s.name)[1] + '\" is a second Pivot:"
            " a saga has at most one Pivot step (spec.steps[].type)'"
        ),
    },
    {
        "rule": f"self.all(i, s, !({_BAD_DEPENDENCY}))",
        "messageExpression": (
            f"self.transformList(i, s, {_BAD_DEPENDENCY}, 'step \"' + s.name + '\" dependsOn '"
            f" + s.dependsOn.filter(d, !self.exists(j, t, j < i && t.name == d))[0]"
            f" + ', which is not a step before it: spec.steps[].dependsOn names earlier steps')[0]"
        ),
    },
    {
        "rule": f"self.all(i, s, !({_OUT_OF_ORDER}))",
        "messageExpression": (
            f"self.transformList(i, s, {_OUT_OF_ORDER}, 'step \"' + s.name + '\" (' + s.type + ') comes after"
            f" step \"' + self[i - 1].name + '\" (' + self[i - 1].type + ')')[0] + ': {_ORDER_HINT}'"
        ),
    },
]


def _at_creation(rule: dict[str, JsonValue]) -> JsonValue:
    """The rule checked when the saga is created and not at every write after: spec.steps cannot
    change once it exists (the spec's own rule), and the quadratic rules, evaluated again at each
    status write, cost the apiserver a quarter of a second per write of a 50-step saga."""
    return {**rule, "rule": f"oldSelf.hasValue() || ({rule['rule']})", "optionalOldSelf": True}


STEP_RULES: list[JsonValue] = [_at_creation(rule) for rule in _STEP_RULES]


# On the whole Saga: setting Abort after the pivot committed is refused at admission. It is a
# transition rule (oldSelf), so the operator's own status writes are never refused by it.
ROOT_RULES: list[JsonValue] = [
    {
        # Entries are named <saga>-<position> and spec.saga holds at most this many characters:
        # a longer saga could never register a step (refused here rather than retried forever).
        "rule": f"size(self.metadata.name) <= {MAX_SAGA_NAME}",
        "message": (
            f"metadata.name may have at most {MAX_SAGA_NAME} characters: a saga's UndoEntries are named "
            "<saga>-<position> within Kubernetes' 253"
        ),
        "fieldPath": ".metadata.name",
    },
    {
        "rule": "!has(self.spec.outcome) || self.spec.outcome != 'Abort'"
        " || (has(oldSelf.spec.outcome) && oldSelf.spec.outcome == 'Abort')"
        " || !has(self.status) || !has(self.status.pivotCommitted) || !self.status.pivotCommitted",
        "message": (
            "spec.outcome Abort is refused: the saga's Pivot step has committed, so it can only go forward "
            "(its Retriable steps are retried until they succeed)"
        ),
    },
    {
        # A rewind may not undo a committed Pivot (steps are positions 1..n the first time round).
        "rule": "!has(self.spec.rewind) || (has(oldSelf.spec.rewind) && oldSelf.spec.rewind == self.spec.rewind)"
        " || !has(self.spec.steps) || !has(self.status) || !has(self.status.pivotCommitted)"
        " || !self.status.pivotCommitted || !self.spec.steps.exists(s, s.type == 'Pivot')"
        " || self.spec.rewind.toPosition > self.spec.steps.transformList(i, s, s.type == 'Pivot', i)[0]",
        # (string() of a number is beyond the CEL cost budget here: the position is not quoted)
        "messageExpression": (
            "'spec.rewind.toPosition is refused: it would undo the committed Pivot step \"'"
            " + self.spec.steps[self.spec.steps.transformList(i, s, s.type == 'Pivot', i)[0]].name"
            " + '\"; rewind to its position or above it'"
        ),
    },
]


class Rewind(Model):
    """A request to undo the entries above a stack position and then go on from there."""

    to_position: int = Field(
        ge=0,
        le=1_000_000,
        description="Undo (newest first) every entry above this stackPosition; 0 undoes all and keeps the saga.",
    )
    reason: str = Field(
        min_length=1,
        max_length=1024,
        description="Why; kept in status.rewind and an Event. A new request must differ from the last one.",
    )


class RewindStatus(Model):
    """The last rewind: what was asked, and how far it got."""

    to_position: int = Field(ge=0, le=1_000_000, description="spec.rewind.toPosition of the request.")
    reason: str = Field(max_length=1024, description="spec.rewind.reason of the request.")
    state: RewindState = Field(description="Rewinding, Done, or Refused (message says why).")
    message: str | None = Field(default=None, max_length=MAX_MESSAGE, description="What happened.")
    undone: int = Field(default=0, ge=0, description="Entries compensated (or skipped) by this rewind.")
    started_at: datetime | None = Field(default=None, description="When the rewind started.")
    finished_at: datetime | None = Field(default=None, description="When the saga was handed back.")

    def answers(self, request: Rewind) -> bool:
        return (self.to_position, self.reason) == (request.to_position, request.reason)


class StepObject(UserFacing):
    """The Kubernetes object a step's action changes, undone natively by the operator instead of
    by a compensation call: read before the action and after it, as the ServiceAccount named."""

    resource: str = Field(
        max_length=253, description="As kubectl names it: deployment, configmap, cm, deployments.apps."
    )
    name: str = Field(max_length=253, description="The object's name.")
    namespace: str | None = Field(
        default=None, max_length=63, description="Its namespace; absent: the saga's (ignored for a cluster-scoped one)."
    )
    changes: JsonObject | None = Field(
        default=None,
        description="The shape of what the action writes, as a merge patch (e.g. {spec: {replicas: 0}}): only those "
        "fields are undone; absent: every field that differs.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    service_account: str = Field(
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="The ServiceAccount of the saga's namespace the object is read and undone as: the saga's "
        "creator, or one its creator may impersonate (checked at admission).",
    )


class Step(Model):
    """One step of an orchestrated saga: a forward call and, if Compensatable, its undo (a call,
    or the Kubernetes object it changes, undone natively)."""

    name: str = Field(
        max_length=63,
        pattern=STEP_NAME,
        description="Unique within the saga; lower-case letters, digits, '-' and '_'.",
    )
    type: StepType = Field(
        default=StepType.COMPENSATABLE,
        description=(
            "Compensatable: undone on failure. Pivot: the point of no return (at most one). "
            "Retriable: after the pivot, retried until it succeeds, never undone."
        ),
    )
    action: Call = Field(description="The forward call.")
    compensation: Call | None = Field(
        default=None,
        description="The call that undoes the action; required for Compensatable (unless kubernetes), forbidden "
        "otherwise.",
    )
    kubernetes: StepObject | None = Field(
        default=None,
        description="The Kubernetes object the action changes, undone natively instead of by a compensation call "
        "(Compensatable steps).",
    )
    depends_on: list[StepName] | None = Field(
        default=None,
        max_length=MAX_DEPENDENCIES,
        description=(
            "Earlier steps this one depends on: they are undone only after this one is. Absent: it depends "
            "on every earlier step (strict newest-first). [] : on none, so it may be undone alongside others."
        ),
    )

    model_config = Model.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "self.type != 'Compensatable' || has(self.compensation) || has(self.kubernetes)",
                    "messageExpression": (
                        "'step \"' + self.name + '\" is Compensatable and needs spec.steps[].compensation"
                        " or spec.steps[].kubernetes (or set its type to Pivot or Retriable)'"
                    ),
                },
                {
                    "rule": "!has(self.kubernetes) || (self.type == 'Compensatable' && !has(self.compensation))",
                    "messageExpression": (
                        "'step \"' + self.name + '\": spec.steps[].kubernetes is its undo: the step is Compensatable"
                        " and has no spec.steps[].compensation'"
                    ),
                },
                {
                    "rule": "self.type == 'Compensatable' || !has(self.compensation)",
                    "messageExpression": (
                        "'step \"' + self.name + '\" is ' + self.type + ' and cannot have a compensation:"
                        " remove spec.steps[].compensation or make the step Compensatable'"
                    ),
                },
            ]
        }
    }


class Effect(UserFacing):
    """A call made only if the saga commits (transactional outbox): an email, a notification."""

    name: str = Field(max_length=63, pattern=STEP_NAME, description="Unique within the saga.")
    call: Call = Field(description="Sent after the saga is Completed, never after an abort.")


class EffectDeliveryState(StrEnum):
    PENDING = "Pending"
    DELIVERED = "Delivered"
    FAILED = "Failed"


class EffectStatus(Model):
    """Delivery of one post-commit effect."""

    name: str = Field(max_length=63, description="The effect's name in spec.effects.")
    state: EffectDeliveryState = Field(default=EffectDeliveryState.PENDING, description="Pending, Delivered or Failed.")
    attempts: int = Field(default=0, ge=0, description="Calls made so far.")
    last_error: str | None = Field(default=None, max_length=MAX_MESSAGE, description="Last failure, if any.")
    delivered_at: datetime | None = Field(default=None, description="When the participant accepted it.")


class LostEntry(Model):
    """An UndoEntry the operator can no longer compensate: deleted by hand, or unreadable."""

    name: str = Field(max_length=253, description="The UndoEntry's name.")
    stack_position: int | None = Field(default=None, ge=0, description="Its place in the undo stack, if known.")
    step: str | None = Field(default=None, max_length=63, description="Its step, if known.")
    function: str | None = Field(default=None, max_length=253, description="Its compensation function, if any.")
    why: str = Field(max_length=1024, description="What happened to it.")
    acknowledged: bool = Field(
        default=False, description="A person retried the saga knowing this entry's effect may remain."
    )


class Backoff(UserFacing):
    """Retry timing for transient failures: exponential with full jitter."""

    initial_milliseconds: int = Field(default=100, ge=1, le=60_000, description="First delay cap.")
    multiplier: float = Field(default=2.0, ge=1, le=10, description="Growth of the delay cap per retry.")
    max_milliseconds: int = Field(default=5000, ge=1, le=600_000, description="Largest delay cap.")
    max_retries: int = Field(default=3, ge=0, le=100, description="Retries after the first attempt.")


class CompensationPolicy(UserFacing):
    """What happens when a compensation fails, and how transient failures are retried."""

    on_failure: OnFailure = Field(
        default=OnFailure.HALT,
        description=(
            "Halt: stop at the first entry that cannot be compensated (lower entries stay Pending). "
            "Continue: compensate the rest, then halt if any failed."
        ),
    )
    backoff: Backoff = Field(default=Backoff(), description="Retry timing for transient failures.")


class SagaSpec(Model):
    """The saga's work and how it is undone."""

    org_id: str | None = Field(
        default=None,
        max_length=63,
        pattern=LABEL_VALUE,
        description="Tenant id, copied to the undolog.io/org label and the Undolog-Org header: a label value.",
    )
    principal: str | None = Field(
        default=None,
        max_length=512,
        description=(
            "Who opened the saga through the MCP gateway, as its token proved: <issuer>#<subject>, or "
            "system:serviceaccount:<namespace>:<name>. Set at creation, never changed."
        ),
    )
    steps: list[Step] | None = Field(
        default=None,
        max_length=MAX_STEPS,
        description=(
            "Orchestrated mode: the operator runs these forward calls in order. "
            "Absent for external sagas, whose UndoEntries are written by an agent."
        ),
        json_schema_extra={"x-kubernetes-validations": STEP_RULES},
    )
    compensation_policy: CompensationPolicy = Field(
        default=CompensationPolicy(), description="Failure handling and retry timing."
    )
    active_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_DEADLINE_SECONDS,
        description="An Active saga older than this fails with reason DeadlineExceeded and is compensated.",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        le=MAX_DEADLINE_SECONDS,
        description=(
            "Delete the saga (and its entries) this long after it is Completed or Compensated, overriding the "
            "operator's default for its phase. A Halted saga is never deleted; once resolved, its clock starts."
        ),
    )
    effects: list[Effect] | None = Field(
        default=None,
        max_length=20,
        description=(
            "Post-commit effects: sent once the saga is Completed, each with Idempotency-Key "
            "<saga uid>:effect:<name>, retried until delivered; never sent for an aborted saga."
        ),
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.all(i, e, self.all(j, f, j >= i || f.name != e.name))",
                    "message": "spec.effects[].name must be unique",
                }
            ]
        },
    )
    outcome: Outcome | None = Field(
        default=None,
        description="Set by the agent or a person: Abort compensates an Active saga; Commit completes it.",
    )
    rewind: Rewind | None = Field(
        default=None,
        description=(
            "Set by the agent, a person or a manifest on an Active saga: undo the entries above toPosition "
            "(phase Rewinding), then hand the saga back (Active). Orchestrated sagas run their later steps again."
        ),
    )

    model_config = Model.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.steps) == has(oldSelf.steps) && "
                    "(!has(self.steps) || self.steps == oldSelf.steps)",
                    "message": "spec.steps is immutable once the saga exists: create a new saga instead",
                },
                {
                    "rule": "!has(oldSelf.outcome) || (has(self.outcome) && self.outcome == oldSelf.outcome)",
                    "message": "spec.outcome cannot be changed or removed once set",
                },
                {
                    "rule": "!has(oldSelf.orgId) || (has(self.orgId) && self.orgId == oldSelf.orgId)",
                    "message": "spec.orgId cannot be changed or removed once set",
                },
                {
                    "rule": "has(self.principal) == has(oldSelf.principal) && "
                    "(!has(self.principal) || self.principal == oldSelf.principal)",
                    "message": "spec.principal is set when the saga is created and never changed",
                },
            ]
        }
    }


class SagaStatus(Model):
    """What the operator has observed and done; written only by the operator."""

    phase: SagaPhase | None = Field(
        default=None,
        description=(
            "Active -> Completed, or Active -> Compensating -> Compensated | Halted (a failure is kept on "
            "the Succeeded condition), or Active -> Rewinding -> Active. Halted waits for a person."
        ),
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        description=(
            "Succeeded, Compensated, Halted, and kstatus' Ready (nothing left to do), Reconciling (the operator "
            "works on it) and Stalled (a person is needed)."
        ),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    failed_step: str | None = Field(default=None, max_length=63, description="The step whose failure failed the saga.")
    reason: SagaReason | None = Field(default=None, description="CamelCase reason of the current phase.")
    message: str | None = Field(default=None, max_length=MAX_MESSAGE, description="Details of the current phase.")
    stack_depth: int = Field(default=0, ge=0, description="UndoEntries registered for this saga.")
    top_position: int | None = Field(
        default=None,
        ge=0,
        description=(
            "The highest stackPosition registered when an external saga Completed (proven by a consistent "
            "LIST); an entry above it was registered after the commit and is never compensated."
        ),
    )
    pivot_committed: bool | None = Field(
        default=None, description="The Pivot step has committed: the saga can only go forward now."
    )
    effects: list[EffectStatus] = Field(
        default_factory=list, max_length=20, description="Delivery of spec.effects after the saga completed."
    )
    rewind: RewindStatus | None = Field(default=None, description="The last rewind (spec.rewind) and its progress.")
    lost_entries: list[LostEntry] = Field(
        default_factory=list,
        max_length=MAX_LOST_ENTRIES,
        description=(
            "Entries deleted by hand or unreadable before they were compensated: their effects may remain. "
            "At most 100; past that, acknowledged and then the lowest entries are left out (lostEntriesOmitted)."
        ),
    )
    unowned_entries: list[EntryName] = Field(
        default_factory=list,
        max_length=MAX_LOST_ENTRIES,
        description=(
            "UndoEntries that name this saga in spec.saga but are not its own (their ownerReferences do not carry "
            "its uid): never compensated as its steps; each says why in its status.reason. At most 100 named."
        ),
    )
    lost_entries_omitted: int = Field(
        default=0,
        ge=0,
        description="Lost entries left out of lostEntries (past its 100); each was named in an EntryLost Event.",
    )
    compensated_count: int = Field(default=0, ge=0, description="UndoEntries compensated or skipped.")
    start_time: datetime | None = Field(default=None, description="When the operator first saw the saga.")
    completion_time: datetime | None = Field(default=None, description="When the saga reached a final phase.")
    expires_at: datetime | None = Field(
        default=None,
        description=(
            "When retention deletes this finished saga (spec.ttlSecondsAfterFinished, else the operator's default "
            "for its phase); absent: kept, unless its namespace holds more finished sagas than the operator keeps."
        ),
    )
    observed_generation: int | None = Field(default=None, ge=0, description="metadata.generation last acted on.")


class Saga(Resource):
    """A Saga object as read from the API."""

    plural: ClassVar[Plural] = "sagas"

    kind: str = "Saga"
    spec: SagaSpec = Field(default_factory=SagaSpec)
    status: SagaStatus = Field(default_factory=SagaStatus)


# The act-as policy of orchestrated sagas: a step's object is read and undone as the
# ServiceAccount it names, so a saga may name only its creator or an account its creator may
# impersonate (the operator writes the step's entry, and could otherwise act for anyone).
SAGA_ACT_AS_POLICY = "undolog-saga-act-as"
_ACCOUNT = "'system:serviceaccount:' + object.metadata.namespace + ':' + s.kubernetes.serviceAccount"
SAGA_ACT_AS_RULE = (
    "request.operation != 'CREATE' || !has(object.spec.steps) || object.spec.steps.all(s, !has(s.kubernetes) || "
    f"request.userInfo.username == {_ACCOUNT} || authorizer.group('').resource('serviceaccounts')"
    ".namespace(object.metadata.namespace).name(s.kubernetes.serviceAccount).check('impersonate').allowed())"
)
SAGA_ACT_AS_MESSAGE = (
    "'Saga ' + object.metadata.name + ': ' + request.userInfo.username + ' may not have the operator act as the "
    "ServiceAccounts its steps name in spec.steps[].kubernetes.serviceAccount: name your own, or grant ' + "
    "request.userInfo.username + ' impersonate on them'"
)
