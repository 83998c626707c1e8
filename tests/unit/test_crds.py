"""The committed CRDs are exactly what the API models render (one source of truth)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from devtools import crds

REPO = Path(__file__).resolve().parents[2]
FILES = sorted(crds.definitions())


@pytest.mark.parametrize("file_name", FILES)
def test_committed_crd_matches_models(file_name: str) -> None:
    committed = (REPO / "crds" / file_name).read_text()
    assert committed == crds.render(crds.definitions()[file_name]), f"crds/{file_name} is stale: run `make crds`"


def schema_nodes(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from schema_nodes(child, f"{path}.{name}")
    if "items" in node:
        yield from schema_nodes(node["items"], f"{path}[]")


def top_level(file_name: str) -> dict[str, Any]:
    definition = yaml.safe_load((REPO / "crds" / file_name).read_text())
    schema: dict[str, Any] = definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


@pytest.mark.parametrize("file_name", FILES)
def test_schema_is_structural_and_described(file_name: str) -> None:
    schema = top_level(file_name)
    for part in ("spec", "status"):
        if part not in schema["properties"]:
            continue
        for path, node in schema_nodes(schema["properties"][part], part):
            assert not {"$ref", "anyOf", "allOf", "title", "$defs"} & set(node), path
            assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), f"{path} has no type"
            assert node.get("description"), f"{path} has no description (kubectl explain shows nothing)"


def test_free_form_json_is_preserved_and_bounded() -> None:
    args = top_level("saga.yaml")["properties"]["spec"]["properties"]["steps"]["items"]["properties"]["action"][
        "properties"
    ]["args"]
    assert args["x-kubernetes-preserve-unknown-fields"] is True
    assert args["maxProperties"] == 32


def test_the_rules_over_a_saga_s_steps_run_when_it_is_created_not_at_each_write_after() -> None:
    """Every status write of a saga evaluated its steps' rules again, quadratic in the steps (a
    50-step saga with dependsOn: a quarter of a second of apiserver CPU per write). The steps
    cannot change once the saga exists (the spec's rule), so each rule is skipped when it did."""
    spec = top_level("saga.yaml")["properties"]["spec"]
    assert any("self.steps == oldSelf.steps" in rule["rule"] for rule in spec["x-kubernetes-validations"])
    step_rules = spec["properties"]["steps"]["x-kubernetes-validations"]
    assert len(step_rules) == 4
    for rule in step_rules:
        assert rule.get("optionalOldSelf") is True, rule
        assert rule["rule"].startswith("oldSelf.hasValue() || ("), rule


def test_chart_template_matches_models() -> None:
    committed = (REPO / crds.CHART_TEMPLATE).read_text()
    assert committed == crds.render_chart_template(), "charts/undolog/templates/crds.yaml is stale: run `make crds`"
