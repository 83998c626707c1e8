"""UndoLog's custom resources as typed models: the one source of the CRD schemas.

`undolog.crds` renders these models into the CustomResourceDefinitions under `crds/`;
the operator, the SDK and the CLI parse the same objects with the same models.
"""

from undolog.api.common import GROUP, VERSION, Call, Condition, ConditionStatus
from undolog.api.saga import (
    Backoff,
    CompensationPolicy,
    Effect,
    EffectStatus,
    OnFailure,
    Outcome,
    Saga,
    SagaPhase,
    SagaSpec,
    SagaStatus,
    Step,
    StepType,
)
from undolog.api.undo_entry import (
    Attempt,
    EffectState,
    UndoEntry,
    UndoEntrySpec,
    UndoEntryState,
    UndoEntryStatus,
)
from undolog.api.webhook import (
    HeadersFrom,
    SecretReference,
    ServiceReference,
    Webhook,
    WebhookSpec,
    WebhookVersion,
)

__all__ = [
    "GROUP",
    "VERSION",
    "Attempt",
    "Backoff",
    "Call",
    "CompensationPolicy",
    "Condition",
    "ConditionStatus",
    "Effect",
    "EffectState",
    "EffectStatus",
    "HeadersFrom",
    "OnFailure",
    "Outcome",
    "Saga",
    "SagaPhase",
    "SagaSpec",
    "SagaStatus",
    "SecretReference",
    "ServiceReference",
    "Step",
    "StepType",
    "UndoEntry",
    "UndoEntrySpec",
    "UndoEntryState",
    "UndoEntryStatus",
    "Webhook",
    "WebhookSpec",
    "WebhookVersion",
]
