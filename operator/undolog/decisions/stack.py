"""A saga's entries, held by name, with what the decisions ask of them kept up to date as they
change: the highest entry in some states, how many are in each state, which carry a person's
skip, whether any declares dependsOn, each step's output. A saga's state machine decides once
per entry compensated and a stack may hold 10,000: answered by walking the entries, each
decision took longer the deeper the stack (bench/deep.py measures it).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from undolog.api import EntryState, UndoEntry
from undolog.conventions import ENTRY_RESOLUTIONS
from undolog.decisions import rewind

States = frozenset[EntryState]
Outputs = Mapping[str, Mapping[str, Any] | None]


class Stack:
    """The entries of one saga (iterating gives the entries, in no order; `[name]` one of them).
    Queries cost the same at any depth: the highest entry per set of states is a max-heap kept
    from the first time that set is asked for (stale tops are dropped as they surface)."""

    __slots__ = ("_annotated", "_declaring", "_entries", "_heaps", "_outputs", "_states", "changed")

    def __init__(self, entries: Iterable[UndoEntry] = ()) -> None:
        self._entries: dict[str, UndoEntry] = {}
        self._heaps: dict[States, list[tuple[int, str]]] = {}
        self._states: Counter[EntryState] = Counter()
        self._annotated: set[str] = set()
        self._declaring = 0  # entries that declare dependsOn
        self._outputs: Outputs | None = None
        self.changed: set[str] = set()  # names put or removed since `taken_changed`
        for entry in entries:
            self.put(entry)
        self.changed.clear()

    @classmethod
    def of(cls, entries: Iterable[UndoEntry]) -> Stack:
        return entries if isinstance(entries, Stack) else cls(entries)

    def __iter__(self) -> Iterator[UndoEntry]:
        return iter(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, entry: object) -> bool:
        """A Collection of entries: whether this copy of the entry is the one held."""
        return isinstance(entry, UndoEntry) and self._entries.get(entry.metadata.name) == entry

    def __getitem__(self, name: str) -> UndoEntry:
        return self._entries[name]

    def put(self, entry: UndoEntry) -> None:
        """Hold this copy of the entry (a new one, or in place of the one held)."""
        name, position, state = entry.metadata.name, entry.spec.stack_position, entry.status.state
        old = self._entries.get(name)
        if old is not None:
            self._forget(old)
        self._entries[name] = entry
        self._states[state] += 1
        if any(key in entry.metadata.annotations for key in ENTRY_RESOLUTIONS):
            self._annotated.add(name)
        if entry.spec.depends_on is not None:
            self._declaring += 1
        for states, heap in self._heaps.items():
            held = old is not None and old.status.state in states and old.spec.stack_position == position
            if state in states and not held:
                heapq.heappush(heap, (-position, name))
        if old is None or _output_of(old) != _output_of(entry):
            self._outputs = None
        self.changed.add(name)

    def pop(self, name: str) -> UndoEntry | None:
        """Let the entry go (it is gone or lost); the heaps drop it when it surfaces."""
        entry = self._entries.pop(name, None)
        if entry is not None:
            self._forget(entry)
            self._outputs = None
            self.changed.add(name)
        return entry

    def replace(self, entries: Iterable[UndoEntry]) -> None:
        """Hold exactly these entries (a listing that proves the saga's entries complete)."""
        listed = {e.metadata.name: e for e in entries}
        for name in [n for n in self._entries if n not in listed]:
            self.pop(name)
        for entry in listed.values():
            self.put(entry)

    def taken_changed(self) -> list[UndoEntry]:
        """The entries put since the last call (those removed are left out), and forget them."""
        changed, self.changed = self.changed, set()
        return [self._entries[n] for n in changed if n in self._entries]

    def highest(self, states: States) -> UndoEntry | None:
        """The entry with the highest stack position among those in `states`."""
        heap = self._heaps.get(states)
        if heap is None:
            heap = [(-e.spec.stack_position, n) for n, e in self._entries.items() if e.status.state in states]
            heapq.heapify(heap)
            self._heaps[states] = heap
        while heap:
            negative, name = heap[0]
            entry = self._entries.get(name)
            if entry is not None and entry.status.state in states and entry.spec.stack_position == -negative:
                return entry
            heapq.heappop(heap)
        return None

    def count(self, states: States) -> int:
        return sum(self._states[state] for state in states)

    def annotated(self) -> list[UndoEntry]:
        """The entries that carry a person's resolution (skip, undo anyway)."""
        return [self._entries[name] for name in self._annotated]

    @property
    def declares_dependencies(self) -> bool:
        """Whether any entry declares dependsOn (without any, the order is strict LIFO)."""
        return self._declaring > 0

    def outputs(self) -> Outputs:
        """What `${steps.<name>.output...}` refers to (rewind.outputs), worked out again only
        after an output, a rewind or the set of entries changed, not after every state."""
        if self._outputs is None:
            self._outputs = rewind.outputs(self._entries.values())
        return self._outputs

    def _forget(self, entry: UndoEntry) -> None:
        self._states[entry.status.state] -= 1
        self._annotated.discard(entry.metadata.name)
        if entry.spec.depends_on is not None:
            self._declaring -= 1


def _output_of(entry: UndoEntry) -> tuple[Any, ...]:
    return entry.spec.step, entry.spec.stack_position, entry.status.rewound_at, entry.status.output
