"""Undo a server advertises (SEP-3172's `recovery`, `x-compensation-pair`) as mappings."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from undolog.api.gateway import GatewayConfig
from undolog.decisions.advertised_undo import ListedTool, runtime_expression, with_advertised
from undolog.decisions.undo_expressions import compile_expression, evaluate


def tool(name: str, annotations: dict[str, Any] | None = None, **schemas: Any) -> ListedTool:
    return ListedTool(name, annotations or {}, schemas.get("input", {}), schemas.get("output"))


def schema(*required: str) -> dict[str, Any]:
    return {"type": "object", "properties": {n: {"type": "string"} for n in required}, "required": list(required)}


RECOVERY = {
    "strategy": "compensation",
    "compensatingOperation": {
        "operationId": "release",
        "parameters": {"reservationId": "$response.body#/reservation/id", "sku": "$request.body#/sku", "why": "undo"},
    },
}
SERVER = {
    "reserve": tool("reserve", {"recovery": RECOVERY}, input=schema("sku")),
    "release": tool("release", input=schema("reservationId", "sku")),
    "tag": tool("tag", {"x-compensation-pair": "untag"}, input=schema("item", "tag"), output=schema("tagId")),
    "untag": tool("untag", input=schema("tagId", "item")),
    "charge": tool("charge", {"x-compensation-pair": "refund"}, input=schema("amount")),
    "refund": tool("refund", input=schema("chargeId")),
    "orphan": tool("orphan", {"x-compensation-pair": "nowhere"}),
}


def config(**tools: Any) -> GatewayConfig:
    return GatewayConfig.model_validate(
        {
            "namespace": "agents",
            "auth": "none",
            "upstreams": {"shop": {"url": "http://127.0.0.1:1/mcp"}},
            "tools": tools,
        }
    )


def test_recovery_and_pairs_become_mappings_and_what_cannot_be_followed_is_left_unmapped_saying_why() -> None:
    merged, said = with_advertised(config(), {"shop": SERVER})
    reserve, tag = merged.tools["shop.reserve"].compensation, merged.tools["shop.tag"].compensation
    assert reserve is not None
    assert tag is not None
    assert (reserve.tool, reserve.args) == (
        "shop.release",
        {"reservationId": "${output.reservation.id}", "sku": "${args.sku}", "why": "undo"},
    )
    assert (tag.tool, tag.args) == ("shop.untag", {"tagId": "${output.tagId}", "item": "${args.item}"})
    assert "shop.charge" not in merged.tools
    assert "shop.orphan" not in merged.tools
    assert (
        "shop.charge left unmapped: shop.charge's annotation x-compensation-pair: refund requires 'chargeId', which "
        "neither the call's output schema nor its arguments declare: map tools.shop.charge in the configuration"
    ) in said
    assert any(line.startswith("shop.orphan left unmapped:") and "'nowhere'" in line for line in said)


def test_the_configuration_wins_over_an_annotation() -> None:
    own = {"compensation": {"tool": "shop.release", "args": {"reservationId": "${output.id}"}}}
    merged, said = with_advertised(config(**{"shop.reserve": own}), {"shop": SERVER})
    compensation = merged.tools["shop.reserve"].compensation
    assert compensation is not None
    assert compensation.args == {"reservationId": "${output.id}"}
    assert "shop.reserve: the configuration's mapping wins over its annotation" in said


@pytest.mark.parametrize(
    "expression", ["$response.header.Location", "$statusCode", "$request.path.id", "$response.body#id"]
)
def test_a_runtime_expression_the_gateway_cannot_follow_is_named(expression: str) -> None:
    with pytest.raises(ValueError, match=r"can be followed|not a JSON pointer"):
        runtime_expression(expression)


# NUL is left out: the CEL bindings pass map keys to C++ as C strings, which end at it.
KEYS = st.text(
    st.characters(codec="utf-8", exclude_categories=["Cs"], exclude_characters="\x00"), min_size=1, max_size=8
)


@given(st.lists(st.one_of(KEYS, st.integers(0, 3)), min_size=1, max_size=4), st.integers(-(2**63), 2**63 - 1))
def test_a_json_pointer_follows_any_key_or_index_to_its_value(steps: list[str | int], value: int) -> None:
    """RFC 6901: any key (its escapes ~0 and ~1), however CEL must spell it; a number is an
    index in a list and a key in a map. Values are CEL's 64-bit integers."""
    document: Any = value
    for step in reversed(steps):
        document = [None] * step + [document] if isinstance(step, int) else {step: document}
    pointer = "".join("/" + str(s).replace("~", "~0").replace("/", "~1") for s in steps)
    source = runtime_expression(f"$response.body#{pointer}")[2:-1]
    assert evaluate(compile_expression(source), {"output": document}) == value
