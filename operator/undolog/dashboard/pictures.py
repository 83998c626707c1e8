"""The dashboard's pictures, drawn as server-rendered SVG (no script, no build step): a saga's
calls on a time axis, its dependency graph, and the overview's bars. Pure: entries, events and
counts in, shapes in pixels out; the templates write the SVG, with a text equivalent beside
each picture for readers who cannot see it."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from undolog.api import Attempt, AttemptKind, UndoEntry
from undolog.decisions.compensation_plan import declared_dependencies, depends
from undolog.kube.events import EventRecord

LABELS = 190.0  # the lanes' names, left of the axis
PLOT = 760.0  # the time axis' length
LANE = 26.0
AXIS = 34.0  # below the lanes: ticks and their labels
MIN_BAR = 3.0  # a 2 ms call is still seen
MAX_GRAPH_NODES = 60  # a deeper graph is the undo stack's table, not a picture
MAX_LANES = 100  # the newest entries a timeline draws: a 10,000-entry stack stays a page, not a poster


@dataclass(frozen=True)
class Bar:
    """One call: its lane, where it starts and how long it took, what it was, and how it ended."""

    x: float
    y: float
    width: float
    kind: str  # forward | compensation | effect, and failed / retry: the CSS classes
    label: str


@dataclass(frozen=True)
class Mark:
    """A moment of the saga (an Event): a line across the lanes."""

    x: float
    kind: str  # halt | warning | normal
    label: str


@dataclass(frozen=True)
class Band:
    """Compensation calls of several entries that ran at the same time (a wave)."""

    x: float
    width: float
    label: str


@dataclass(frozen=True)
class Tick:
    x: float
    label: str


@dataclass(frozen=True)
class Timeline:
    width: float
    height: float
    lanes: list[tuple[float, str]]  # (y, "#3 send_email"), newest on top
    bars: list[Bar]
    marks: list[Mark]
    bands: list[Band]
    ticks: list[Tick]
    start: datetime  # the axis' zero
    omitted: int = 0  # older entries not drawn (past MAX_LANES)

    @property
    def axis_y(self) -> float:
        return self.height - AXIS


def call_label(entry: UndoEntry, attempt: Attempt, start: datetime) -> str:
    answer = f"HTTP {attempt.status_code}" if attempt.status_code else "no answer"
    said = f"{answer}: {attempt.error}" if attempt.error else answer
    at = (attempt.time - start).total_seconds()
    return (
        f"#{entry.spec.stack_position} {entry.spec.step}: {attempt.kind.value.lower()} call {attempt.number} "
        f"at +{at:.3f} s, {attempt.duration_milliseconds} ms, {said}"
    )


def failed(attempt: Attempt) -> bool:
    return attempt.error is not None or (attempt.status_code is not None and not 200 <= attempt.status_code < 300)


def span(entries: Sequence[UndoEntry], events: Sequence[EventRecord], start: datetime) -> float:
    """Seconds from `start` to the last call's end or the last event, at least 1 ms."""
    ends = [a.time + timedelta(milliseconds=a.duration_milliseconds) for e in entries for a in e.status.attempts] + [
        e.time for e in events if e.time is not None
    ]
    return max([0.001, *((end - start).total_seconds() for end in ends)])


def ticks(seconds: float) -> list[Tick]:
    """About six ticks at 1, 2 or 5 times a power of ten, labelled in s or ms."""
    raw = seconds / 6
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    count = int(seconds / step + 1e-9)
    unit, scale = ("ms", 1000.0) if step < 1 else ("s", 1.0)
    return [
        Tick(LABELS + PLOT * (n * step) / seconds, f"+{n * step * scale:g} {unit}" if n else "0")
        for n in range(count + 1)
    ]


def timeline(entries: Sequence[UndoEntry], events: Sequence[EventRecord], start: datetime) -> Timeline | None:
    """Each entry a lane (newest on top, as the stack is drawn); its calls on one time axis from
    `start` (the saga's creation); the saga's Events as lines (halts stand out); compensation
    calls of several entries that overlapped as a band. None when no call was recorded. At most
    MAX_LANES entries, the newest (`entries` come newest first)."""
    omitted = max(0, len(entries) - MAX_LANES)
    entries = entries[:MAX_LANES]
    if not any(e.status.attempts for e in entries):
        return None
    seconds = span(entries, events, start)

    def x(moment: datetime) -> float:
        return LABELS + PLOT * max(0.0, (moment - start).total_seconds()) / seconds

    lanes = [(index * LANE, f"#{e.spec.stack_position} {e.spec.step}") for index, e in enumerate(entries)]
    bars = [
        Bar(
            x(attempt.time),
            y,
            max(MIN_BAR, PLOT * attempt.duration_milliseconds / 1000 / seconds),
            " ".join(
                [attempt.kind.value.lower()]
                + (["failed"] if failed(attempt) else [])
                + (["retry"] if attempt.number > 1 else [])
            ),
            call_label(entry, attempt, start),
        )
        for (y, _), entry in zip(lanes, entries, strict=True)
        for attempt in entry.status.attempts
    ]
    marks = [
        Mark(x(e.time), "halt" if e.reason == "Halted" else e.type.lower(), f"{e.reason}: {e.message}")
        for e in events
        if e.time is not None
    ]
    height = len(entries) * LANE + AXIS
    drawn = waves(entries, x)
    return Timeline(LABELS + PLOT + 20, height, lanes, bars, marks, drawn, ticks(seconds), start, omitted)


def waves(entries: Sequence[UndoEntry], x: Callable[[datetime], float]) -> list[Band]:
    """Compensation calls of two or more entries whose times overlap: what ran together."""
    calls = sorted(
        (a.time, a.time + timedelta(milliseconds=a.duration_milliseconds), e.spec.stack_position)
        for e in entries
        for a in e.status.attempts
        if a.kind == AttemptKind.COMPENSATION
    )
    groups: list[tuple[datetime, datetime, set[int]]] = []
    for began, ended, position in calls:
        if groups and began < groups[-1][1]:
            first, last, positions = groups[-1]
            groups[-1] = (first, max(last, ended), positions | {position})
        else:
            groups.append((began, ended, {position}))
    return [
        Band(x(first), max(MIN_BAR, x(last) - x(first)), "ran together: " + ", ".join(f"#{n}" for n in ran))
        for first, last, together in groups
        if len(ran := sorted(together, reverse=True)) > 1
    ]


# -- the dependency graph ---------------------------------------------------------------------------

NODE_WIDTH, NODE_HEIGHT, COLUMN, ROW = 170.0, 30.0, 230.0, 44.0


@dataclass(frozen=True)
class Node:
    x: float
    y: float
    label: str  # "#2 assign_permissions"
    state: str  # the entry's compensation state, lower case: a CSS class


@dataclass(frozen=True)
class Edge:
    x1: float
    y1: float
    x2: float
    y2: float
    label: str


@dataclass(frozen=True)
class Graph:
    width: float
    height: float
    nodes: list[Node]
    edges: list[Edge]
    needs: dict[str, list[str]]  # "#3 c" -> what it depends on directly: the picture as text


def direct_dependencies(entries: Sequence[UndoEntry]) -> dict[str, list[UndoEntry]]:
    """What each entry depends on (by entry name), lowest first, leaving out what it depends on
    through another of them (a -> b -> c draws no a -> c)."""
    ordered = sorted(entries, key=lambda e: e.spec.stack_position)
    declared = declared_dependencies(ordered)
    reach: dict[str, set[str]] = {}
    direct: dict[str, list[UndoEntry]] = {}
    for upper in ordered:
        below = [lower for lower in ordered if depends(upper, lower, declared)]
        names = {lower.metadata.name for lower in below}
        reach[upper.metadata.name] = names.union(*(reach[n] for n in names))
        direct[upper.metadata.name] = [
            lower for lower in below if not any(lower.metadata.name in reach[n] for n in names)
        ]
    return direct


def graph(entries: Sequence[UndoEntry]) -> Graph | None:
    """The steps as boxes in columns by how long their chain of dependencies is (the first steps
    left), an arrow from each to the steps that depend on it (undone before it). None unless a
    step declares dependsOn, or past MAX_GRAPH_NODES."""
    if not any(e.spec.depends_on is not None for e in entries) or len(entries) > MAX_GRAPH_NODES:
        return None
    direct = direct_dependencies(entries)
    column: dict[str, int] = {}
    for entry in sorted(entries, key=lambda e: e.spec.stack_position):
        needs = direct[entry.metadata.name]
        column[entry.metadata.name] = 1 + max((column[n.metadata.name] for n in needs), default=-1)
    rows: dict[int, int] = {}
    placed: dict[str, Node] = {}
    for entry in sorted(entries, key=lambda e: e.spec.stack_position):
        at = column[entry.metadata.name]
        row = rows[at] = rows.get(at, -1) + 1
        label = f"#{entry.spec.stack_position} {entry.spec.step}"
        placed[entry.metadata.name] = Node(at * COLUMN, row * ROW, label, entry.status.state.value.lower())
    edges = [
        Edge(
            placed[lower.metadata.name].x + NODE_WIDTH,
            placed[lower.metadata.name].y + NODE_HEIGHT / 2,
            placed[name].x,
            placed[name].y + NODE_HEIGHT / 2,
            f"{placed[name].label} depends on {placed[lower.metadata.name].label}: undone before it",
        )
        for name, lowers in direct.items()
        for lower in lowers
    ]
    width = (max(column.values()) + 1) * COLUMN
    height = (max(rows.values()) + 1) * ROW
    text = {placed[n].label: [placed[lower.metadata.name].label for lower in lowers] for n, lowers in direct.items()}
    return Graph(width, height, list(placed.values()), edges, text)


# -- the overview's bars ----------------------------------------------------------------------------

BAR_LABELS, BAR_LENGTH, BAR_ROW = 130.0, 420.0, 24.0
COLUMN_WIDTH, COLUMN_HEIGHT, COLUMN_TOP = 44.0, 120.0, 18.0  # the top: room for the tallest's count


@dataclass(frozen=True)
class Count:
    """One bar of a chart: where it is drawn, its name and its value (drawn beside it)."""

    x: float
    y: float
    width: float
    height: float
    name: str
    value: int
    kind: str  # a CSS class (the phase, in lower case)


@dataclass(frozen=True)
class Chart:
    width: float
    height: float
    counts: list[Count]


def bars(rows: Sequence[tuple[str, int, str]]) -> Chart:
    """Horizontal bars, one a row (name, value, kind), as long as their value against the largest."""
    largest = max([1, *(value for _, value, _ in rows)])
    counts = [
        Count(BAR_LABELS, i * BAR_ROW, max(0.0, BAR_LENGTH * value / largest), BAR_ROW - 6, name, value, kind)
        for i, (name, value, kind) in enumerate(rows)
    ]
    return Chart(BAR_LABELS + BAR_LENGTH + 60, len(rows) * BAR_ROW, counts)


def columns(steps: Sequence[tuple[datetime, int]], moment: datetime) -> Chart:
    """Columns on a time axis, one a step, as tall as their count against the largest; each
    named by the minutes before `moment` its step began ("-60")."""
    largest = max([1, *(count for _, count in steps)])
    counts = [
        Count(
            i * COLUMN_WIDTH,
            COLUMN_TOP + COLUMN_HEIGHT - COLUMN_HEIGHT * count / largest,
            COLUMN_WIDTH - 6,
            COLUMN_HEIGHT * count / largest,
            f"-{round((moment - began).total_seconds() / 60)}",
            count,
            "compensated",
        )
        for i, (began, count) in enumerate(steps)
    ]
    return Chart(len(steps) * COLUMN_WIDTH, COLUMN_TOP + COLUMN_HEIGHT + 30, counts)
