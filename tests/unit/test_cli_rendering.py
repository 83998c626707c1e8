"""What the CLI prints of the read model: plain text, kubectl's shapes, nothing a terminal
would interpret, every line a person acts on present."""

from __future__ import annotations

import re

import pytest
import typer
import yaml

from tests.unit.test_phases import make_entry, make_saga, with_state
from undolog import errors
from undolog.api import LostEntry
from undolog.cli.triage import Output, described, listed_as, printing, render_detail, render_sagas
from undolog.inspect import SagaDetail


def test_the_undo_stack_is_drawn_newest_first_with_an_unreadable_entry_in_its_place() -> None:
    entries = [with_state(make_entry(3), "Compensated"), make_entry(1)]
    unreadable = [LostEntry(name="s-2", stack_position=2, step="step2", why="spec.args nested too deep")]
    shown = render_detail(SagaDetail(make_saga("Halted"), entries, [], unreadable), Output.table)
    stack = shown.split("Undo stack (newest first)\n", 1)[1].split("\n\nTimeline", 1)[0].splitlines()
    assert [line.split()[0] for line in stack] == ["POS", "3", "2", "1"]
    assert "Unreadable" in stack[2]
    assert "spec.args nested too deep" in stack[2]


def test_text_others_wrote_cannot_move_the_terminal() -> None:
    saga = make_saga("Halted")
    saga.status.message = "refund failed: \x1b[2J\x1b[31mred\x07"
    shown = render_detail(SagaDetail(saga, [], []), Output.table)
    assert "\x1b" not in shown
    assert "\x07" not in shown


def test_listings_as_json_or_yaml_are_the_objects_the_api_holds() -> None:
    saga = make_saga("Active")
    parsed = yaml.safe_load(render_sagas([saga], Output.yaml, with_namespace=False))
    assert parsed["items"][0]["metadata"]["name"] == "s"
    assert render_sagas([saga], Output.name, with_namespace=False) == "saga.undolog.io/s"


def test_a_refusal_prints_each_cause_under_the_apis_message() -> None:
    cause = errors.StatusCause("Invalid value: -1", "spec.deadlineSeconds", "FieldValueInvalid")
    refused = errors.Invalid(
        'Saga.undolog.io "bad" is invalid', details=errors.StatusDetails(kind="Saga", name="bad", causes=(cause,))
    )
    assert described(refused).splitlines() == [
        'Saga.undolog.io "bad" is invalid',
        "  spec.deadlineSeconds: Invalid value: -1",
    ]


def test_an_error_that_is_over_is_not_shown_beside_compensated() -> None:
    over = with_state(make_entry(2), "Compensated").model_copy(deep=True)
    over.status.last_error = "HTTP 404: no such user (attempt 1)"
    failing = make_entry(1).model_copy(deep=True)
    failing.status.last_error = "HTTP 500: ledger closed"
    shown = render_detail(SagaDetail(make_saga("Halted"), [over, failing], [], []), Output.table)
    assert "HTTP 404" not in shown
    assert "HTTP 500: ledger closed" in shown


def test_times_have_their_date_and_zone() -> None:
    from datetime import datetime, timedelta, timezone

    from undolog.cli.triage import clock

    paris = timezone(timedelta(hours=1))
    assert clock(datetime(2026, 12, 3, 18, 55, 34, 100_000, tzinfo=paris)) == "2026-12-03T17:55:34.100Z"
    assert clock(None) == ""


def test_jsonpath_and_custom_columns_print_as_kubectl_prints_them() -> None:
    halted, active = make_saga("Halted"), make_saga("Active")
    active.metadata.name = "t"
    sagas = [halted, active]
    names = listed_as(printing("jsonpath={.items[*].metadata.name}"), sagas, with_namespace=False)
    assert names == "s t"
    lines = printing('jsonpath={range .items[*]}{.metadata.name}{"\\t"}{.status.phase}{"\\n"}{end}')
    assert listed_as(lines, sagas, with_namespace=False) == "s\tHalted\nt\tActive\n"
    picked = printing('jsonpath={.items[?(@.status.phase=="Halted")].metadata.name}')
    assert listed_as(picked, sagas, with_namespace=False) == "s"
    columns = listed_as(printing("custom-columns=NAME:.metadata.name,ORG:.spec.orgId"), sagas, with_namespace=False)
    assert columns.splitlines() == ["NAME   ORG", "s      <none>", "t      <none>"]
    bare = listed_as(printing("custom-columns=NAME:.metadata.name", no_headers=True), sagas, with_namespace=False)
    assert bare.splitlines() == ["s", "t"]
    table = listed_as(printing("table", no_headers=True), sagas, with_namespace=False)
    assert [line.split()[0] for line in table.splitlines()] == ["s", "t"]


def test_a_template_that_cannot_be_read_is_a_usage_error_naming_it() -> None:
    for given, said in (
        ("jsonpath", "jsonpath= needs a template"),
        ("jsonpath={.items[}", "is not a JSONPath expression"),
        ("jsonpath={range .items[*]}{.metadata.name}", "{range} without {end}"),
        ("custom-columns=NAME", "is not NAME:EXPRESSION"),
        ("yaml=x", "-o yaml takes no template"),
        ("xml", "'xml' is not an output format (table, wide, json, yaml, name, jsonpath=..., custom-columns=...)"),
    ):
        with pytest.raises(typer.BadParameter, match=re.escape(said)):
            listed_as(printing(given), [make_saga("Active")], with_namespace=False)
