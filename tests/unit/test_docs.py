"""Docs that run as written: every `undolog ...` command shown in README and docs/ is accepted
by the CLI as it is today (subcommand, options, arguments), so the docs cannot drift from it.
What the commands do is covered by the cluster tests (tests/cluster/test_cli.py and others)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.core import TyperGroup

from undolog.cli.app import app

REPO = Path(__file__).resolve().parents[2]
DOCS = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    REPO / "charts" / "undolog" / "templates" / "NOTES.txt",
]
COMMAND = re.compile(r"^\s*(?:\$ )?(?:kubectl )?(undolog [^#`\n]*)", re.MULTILINE)


def documented() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        for match in COMMAND.finditer(path.read_text()):
            line = match.group(1).strip()
            if "{{" in line or "<" in line:  # a template or a placeholder, not a runnable line
                continue
            found.append((path.name, line))
    return found


def test_the_docs_show_commands() -> None:
    assert len(documented()) >= 15


@pytest.mark.parametrize(("where", "line"), documented())
def test_a_documented_command_is_accepted(where: str, line: str) -> None:
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    name, *args = shlex.split(line)[1:]
    context = root.context_class(root, info_name="undolog")
    command = root.get_command(context, name)
    assert command is not None, f"{where}: no command {name!r} in {line!r}"
    command.make_context(name, args, parent=context)  # raises on a stale option or a missing argument


def test_the_chart_and_the_examples_name_the_image_make_image_tags() -> None:
    """`make image` tags the image with the package's version (tools/image.sh); the chart's
    default tag is its appVersion, so a default install finds the imported image."""
    import yaml

    import undolog

    chart = yaml.safe_load((REPO / "charts" / "undolog" / "Chart.yaml").read_text())
    assert chart["appVersion"] == undolog.__version__
    values = yaml.safe_load((REPO / "charts" / "undolog" / "values.yaml").read_text())
    image = f"{values['image']['repository']}:{undolog.__version__}"
    pods = [d for d in yaml.safe_load_all((REPO / "examples" / "onboarding" / "in-cluster.yaml").read_text()) if d]
    used = {c["image"] for d in pods if d["kind"] == "Deployment" for c in d["spec"]["template"]["spec"]["containers"]}
    assert used == {image}


# How the work was organised belongs to git and CHANGELOG.md: numbered parts and sessions,
# issue numbers, dated runs ("the run of 2026-12-01") in a page about the product.
HISTORY = re.compile(
    r"\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
    r"thirteenth|fourteenth|\d+(?:st|nd|rd|th)) (?:part|session)\b|\bissue \d+|\b20\d\d-\d\d-\d\d\b",
    re.IGNORECASE,
)


def outside_code(text: str) -> str:
    """The page without its code, fenced or inline (an example's timestamp, a protocol revision
    such as `2025-11-25`, is not history)."""
    return re.sub(r"`[^`\n]+`", "", re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL))


@pytest.mark.parametrize("page", [p for p in DOCS if p.suffix == ".md"], ids=lambda p: p.name)
def test_no_docs_page_tells_the_history_of_the_work(page: Path) -> None:
    told = [m.group(0) for m in HISTORY.finditer(outside_code(page.read_text()))]
    assert told == [], f"{page.name} tells the history of the work; that belongs to git and CHANGELOG.md"
