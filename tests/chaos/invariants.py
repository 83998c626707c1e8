"""The invariants every fault-injection run is checked against, over the participants' own
records (what actually arrived, in what order, under which key) and the final objects.

1. Every saga ends Completed or Compensated, or Halted with a reason.
2. Every effect that happened (its forward call arrived, or its entry says it committed) is
   compensated exactly once in net when its saga is Compensated: a repeat only under the same
   Idempotency-Key; and nothing of a Completed saga is compensated.
3. No compensation runs out of LIFO order: an entry's first compensation call arrives only after
   every higher entry's compensation succeeded.

Pure: records and objects in, violations out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

Body = dict[str, Any]


@dataclass(frozen=True)
class Call:
    """One request as the participant saw it."""

    key: str
    saga: str  # <namespace>/<name>
    step: str
    at: float
    replied: int  # the HTTP status the participant answered (0: connection reset, no answer)


@dataclass
class Report:
    sagas: int = 0
    effects_checked: int = 0
    compensations_checked: int = 0
    violations: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "sagas": self.sagas,
            "effects_checked": self.effects_checked,
            "compensations_checked": self.compensations_checked,
            "violations": len(self.violations),
        }


def check(sagas: Sequence[Body], entries: Sequence[Body], forward: Iterable[Call], undo: Iterable[Call]) -> Report:
    """Check the three invariants. `forward` and `undo` are the calls that reached the
    participants' action and compensation endpoints."""
    report = Report(sagas=len(sagas))
    by_saga: dict[str, list[Body]] = defaultdict(list)
    for entry in entries:
        by_saga[f"{entry['metadata']['namespace']}/{entry['spec']['saga']}"].append(entry)
    undo_by_key: dict[str, list[Call]] = defaultdict(list)
    for call in undo:
        undo_by_key[call.key].append(call)
    forward_by_saga: dict[str, list[Call]] = defaultdict(list)
    for call in forward:
        forward_by_saga[call.saga].append(call)
    known_undo_keys: set[str] = set()

    for saga in sagas:
        ref = f"{saga['metadata']['namespace']}/{saga['metadata']['name']}"
        status = saga.get("status", {})
        phase = status.get("phase")
        if phase not in ("Completed", "Compensated") and not (phase == "Halted" and status.get("reason")):
            report.violations.append(f"{ref} ended {phase} (reason {status.get('reason')!r})")
        # Forward calls: one key per step; duplicates only under that key.
        steps: dict[str, set[str]] = defaultdict(set)
        for call in forward_by_saga[ref]:
            steps[call.step].add(call.key)
        for step, keys in steps.items():
            if len(keys) > 1:
                report.violations.append(f"{ref} step {step} was sent under {len(keys)} keys: {sorted(keys)}")
        stack = sorted(by_saga[ref], key=lambda e: e["spec"]["stackPosition"], reverse=True)
        happened_steps = {call.step for call in forward_by_saga[ref]}
        for entry in stack:
            if entry["spec"].get("compensation") is None:
                continue
            key = f"undo-{entry['spec']['undoId']}"
            known_undo_keys.add(key)
            effect = entry.get("status", {}).get("effect", "Pending")
            happened = effect in ("Committed", "Executing", "Failed") or entry["spec"]["step"] in happened_steps
            calls = undo_by_key.get(key, [])
            if happened:
                report.effects_checked += 1
            if phase == "Completed" and calls:
                report.violations.append(
                    f"{ref}: entry {entry['metadata']['name']} of a Completed saga was compensated"
                )
            if phase == "Compensated" and happened:
                state = entry.get("status", {}).get("state")
                succeeded = [c for c in calls if 200 <= c.replied < 300]
                if state == "Compensated" and not succeeded:
                    report.violations.append(f"{ref}: {entry['metadata']['name']} is Compensated but no call succeeded")
                if state not in ("Compensated", "Skipped"):
                    report.violations.append(f"{ref}: {entry['metadata']['name']} is {state} in a Compensated saga")
                report.compensations_checked += 1
        report.violations.extend(lifo_violations(ref, stack, undo_by_key))
    for key, calls in undo_by_key.items():
        if key not in known_undo_keys:
            report.violations.append(f"compensation under unknown key {key} ({len(calls)} calls)")
    return report


def lifo_violations(ref: str, stack: Sequence[Body], undo_by_key: dict[str, list[Call]]) -> list[str]:
    """Under LIFO an entry's first compensation call comes after the higher entries' successes."""
    violations = []
    done_at: float | None = None  # when the entries above had all succeeded
    above = ""
    for entry in stack:  # highest position first
        compensation = entry["spec"].get("compensation")
        if compensation is None:
            continue
        calls = sorted(undo_by_key.get(f"undo-{entry['spec']['undoId']}", []), key=lambda c: c.at)
        if not calls:
            continue
        if done_at is not None and calls[0].at < done_at:
            violations.append(
                f"{ref}: {entry['metadata']['name']} was compensated before {above} had succeeded (LIFO broken)"
            )
        succeeded = [c.at for c in calls if 200 <= c.replied < 300]
        if succeeded:
            done_at = max(done_at or 0.0, min(succeeded))
            above = entry["metadata"]["name"]
    return violations
