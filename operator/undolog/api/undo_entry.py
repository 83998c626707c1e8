"""UndoEntry: one step's ledger record, written before the step runs."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, ClassVar

from pydantic import Field, JsonValue, StringConstraints

from undolog.api.common import (
    MAX_ARGS,
    MAX_DEPENDENCIES,
    MAX_MESSAGE,
    MAX_SAGA_NAME,
    MAX_STEP_NAME,
    STEP_NAME,
    Call,
    JsonObject,
    Model,
    Plural,
    Resource,
    StepName,
    UserFacing,
)


class EffectState(StrEnum):
    """The forward effect: Executing means the outcome is unknown (and unknown is compensated).
    Failed may still have done something (a 500 after the work, a timeout), so it is compensated
    too; NotSent is proof that no byte of the call ever left, so there is nothing to undo;
    Abandoned is the server's word that the task it ran for the step ended cancelled or failed
    (the tasks extension), so there is nothing to undo either."""

    PENDING = "Pending"
    EXECUTING = "Executing"
    COMMITTED = "Committed"
    FAILED = "Failed"
    NOT_SENT = "NotSent"
    ABANDONED = "Abandoned"


class EntryState(StrEnum):
    """The compensation: Pending and Running are owed; Compensated and Skipped are settled."""

    PENDING = "Pending"
    RUNNING = "Running"
    COMPENSATED = "Compensated"
    FAILED = "Failed"
    SKIPPED = "Skipped"


class AttemptKind(StrEnum):
    FORWARD = "Forward"
    COMPENSATION = "Compensation"
    EFFECT = "Effect"
    GUARD = "Guard"  # the read of what the step left, before its compensation


class EntryReason(StrEnum):
    """Machine-readable reason of an entry's failure or settlement (status.reason), next to the
    human message (status.lastError or status.skipReason)."""

    # The call could not be made at all: nothing was sent.
    FUNCTION_NOT_FOUND = "FunctionNotFound"
    HEADERS_SECRET_NOT_FOUND = "HeadersSecretNotFound"
    HEADERS_SECRET_NOT_OPTED_IN = "HeadersSecretNotOptedIn"
    HEADERS_SECRET_INVALID = "HeadersSecretInvalid"
    SIGNING_SECRET_NOT_FOUND = "SigningSecretNotFound"
    SIGNING_SECRET_NOT_OPTED_IN = "SigningSecretNotOptedIn"
    SIGNING_SECRET_INVALID = "SigningSecretInvalid"
    CLIENT_CERTIFICATE_NOT_FOUND = "ClientCertificateNotFound"
    CLIENT_CERTIFICATE_NOT_OPTED_IN = "ClientCertificateNotOptedIn"
    CLIENT_CERTIFICATE_INVALID = "ClientCertificateInvalid"
    UNRESOLVED_REFERENCE = "UnresolvedReference"
    ARGUMENTS_TOO_LARGE = "ArgumentsTooLarge"
    TARGET_REFUSED = "TargetRefused"
    # The call was made and failed.
    PERMANENT_FAILURE = "PermanentFailure"
    RETRIES_EXHAUSTED = "RetriesExhausted"
    CERTIFICATE_REJECTED = "CertificateRejected"  # retries exhausted on a certificate not accepted
    PARTICIPANT_UNAVAILABLE = "ParticipantUnavailable"  # did not answer for the Webhook's outage budget
    FORBIDDEN = "Forbidden"  # the API refused the user an object's undo acts as (spec.kubernetes.actAs)
    # What the step left changed since (its guard, or the participant's 409 naming a conflict):
    # the compensation would overwrite later work, so a person decides.
    CONFLICT = "Conflict"
    # Settled without a call.
    NO_COMPENSATION = "NoCompensation"
    NOT_SENT = "NotSent"  # the forward call never left: nothing to undo
    TASK_ENDED = "TaskEnded"  # its server ended the step's task cancelled or failed: nothing to undo
    SKIPPED_BY_PERSON = "SkippedByPerson"
    REGISTERED_AFTER_COMPLETION = "RegisteredAfterCompletion"
    # The entry names no saga the operator can find (kept Pending: the saga may still come).
    SAGA_NOT_FOUND = "SagaNotFound"
    # The saga it names does not own it (ownerReferences): never compensated by that saga.
    NOT_OWNED_BY_SAGA = "NotOwnedBySaga"


# The reasons a call is refused for before any byte leaves (errors.CallNotPossible): the entry's
# status.reason and the Warning Event's reason are these very values, from this one enum.
CALL_REFUSALS: frozenset[EntryReason] = frozenset(
    {
        EntryReason.FUNCTION_NOT_FOUND,
        EntryReason.HEADERS_SECRET_NOT_FOUND,
        EntryReason.HEADERS_SECRET_NOT_OPTED_IN,
        EntryReason.HEADERS_SECRET_INVALID,
        EntryReason.SIGNING_SECRET_NOT_FOUND,
        EntryReason.SIGNING_SECRET_NOT_OPTED_IN,
        EntryReason.SIGNING_SECRET_INVALID,
        EntryReason.CLIENT_CERTIFICATE_NOT_FOUND,
        EntryReason.CLIENT_CERTIFICATE_NOT_OPTED_IN,
        EntryReason.CLIENT_CERTIFICATE_INVALID,
        EntryReason.UNRESOLVED_REFERENCE,
        EntryReason.ARGUMENTS_TOO_LARGE,
        EntryReason.TARGET_REFUSED,
    }
)


class OutputOmission(StrEnum):
    """Why a 2xx answer's body is not the entry's output."""

    ANSWER_TOO_LARGE = "AnswerTooLarge"
    ANSWER_NOT_JSON = "AnswerNotJson"
    OUTPUT_TOO_LARGE = "OutputTooLarge"
    OUTPUT_TOO_DEEP = "OutputTooDeep"


MAX_ATTEMPTS = 10
MAX_OMISSION_MESSAGE = 1024  # outputOmitted.message
UUID = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"

# string(int) has no size bound for CEL's cost estimate, so the position is parsed out of the
# name instead of formatted into it; canonical (no leading zero, no sign), so that "saga-02" cannot
# hold the position of "saga-2": the name is what the API keeps unique.
_POSITION_IN_NAME = "self.metadata.name.substring(size(self.spec.saga) + 1)"
ROOT_RULES: list[JsonValue] = [
    {
        "rule": f"self.metadata.name.startsWith(self.spec.saga + '-')"
        f" && {_POSITION_IN_NAME}.matches('^(0|[1-9][0-9]*)$')"
        f" && int({_POSITION_IN_NAME}) == self.spec.stackPosition",
        "message": (
            "metadata.name must be <spec.saga>-<spec.stackPosition>, the position in decimal without leading"
            " zeros, which makes one entry per saga and position"
        ),
    },
    {
        "rule": "!has(self.status) || !has(self.status.executedAt) || "
        "timestamp(self.status.executedAt) > timestamp(self.spec.registeredAt)",
        "message": "status.executedAt must come after spec.registeredAt: register before execute",
        "fieldPath": ".status.executedAt",
    },
]


# The admission policy (crds/undoentry-owner-policy.yaml, the chart's too): an UndoEntry is taken
# only with an ownerReference to the Saga its spec.saga names, as conventions.owned_by reads it.
# A CRD's own rules cannot see metadata.ownerReferences, a ValidatingAdmissionPolicy can (the UID
# is the SDK's to get right: nothing at admission knows the saga's). An update may not take it off.
OWNER_POLICY = "undolog-undoentry-owner"
OWNER_POLICY_OPT_OUT = "undolog.io/entry-owner-policy"  # a namespace labelled `off` is not checked
_OWNED = (
    "{o}.metadata.?ownerReferences.orValue([]).exists(r, r.apiVersion.startsWith('undolog.io/') && "
    "r.kind == 'Saga' && r.name == {o}.spec.saga && r.uid != '')"
)
OWNER_RULE = (
    f"request.operation == 'CREATE' ? {_OWNED.format(o='object')} : "
    f"(!({_OWNED.format(o='oldObject')}) || {_OWNED.format(o='object')})"
)
OWNER_MESSAGE = (
    "'UndoEntry ' + object.metadata.name + ' names Saga ' + object.spec.saga + ' in spec.saga but is not owned "
    "by it, and an entry its saga does not own is never compensated: add metadata.ownerReferences [{apiVersion: "
    "undolog.io/v1beta1, kind: Saga, name: ' + object.spec.saga + ', uid: <the metadata.uid of that saga>}], "
    "as the SDK does (create the saga first)'"
)


# Entries are served without a status subresource (an outcome is one write that also drops the
# field owners: ledger.EntryStatusRoute), so RBAC on undoentries/status no longer guards the status
# alone: this policy asks the authorizer whether the writer may patch undoentries/status (the
# operator, agents), as the subresource did; anyone else may change the rest (annotations).
STATUS_POLICY = "undolog-undoentry-status"
STATUS_RULE = (
    "(request.operation == 'CREATE' ? !has(object.status) : has(object.status) ? "
    "has(oldObject.status) && object.status == oldObject.status : !has(oldObject.status)) || "
    "authorizer.group('undolog.io').resource('undoentries').subresource('status')"
    ".namespace(object.metadata.namespace).name(object.metadata.name).check('patch').allowed()"
)
STATUS_MESSAGE = (
    "'UndoEntry ' + object.metadata.name + ': ' + request.userInfo.username + ' may not write its status, "
    "which only the operator and agents write: grant patch on undoentries/status in namespace ' + "
    "object.metadata.namespace + ' (as the role of agents does), or change only its metadata'"
)


# The act-as policy: an entry that has the operator undo a Kubernetes object as someone names its
# creator (with the creator's groups), or someone the creator may impersonate, as the API itself
# would let the creator act as them: creating an UndoEntry grants no rights to anything else.
ACT_AS_POLICY = "undolog-undoentry-act-as"
_ACTOR = "object.spec.kubernetes.actAs"
_ACCOUNT = f"{_ACTOR}.user.split(':')"
_MAY_BE_USER = (
    f"({_ACTOR}.user == request.userInfo.username || ("
    f"{_ACTOR}.user.startsWith('system:serviceaccount:') && size({_ACCOUNT}) == 4 ? "
    f"authorizer.group('').resource('serviceaccounts').namespace({_ACCOUNT}[2]).name({_ACCOUNT}[3])"
    ".check('impersonate').allowed() : "
    f"authorizer.group('').resource('users').name({_ACTOR}.user).check('impersonate').allowed()))"
)
_MAY_BE_GROUPS = (
    f"{_ACTOR}.?groups.orValue([]).all(g, g in request.userInfo.?groups.orValue([]) || "
    "authorizer.group('').resource('groups').name(g).check('impersonate').allowed())"
)
ACT_AS_RULE = f"request.operation != 'CREATE' || !has(object.spec.kubernetes) || ({_MAY_BE_USER} && {_MAY_BE_GROUPS})"
ACT_AS_MESSAGE = (
    "'UndoEntry ' + object.metadata.name + ': ' + request.userInfo.username + ' may not have the operator act as ' + "
    f"{_ACTOR}.user + ' (spec.kubernetes.actAs): name yourself, or grant ' + request.userInfo.username + "
    "' impersonate on that user (or ServiceAccount) and its groups'"
)


MAX_GUARD_VALUE_BYTES = 16 * 1024  # of a guard's value kept on the entry; a larger one by its digest
MAX_DIFFERING = 20  # fields named in status.guard.differing


class Guard(UserFacing):
    """What the step leaves, read again before its compensation: the compensation is sent only
    while what `holds` selects of the read is what it was right after the step."""

    read: Call = Field(description="A read-only call (a Webhook version) whose answer is the state the step changed.")
    holds: str | None = Field(
        default=None,
        max_length=4096,
        description="CEL over `state` (the read's output) and `args` selecting what must still hold, e.g. "
        "`state.content` or `{'replicas': state.spec.replicas}`; absent: the whole output.",
    )
    args: JsonObject | None = Field(
        default=None,
        max_length=MAX_ARGS,
        description="What `holds` reads as `args` (the step's arguments, when it reads them).",
    )
    before: JsonValue = Field(
        default=None,
        description="What it selected before the step (for a person; never compared).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


MAX_OBJECT_BYTES = 256 * 1024  # of an object's before- or after-image kept on its entry
MAX_ACT_AS_GROUPS = 32


class ObjectReference(UserFacing):
    """One Kubernetes object, as the operator reaches it over the API."""

    api_version: str = Field(max_length=253, description="Its apiVersion, e.g. apps/v1 or v1.")
    kind: str = Field(max_length=63, description="Its kind, e.g. Deployment.")
    resource: str = Field(
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Its resource (plural), e.g. deployments.",
    )
    namespace: str | None = Field(
        default=None, max_length=63, description="Its namespace; absent for a cluster-scoped object."
    )
    name: str = Field(max_length=253, description="Its name.")

    def __str__(self) -> str:
        group = self.api_version.rpartition("/")[0]
        where = f" in namespace {self.namespace}" if self.namespace else ""
        return f"{self.resource}{'.' + group if group else ''} {self.name}{where}"


class ActAs(UserFacing):
    """Whom the operator impersonates to undo: never more than the change was made with."""

    user: str = Field(
        max_length=512,
        description="A user as the API names it, e.g. system:serviceaccount:<namespace>:<name>: the caller, or a "
        "ServiceAccount its mapping names.",
    )
    groups: list[
        Annotated[str, StringConstraints(max_length=512), Field(description="A group, e.g. system:authenticated.")]
    ] = Field(
        default_factory=list,
        max_length=MAX_ACT_AS_GROUPS,
        description="Its groups (absent: for a ServiceAccount, the API adds its groups itself).",
    )


class ObjectUndo(UserFacing):
    """A change to a Kubernetes object, undone by the operator over the API: a created object
    deleted, a deleted one created again, a changed one restored on the fields the step changed,
    each only while nothing changed them again since (status.guard.after: the object after the step)."""

    object: ObjectReference = Field(description="The object the step changes.")
    before: JsonObject | None = Field(
        default=None,
        description=f"The object as read before the step (absent: it did not exist); at most {MAX_OBJECT_BYTES} bytes.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    act_as: ActAs = Field(
        description="Whom the operator acts as: an entry may name only its creator, or a user its creator may "
        "impersonate (checked at admission)."
    )
    changes: JsonObject | None = Field(
        default=None,
        description="The shape of what the step writes, as a merge patch (its leaves are the fields, e.g. "
        "{spec: {replicas: 5}}): only those are undone, so a change another writer made to other fields while the "
        "step ran is kept; absent: every field that differs between before and after.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class UndoEntrySpec(Model):
    """The effect and how to undo it. Immutable once created."""

    saga: str = Field(max_length=MAX_SAGA_NAME, description="Name of the Saga (same namespace) this entry belongs to.")
    undo_id: str = Field(pattern=UUID, description="UUID; the compensation's Idempotency-Key is undo-<undoId>.")
    stack_position: int = Field(
        ge=0,
        le=1_000_000,
        description="Order in the saga's undo stack; compensations run from the highest down.",
    )
    effect_id: str = Field(
        max_length=253,
        pattern=r"^[^\x00-\x1f\x7f]*$",  # sent as the Undolog-Forward-Key header: one line
        description="Identifies the effect, e.g. the forward Idempotency-Key (no control characters).",
    )
    step: str = Field(max_length=MAX_STEP_NAME, pattern=STEP_NAME, description="Name of the step (or tool call).")
    compensation: Call | None = Field(
        default=None, description="How to undo the effect; absent for Pivot and Retriable steps."
    )
    registered_at: datetime = Field(
        description="RFC 3339 time with microseconds at which the entry was written, before the effect ran."
    )
    guard: Guard | None = Field(
        default=None,
        description="Checked before the compensation is sent: a later change to what the step left halts the "
        "entry as Conflict instead of being overwritten.",
    )
    kubernetes: ObjectUndo | None = Field(
        default=None,
        description="A change to a Kubernetes object, undone natively by the operator (instead of a compensation "
        "call); a later change to a field the step changed halts the entry as Conflict.",
    )
    depends_on: list[StepName] | None = Field(
        default=None,
        max_length=MAX_DEPENDENCIES,
        description=(
            "Steps of lower entries this one depends on: they are compensated only after this one. Absent: "
            "every lower entry (strict newest-first). A name that is no lower entry's step counts as absent."
        ),
    )

    @property
    def undone_with(self) -> str:
        """How it is undone, in a few words: its compensation's function, or its object."""
        if self.compensation is not None:
            return f"{self.compensation.function} {self.compensation.version}"
        if self.kubernetes is not None:
            return f"natively: {self.kubernetes.object}"
        return "-"

    model_config = Model.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "spec is immutable once the UndoEntry is created"},
                {
                    "rule": "!has(self.kubernetes) || (!has(self.compensation) && !has(self.guard))",
                    "message": "spec.kubernetes is the undo itself: an entry with it has no spec.compensation and no "
                    "spec.guard",
                },
            ]
        }
    }


class Attempt(Model):
    """One call made for this entry."""

    kind: AttemptKind = Field(description="Forward, Compensation or Effect.")
    time: datetime = Field(description="When the call started.")
    number: int = Field(ge=1, description="1 for the first attempt; the Undolog-Attempt header.")
    status_code: int | None = Field(default=None, ge=100, le=599, description="HTTP status, if any came back.")
    error: str | None = Field(default=None, max_length=1024, description="What went wrong, if anything.")
    duration_milliseconds: int = Field(ge=0, description="Wall time of the call.")


class OmittedOutput(Model):
    """A successful answer whose body is not kept as the output, and why."""

    reason: OutputOmission = Field(description="AnswerTooLarge, AnswerNotJson, OutputTooLarge or OutputTooDeep.")
    message: str = Field(max_length=MAX_OMISSION_MESSAGE, description="What was received, for a person.")
    size_bytes: int | None = Field(default=None, ge=0, description="The body's size, where known.")


DifferingField = Annotated[
    str, StringConstraints(max_length=512), Field(description="A path, e.g. spec.replicas or rows[0].name.")
]


class GuardStatus(Model):
    """What the guard saw: right after the step, and at the undo when it no longer held."""

    after: JsonValue = Field(
        default=None,
        description=f"What held right after the step (spec.guard.holds; not kept above {MAX_GUARD_VALUE_BYTES} bytes), "
        f"or the object after it (spec.kubernetes; null: absent, at most {MAX_OBJECT_BYTES} bytes).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    after_digest: str | None = Field(
        default=None,
        max_length=71,
        description="sha256:<hex> of what held right after the step (its JSON, keys sorted): what the undo compares.",
    )
    now: JsonValue = Field(
        default=None,
        description="What the read gave at the undo, when it differed.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    differing: list[DifferingField] = Field(
        default_factory=list, max_length=MAX_DIFFERING, description="The fields that differ between after and now."
    )
    checked_at: datetime | None = Field(default=None, description="When the state was last read for the undo.")
    overridden: str | None = Field(
        default=None,
        max_length=MAX_MESSAGE,
        description="A person's `undo anyway` (why): the compensation is sent without the check.",
    )


class EntryTask(Model):
    """The task an MCP server runs for the step (the tasks extension): the step's outcome is
    unknown until it ends."""

    upstream: str = Field(max_length=253, description="The gateway's upstream that runs it.")
    task_id: str = Field(max_length=1024, description="The server's own id of the task.")


class UndoEntryStatus(Model):
    """Where the effect and its undo stand."""

    effect: EffectState = Field(
        default=EffectState.PENDING,
        description="The forward effect: Pending, Executing (outcome unknown), Committed or Failed.",
    )
    state: EntryState = Field(
        default=EntryState.PENDING,
        description="The compensation: Pending, Running, Compensated, Failed or Skipped.",
    )
    retry_count: int = Field(default=0, ge=0, description="Retries of the compensation so far.")
    last_error: str | None = Field(default=None, max_length=MAX_MESSAGE, description="Last failure, if any.")
    reason: EntryReason | None = Field(
        default=None, description="Machine-readable reason of the failure or settlement, e.g. FunctionNotFound."
    )
    executed_at: datetime | None = Field(default=None, description="When the forward effect finished.")
    compensated_at: datetime | None = Field(default=None, description="When the compensation succeeded.")
    rewound_at: datetime | None = Field(
        default=None,
        description="Settled by a rewind (spec.rewind) at this time: history; its step may have run again above it.",
    )
    skip_reason: str | None = Field(default=None, max_length=MAX_MESSAGE, description="Why a person skipped it.")
    output: JsonObject | None = Field(
        default=None, description="The forward call's JSON response (capped in size and nesting)."
    )
    output_omitted: OmittedOutput | None = Field(
        default=None, description="Set when a successful answer is not kept as output: why, and what came back."
    )
    attempts: list[Attempt] = Field(
        default_factory=list, max_length=MAX_ATTEMPTS, description="The last calls made for this entry."
    )
    guard: GuardStatus | None = Field(
        default=None, description="What the guard (spec.guard) saw after the step and at the undo."
    )
    task: EntryTask | None = Field(
        default=None, description="The server's task running the step, while its outcome is unknown (MCP tasks)."
    )


class UndoEntry(Resource):
    """An UndoEntry object as read from the API."""

    plural: ClassVar[Plural] = "undoentries"

    kind: str = "UndoEntry"
    spec: UndoEntrySpec
    status: UndoEntryStatus = Field(default_factory=UndoEntryStatus)
