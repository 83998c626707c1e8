"""Pieces shared by the three kinds: the Call, Kubernetes conditions, object metadata."""

from __future__ import annotations

import functools
import math
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, StringConstraints, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError
from pydantic_core.core_schema import ValidatorFunctionWrapHandler

Plural = Literal["sagas", "undoentries", "webhooks"]
GROUP = "undolog.io"
VERSION = "v1beta1"  # served and stored; what the operator, the SDK and the CLI speak
# Still served, with the same schema (conversion None): clients of an earlier release keep working.
EARLIER_VERSIONS = ("v1alpha1",)
API_VERSION = f"{GROUP}/{VERSION}"
# UndoEntry is also served as this version, with the same schema but no status subresource: its
# status is written there with the object, in one write that also drops the field owners
# (ledger.EntryStatusRoute). Clients of VERSION keep their /status.
ENTRY_STATUS_VERSION = "v1beta2"

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
# Step names are DNS labels that may also hold '_' (the design's own references, such as
# ${steps.create_user.output.user_id}, use it); they never become object names.
STEP_NAME = r"^[a-z0-9]([-_a-z0-9]*[a-z0-9])?$"
MAX_STEP_NAME = 63
StepName = Annotated[
    str, StringConstraints(max_length=MAX_STEP_NAME, pattern=STEP_NAME), Field(description="A step name.")
]
EntryName = Annotated[str, StringConstraints(max_length=253), Field(description="An UndoEntry's name.")]
MAX_DEPENDENCIES = 50  # names in one dependsOn
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
MAX_ARGS = 32
MAX_MESSAGE = 4096
MAX_SAGA_NAME = 200  # so that <saga>-<position> stays within a name's 253 characters
# Levels of objects and arrays in a free-form JSON object (a call's args, an entry's output).
# The API stores up to 10,000; Python's json, pydantic's serializer (~250) and the operator's
# own walks over them (templating) do not reach that far, so a deeper one is refused as a
# whole, by name, rather than failing somewhere inside.
MAX_NESTING = 32


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # the integers the API stores as they are; others become float64, rounded


def shape(value: Any) -> tuple[int, int | None]:
    """How many levels of objects and arrays `value` nests (0 for a scalar), and an integer in it
    the API would round (if any): one walk, level by level without recursion, however deep it
    goes and cheaply for the flat args most calls have (every entry parsed from a watch event is
    walked)."""
    depth, wide = 0, None
    if type(value) is int and not INT64_MIN <= value <= INT64_MAX:
        wide = value
    level = [value] if isinstance(value, (dict, list)) else []
    while level:
        depth += 1
        below: list[Any] = []
        for container in level:
            for child in container.values() if isinstance(container, dict) else container:
                if isinstance(child, (dict, list)):
                    below.append(child)
                elif type(child) is int and wide is None and not INT64_MIN <= child <= INT64_MAX:
                    wide = child
        level = below
    return depth, wide


def shown_integer(number: int) -> str:
    """The integer as text, or its size when long (Python refuses to write past 4,300 digits)."""
    if number.bit_length() <= 256:
        return str(number)
    return f"a number of about {int(number.bit_length() * math.log10(2)) + 1} digits"


def _nested_within_bound(value: dict[str, Any]) -> dict[str, Any]:
    depth, wide = shape(value)
    if depth > MAX_NESTING:
        raise PydanticCustomError(
            "nesting",
            "nests {depth} levels of objects and arrays; UndoLog reads at most {bound}: flatten it, or send "
            "the deep part as a string",
            {"depth": depth, "bound": MAX_NESTING},
        )
    if wide is not None:
        raise PydanticCustomError(
            "wide_integer",
            "holds {number}, an integer beyond 64 bits, which the Kubernetes API stores as a float64, rounded: "
            "send it as a string",
            {"number": shown_integer(wide)},
        )
    return value


JsonObject = Annotated[dict[str, Any], AfterValidator(_nested_within_bound)]


class Model(BaseModel):
    """Base of every API model: camelCase on the wire, snake_case in Python."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
    )

    def to_api(self) -> dict[str, Any]:
        """The JSON-ready dict the Kubernetes API takes: aliases, no unset optionals."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class UserFacing(Model):
    """A model people write in code (a Call, a compensation policy): what it was given that it
    has no field for is noted, and the SDK refuses it (`unknown_fields`) before anything is
    registered: `Call(function=..., arg={...})` is a typo, not `args={}`. Objects read from the
    API are not refused for it: an older operator may read what a newer release wrote."""

    _unknown: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _note_unknown(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        made = handler(data)
        if isinstance(data, dict) and isinstance(made, UserFacing):
            known = _known_keys(cls)
            unknown = tuple(str(key) for key in data if key not in known)
            if unknown:  # set only then: a private attribute's assignment is pydantic's slow path
                made._unknown = unknown
        return made


@functools.cache
def _known_keys(model: type[BaseModel]) -> frozenset[str]:
    """A model's field names and aliases, once per class: asked on every validation of it."""
    return frozenset(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias}


def unknown_fields(model: BaseModel) -> list[str]:
    """Every field a user-facing model (and those within it) was given and has none for, each as
    `Type.field (its fields: ...)`."""
    found = []
    if isinstance(model, UserFacing):
        fields = ", ".join(type(model).model_fields)
        found += [f"{type(model).__name__} has no field {key!r} (its fields: {fields})" for key in model._unknown]
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            found += unknown_fields(value)
    return found


class Call(UserFacing):
    """A call to a registered function: the Webhook named `function`, at `version`."""

    function: str = Field(
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="Name of a Webhook in the saga's namespace (the function registry).",
    )
    version: str = Field(
        default="v1",
        max_length=63,
        pattern=DNS_LABEL,
        description="Which of the Webhook's spec.versions[] to call.",
    )
    args: JsonObject = Field(
        default_factory=dict,
        max_length=MAX_ARGS,
        description=(
            f"JSON object sent as the request body, nested at most {MAX_NESTING} levels (deeper: the object is "
            'not read). String values may refer to earlier outputs, e.g. "${steps.create_user.output.user_id}".'
        ),
    )
    max_retries: int | None = Field(
        default=None,
        ge=0,
        le=100,
        description="Retries after the first attempt for transient failures; overrides the saga's backoff.",
    )
    timeout_seconds: int | None = Field(
        default=None,
        ge=1,
        le=300,
        description="Per-attempt timeout; overrides the Webhook's spec.timeoutSeconds.",
    )


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ConditionType(StrEnum):
    """The saga's conditions: one per aspect a person or a GitOps tool asks about."""

    SUCCEEDED = "Succeeded"
    COMPENSATED = "Compensated"
    HALTED = "Halted"
    # kstatus (Flux, Argo CD, kpt): Ready when nothing is left to do; Reconciling while the
    # operator works on it; Stalled when it needs a person.
    READY = "Ready"
    RECONCILING = "Reconciling"
    STALLED = "Stalled"


class Condition(Model):
    """A Kubernetes condition: the latest observation of one aspect of the object."""

    type: str = Field(max_length=64, description="Condition type, e.g. Succeeded, Compensated, Halted.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(
        default="",
        max_length=128,
        description="One CamelCase word: why the condition is in this status.",
    )
    message: str = Field(default="", max_length=MAX_MESSAGE, description="Human-readable details.")
    last_transition_time: datetime | None = Field(default=None, description="When status last changed.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation this condition was set from."
    )


class OwnerReference(Model):
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


def revision_of(version: str) -> int | None:
    """A resourceVersion as the etcd revision it is; None when it is not one. Versions of one
    resource are comparable this way (KEP-5504, GA in Kubernetes 1.35)."""
    return int(version) if version.isascii() and version.isdigit() else None


def revision_in(body: dict[str, Any]) -> int | None:
    """The revision of an object as the API sent it (its metadata.resourceVersion); None when
    it has none, or one that is not a revision."""
    version = (body.get("metadata") or {}).get("resourceVersion")
    return None if version is None else revision_of(str(version))


class ObjectMeta(Model):
    """The parts of metadata the operator reads and writes."""

    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    generation: int = 0
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    finalizers: list[str] = Field(default_factory=list)
    owner_references: list[OwnerReference] = Field(default_factory=list)
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None

    @property
    def revision(self) -> int | None:
        """The resourceVersion as an etcd revision; None when it is not one (then: read again)."""
        return revision_of(self.resource_version)


class Resource(Model):
    """An object of one of UndoLog's kinds, as read from the API (parsed once, at the edge)."""

    plural: ClassVar[Plural]

    api_version: str = API_VERSION
    kind: str = ""
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)

    @property
    def key(self) -> tuple[str, str]:
        return self.metadata.namespace, self.metadata.name

    @property
    def reference(self) -> str:
        """<namespace>/<name>, as people and the Undolog-Saga header name it."""
        return f"{self.metadata.namespace}/{self.metadata.name}"
