"""Render the CustomResourceDefinitions in crds/ from the API models.

The pydantic models in `undolog.api` are the single source of truth (this generator is a
developer tool: it is not in the wheel). Their JSON Schema is
turned into Kubernetes structural schemas: references inlined, optionals unwrapped, free-form
objects marked x-kubernetes-preserve-unknown-fields, pydantic titles dropped. `make crds`
writes the files; a test fails when the committed YAML and the models disagree.

kopf keeps no bookkeeping in these objects: the operator uses only kopf's event handlers,
which write neither progress nor diff-base, so status holds exactly the fields below.

    python -m devtools.crds crds
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from undolog.api import (
    EARLIER_VERSIONS,
    ENTRY_STATUS_VERSION,
    GROUP,
    VERSION,
    SagaSpec,
    SagaStatus,
    UndoEntrySpec,
    UndoEntryStatus,
    WebhookSpec,
    WebhookStatus,
)
from undolog.api.saga import ROOT_RULES as SAGA_ROOT_RULES
from undolog.api.saga import SAGA_ACT_AS_MESSAGE, SAGA_ACT_AS_POLICY, SAGA_ACT_AS_RULE
from undolog.api.undo_entry import (
    ACT_AS_MESSAGE,
    ACT_AS_POLICY,
    ACT_AS_RULE,
    OWNER_MESSAGE,
    OWNER_POLICY,
    OWNER_POLICY_OPT_OUT,
    OWNER_RULE,
    STATUS_MESSAGE,
    STATUS_POLICY,
    STATUS_RULE,
)
from undolog.api.undo_entry import ROOT_RULES as ENTRY_ROOT_RULES

JsonSchema = dict[str, Any]


def structural(schema: JsonSchema) -> JsonSchema:
    """A model's JSON Schema as a Kubernetes structural schema."""
    definitions: dict[str, JsonSchema] = schema.get("$defs", {})

    def convert(node: JsonSchema) -> JsonSchema:
        node = dict(node)
        description = node.pop("description", None)
        default = node.pop("default", None)
        for key in ("title", "$defs"):
            node.pop(key, None)
        if "$ref" in node:
            target = convert(definitions[node.pop("$ref").rsplit("/", 1)[1]])
            node = {**target, **node}
        if "anyOf" in node:  # Optional[X]: X, and absence means null
            options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
            if len(options) != 1:
                raise ValueError(f"unions other than Optional are not structural: {options}")
            node = {**convert(options[0]), **node}
        if node.get("type") == "object":
            properties = node.pop("properties", None)
            extra = node.pop("additionalProperties", None)
            if properties is not None:
                node["properties"] = {k: convert(v) for k, v in properties.items()}
            elif extra in (True, {}, None):
                node["x-kubernetes-preserve-unknown-fields"] = True
            else:
                node["additionalProperties"] = convert(extra)
            if "required" in node:
                node["required"] = sorted(node["required"])
        if node.get("type") == "array":
            node["items"] = convert(node["items"])
        if "enum" in node:
            node.setdefault("type", "string")
            # A bound on every string keeps the CEL cost estimates of rules over lists small.
            node["maxLength"] = max(len(str(option)) for option in node["enum"])
        if description is not None:
            node["description"] = description
        if default is not None:
            # An object default of {} lets the apiserver fill the nested defaults itself.
            node["default"] = {} if isinstance(default, dict) else default
        return dict(sorted(node.items()))

    return convert(schema)


def _model_schema(model: type[BaseModel]) -> JsonSchema:
    return structural(model.model_json_schema(by_alias=True, mode="validation"))


def _column(name: str, path: str, kind: str = "string", description: str = "", priority: int = 0) -> JsonSchema:
    column: JsonSchema = {"name": name, "type": kind, "jsonPath": path}
    if description:
        column["description"] = description
    if priority:
        column["priority"] = priority
    return column


AGE = _column("Age", ".metadata.creationTimestamp", "date")


def _definition(
    *,
    kind: str,
    plural: str,
    short_name: str,
    description: str,
    properties: dict[str, JsonSchema],
    columns: list[JsonSchema],
    root_rules: list[Any] | None = None,
    selectable: list[str] | None = None,
    status: bool = True,
    status_with_object_at: str = "",
    spec_required: bool = True,
) -> JsonSchema:
    # Declaring metadata.name's bound lets CEL rules read it within their cost budget.
    metadata: JsonSchema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 253}}}
    schema: JsonSchema = {
        "type": "object",
        "description": description,
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": metadata,
            **properties,
        },
    }
    if spec_required:
        schema["required"] = ["spec"]
    else:  # an empty spec is complete: the apiserver fills its defaults
        schema["properties"]["spec"]["default"] = {}
    if root_rules:
        schema["x-kubernetes-validations"] = root_rules
    version: JsonSchema = {
        "name": VERSION,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": schema},
        "additionalPrinterColumns": columns,
    }
    if status:
        version["subresources"] = {"status": {}}
    if selectable:
        version["selectableFields"] = [{"jsonPath": p} for p in selectable]
    # Earlier versions: served with the same schema (so conversion None: only apiVersion changes),
    # deprecated, never stored.
    earlier = [
        {
            **copy.deepcopy(version),  # a copy: YAML would write a shared one as an anchor and alias
            "name": name,
            "storage": False,
            "deprecated": True,
            "deprecationWarning": f"{GROUP}/{name} {kind} is deprecated; use {GROUP}/{VERSION}",
        }
        for name in EARLIER_VERSIONS
    ]
    if status_with_object_at:  # the same schema, its status written with the object (ledger.EntryStatusRoute)
        served = {k: v for k, v in copy.deepcopy(version).items() if k != "subresources"}
        earlier.insert(0, {**served, "name": status_with_object_at, "storage": False})
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short_name],
                "categories": ["undolog"],
            },
            "versions": [version, *earlier],
            "conversion": {"strategy": "None"},
        },
    }


def definitions() -> dict[str, JsonSchema]:
    """The three CRDs, keyed by the file name they are written to."""
    saga = _definition(
        kind="Saga",
        plural="sagas",
        short_name="saga",
        description=(
            "A session of multi-step work whose effects are undone newest-first when it fails. "
            "Orchestrated when spec.steps is given, external (driven by an agent's UndoEntries) otherwise."
        ),
        properties={"spec": _model_schema(SagaSpec), "status": _model_schema(SagaStatus)},
        columns=[
            _column("Phase", ".status.phase", description="Saga phase"),
            _column("Steps", ".status.stackDepth", "integer", "UndoEntries registered"),
            _column("Undone", ".status.compensatedCount", "integer", "UndoEntries compensated or skipped"),
            _column("Reason", ".status.reason", description="Reason of the current phase"),
            AGE,
            _column(
                "Expires", ".status.expiresAt", description="When retention deletes it (status.expiresAt)", priority=1
            ),
            _column("Org", ".spec.orgId", priority=1),
            _column("Failed-Step", ".status.failedStep", priority=1),
            _column("Principal", ".spec.principal", description="Who opened it through the gateway", priority=1),
        ],
        spec_required=False,
        root_rules=SAGA_ROOT_RULES,
        # kubectl get sagas --field-selector status.phase=Halted (and undolog list --field-selector)
        selectable=[".status.phase", ".spec.orgId", ".spec.principal"],
    )
    undo_entry = _definition(
        kind="UndoEntry",
        plural="undoentries",
        short_name="undo",
        description="One step's ledger record: the effect and how to undo it, written before the step runs.",
        properties={"spec": _model_schema(UndoEntrySpec), "status": _model_schema(UndoEntryStatus)},
        columns=[
            _column("Saga", ".spec.saga"),
            _column("Position", ".spec.stackPosition", "integer"),
            _column("Step", ".spec.step"),
            _column("Effect", ".status.effect"),
            _column("State", ".status.state"),
            _column("Retries", ".status.retryCount", "integer"),
            AGE,
            _column("Function", ".spec.compensation.function", priority=1),
            _column("Last-Error", ".status.lastError", priority=1),
        ],
        root_rules=ENTRY_ROOT_RULES,
        selectable=[".spec.saga"],
        status_with_object_at=ENTRY_STATUS_VERSION,
    )
    webhook = _definition(
        kind="Webhook",
        plural="webhooks",
        short_name="wh",
        description="The function registry: maps a function name and version to an HTTP target.",
        properties={"spec": _model_schema(WebhookSpec), "status": _model_schema(WebhookStatus)},
        columns=[
            _column("Versions", ".spec.versions[*].name"),
            _column("Timeout", ".spec.timeoutSeconds", "integer"),
            _column("Participant", ".status.participant", description="Unavailable while calls wait for it"),
            AGE,
        ],
    )
    return {"saga.yaml": saga, "undoentry.yaml": undo_entry, "webhook.yaml": webhook}


HEADER = "# Generated from operator/undolog/api by `make crds`; do not edit.\n"
CHART_TEMPLATE = Path("charts/undolog/templates/crds.yaml")
POLICY_FILE = "undoentry-policies.yaml"
# What `kubectl wait --for=condition=Established` waits on once crds/ is applied (the policy has no such condition).
CRDS = tuple(f"crd/{plural}.{GROUP}" for plural in ("sagas", "undoentries", "webhooks"))
POLICY_TEMPLATE = Path("charts/undolog/templates/admission-policy.yaml")


def _policy(
    name: str, expression: str, message: str, match: JsonSchema | None = None, resource: str = "undoentries"
) -> list[JsonSchema]:
    """A ValidatingAdmissionPolicy of one rule over writes of `resource`, and its binding."""
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [GROUP],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": [resource],
                    }
                ]
            },
            "validations": [{"expression": expression, "messageExpression": message, "reason": "Invalid"}],
        },
    }
    binding: JsonSchema = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    if match:
        binding["spec"]["matchResources"] = match
    return [policy, binding]


def entry_policies() -> list[JsonSchema]:
    """The policies over UndoEntry writes: the owner policy refuses an entry its saga does not own
    (every namespace but those labelled `undolog.io/entry-owner-policy: off`); the status policy
    keeps the status to the writers RBAC allows undoentries/status (every namespace); the act-as
    policy lets an entry (and a saga's steps) name only whom its creator may act as (every namespace)."""
    opted_in = {
        "namespaceSelector": {
            "matchExpressions": [{"key": OWNER_POLICY_OPT_OUT, "operator": "NotIn", "values": ["off"]}]
        }
    }
    return [
        *_policy(OWNER_POLICY, OWNER_RULE, OWNER_MESSAGE, opted_in),
        *_policy(STATUS_POLICY, STATUS_RULE, STATUS_MESSAGE),
        *_policy(ACT_AS_POLICY, ACT_AS_RULE, ACT_AS_MESSAGE),
        *_policy(SAGA_ACT_AS_POLICY, SAGA_ACT_AS_RULE, SAGA_ACT_AS_MESSAGE, resource="sagas"),
    ]


def render_policy() -> str:
    return HEADER + "---\n".join(yaml.safe_dump(d, sort_keys=False, width=120) for d in entry_policies())


def render_policy_template() -> str:
    """The policy as a Helm template (admissionPolicy.enabled)."""
    documents = []
    for definition in entry_policies():
        text = yaml.safe_dump(definition, sort_keys=False, width=120)
        metadata = f"metadata:\n  name: {definition['metadata']['name']}\n"
        labelled = metadata + '  labels: {{- include "undolog.labels" . | nindent 4 }}\n'
        documents.append(text.replace(metadata, labelled, 1))
    return "{{- if .Values.admissionPolicy.enabled }}\n" + HEADER + "---\n".join(documents) + "{{- end }}\n"


def render(definition: JsonSchema) -> str:
    return HEADER + yaml.safe_dump(definition, sort_keys=False, width=120)


def render_chart_template() -> str:
    """The same CRDs as a Helm template: installed and upgraded with the release, kept on uninstall
    (crds.keep) so that deleting the release never deletes the ledger."""
    documents = []
    for definition in definitions().values():
        text = yaml.safe_dump(definition, sort_keys=False, width=120)
        name = definition["metadata"]["name"]
        metadata = (
            f"metadata:\n  name: {name}\n"
            '  labels: {{- include "undolog.labels" . | nindent 4 }}\n'
            "  {{- if .Values.crds.keep }}\n"
            "  annotations:\n    helm.sh/resource-policy: keep\n"
            "  {{- end }}\n"
        )
        documents.append(text.replace(f"metadata:\n  name: {name}\n", metadata, 1))
    body = "---\n".join(documents)
    return "{{- if .Values.crds.enabled }}\n" + HEADER + body + "{{- end }}\n"


def write(directory: Path, chart_template: Path = CHART_TEMPLATE) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for file_name, definition in definitions().items():
        path = directory / file_name
        path.write_text(render(definition))
        written.append(path)
    chart_template.write_text(render_chart_template())
    (directory / POLICY_FILE).write_text(render_policy())
    POLICY_TEMPLATE.write_text(render_policy_template())
    return [*written, directory / POLICY_FILE, chart_template, POLICY_TEMPLATE]


if __name__ == "__main__":
    for written_path in write(Path(sys.argv[1] if len(sys.argv) > 1 else "crds")):
        print(f"wrote {written_path}")
