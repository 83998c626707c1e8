"""CEL with the libraries Kubernetes enables (as far as cel-cpp's Python bindings have them):
what undo expressions over real servers' text need."""

from __future__ import annotations

from typing import Any

import pytest

from undolog.decisions.expressions import Environment, ExpressionError
from undolog.decisions.undo_expressions import compile_expression, mistyped

ENV = Environment(("before", "args"))
STATUS = "On branch feature/login\nYour branch is up to date with 'origin/feature/login'.\n"


@pytest.mark.parametrize(
    ("source", "value"),
    [
        # strings: git_checkout's undo, the branch from before read out of git_status's text
        ("before.text.split('\\n')[0].substring(10)", "feature/login"),
        ("args.name.lowerAscii().replace('_', '-')", "web-app"),
        ("'a,b'.split(',').join('+')", "a+b"),
        # regex (RE2): Kubernetes' find and findAll are regex.extract and regex.extractAll here
        ("regex.extract(before.text, 'origin/([a-z/]+)').orValue('')", "feature/login"),
        ("regex.extractAll('a1 b22', '[0-9]+')", ["1", "22"]),
        # lists and sets
        ("[3, 1, 2].sort()", [1, 2, 3]),
        ("[[1], [2, 3]].flatten().distinct()", [1, 2, 3]),
        ("sets.contains(['a', 'b'], ['b'])", True),
        # optionals, two-variable comprehensions, bindings, math, encoders
        ("args.?missing.orValue('none')", "none"),
        ("{'a': 1, 'b': 2}.all(k, v, v > 0)", True),
        ("{'a': 1}.transformList(k, v, k + '=' + string(v))", ["a=1"]),
        ("cel.bind(n, args.name.size(), n * 2)", 14),
        ("math.greatest(1, 5, 3)", 5),
        ("base64.encode(b'hi')", "aGk="),
        ("base64.decode('aGk=')", "aGk="),  # bytes come back as JSON writes them: base64
    ],
)
def test_the_libraries_kubernetes_enables_compile_and_evaluate(source: str, value: Any) -> None:
    program = ENV.compile(source, f"${{{source}}}")
    assert ENV.evaluate(program, {"before": {"text": STATUS}, "args": {"name": "web_app"}}, source) == value


def test_transform_map_is_refused_at_compile_saying_why() -> None:
    """cel-cpp's Python bindings declare transformMap but cannot evaluate it: refused where a
    configuration is loaded, not when an undo is due."""
    with pytest.raises(ExpressionError, match="transformMap and transformMapEntry are not available"):
        ENV.compile("args.transformMap(k, v, v)", "${args.transformMap(k, v, v)}")


def test_what_kubernetes_has_and_these_bindings_lack_is_refused_naming_it() -> None:
    for source in ("url('https://x.io').getHost()", "quantity('1Gi').asInteger()", "'a1'.find('[0-9]')"):
        with pytest.raises(ExpressionError, match="undeclared reference"):
            ENV.compile(source, source)


def test_an_argument_whose_type_the_called_tool_does_not_take_is_named() -> None:
    target = {
        "properties": {
            "number": {"type": "integer"},
            "labels": {"type": "array"},
            "title": {"type": ["string", "null"]},
        }
    }
    schemas = {"args": {"type": "object", "properties": {"title": {"type": "string"}, "n": {"type": "integer"}}}}
    wrong = {"number": "${args.title}", "labels": {"a": 1}, "title": "${args.n}", "other": 1}
    assert mistyped(wrong, schemas, target) == [
        "number: ${args.title} gives string, where the tool's schema says integer",
        'labels: {"a": 1} gives object, where the tool\'s schema says array',
        "title: ${args.n} gives integer, where the tool's schema says string or null",
    ]
    right = {"number": "${args.n}", "labels": ["x"], "title": "undo of ${args.n}"}
    assert mistyped(right, schemas, target) == []
    assert (
        mistyped({"number": "${output.id}", "labels": True}, schemas, {"properties": {"number": {"type": "integer"}}})
        == []
    )
    assert mistyped({"number": True}, schemas, target) == [
        "number: true gives boolean, where the tool's schema says integer"
    ]


def test_an_expression_is_compiled_once_however_many_calls_fill_it() -> None:
    assert compile_expression("args.number + 1") is compile_expression("args.number + 1")
