"""The tool catalogue: what each upstream last listed, by era, under the names agents see."""

from __future__ import annotations

import mcp_types as types

from undolog.decisions.advertised_undo import ListedTool
from undolog.gateway.catalogue import ToolCatalogue, advertised


def tool(name: str) -> types.Tool:
    return types.Tool(name=name, input_schema={"type": "object"})


def test_an_upstream_missing_from_a_new_listing_keeps_what_it_listed_before() -> None:
    catalogue = ToolCatalogue()
    catalogue.keep({("a", False): [tool("x")], ("a", True): [tool("x")], ("b", False): [tool("y")]}, ["a", "b"])
    catalogue.keep({("a", False): [tool("z")], ("a", True): [tool("z"), tool("w")]}, ["a", "b"])
    assert sorted(catalogue.of(stateless=False)) == ["y", "z"]
    assert sorted(catalogue.of(stateless=True)) == ["w", "z"]  # b listed nothing to that era
    assert catalogue.qualified("b.y").upstream == "b"


def test_a_name_two_upstreams_list_is_qualified_by_each() -> None:
    catalogue = ToolCatalogue()
    catalogue.keep({("a", False): [tool("x"), tool("only")], ("b", False): [tool("x")]}, ["a", "b"])
    assert sorted(catalogue.of(stateless=False)) == ["a.x", "b.x", "only"]


def test_what_an_upstream_advertises_is_the_session_era_s_where_both_list_a_tool() -> None:
    def listed(marker: str) -> ListedTool:
        return ListedTool(name="t", annotations={"marker": marker}, input_schema={}, output_schema=None)

    merged = advertised({("a", True): {"t": listed("stateless")}, ("a", False): {"t": listed("session")}})
    assert merged["a"]["t"].annotations == {"marker": "session"}
