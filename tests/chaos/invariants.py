"""The invariants every fault-injection run is checked against, over the participants' own
records (what actually arrived, in what order, under which key) and the final objects.

1. Every saga ends Completed or Compensated, or Halted with a reason.
2. Every effect that happened (its forward call arrived, or its entry says it committed) is
   compensated exactly once in net when its saga is Compensated: a repeat only under the same
   Idempotency-Key; and nothing of a Completed saga is compensated.
3. No compensation runs out of order: an entry's first compensation call arrives only after
   the compensation of every entry that must be undone before it succeeded (every higher entry
   under LIFO; with dependsOn, the ones that depend on it).
4. An entry that names a saga without being owned by it is never compensated, says why
   (NotOwnedBySaga) and is named on the saga (status.unownedEntries).

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
        uid = saga["metadata"].get("uid")
        named = by_saga[ref]
        report.violations.extend(unowned_violations(ref, [e for e in named if not owned(e, uid)], status))
        stack = sorted((e for e in named if owned(e, uid)), key=lambda e: e["spec"]["stackPosition"], reverse=True)
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
            # A saga halted for entries not its own has settled every entry it owns first.
            settled_all = phase == "Compensated" or (phase == "Halted" and status.get("reason") == "UnownedEntries")
            if settled_all and happened:
                state = entry.get("status", {}).get("state")
                succeeded = [c for c in calls if 200 <= c.replied < 300]
                if state == "Compensated" and not succeeded:
                    report.violations.append(f"{ref}: {entry['metadata']['name']} is Compensated but no call succeeded")
                if state not in ("Compensated", "Skipped"):
                    report.violations.append(f"{ref}: {entry['metadata']['name']} is {state} in a {phase} saga")
                report.compensations_checked += 1
        report.violations.extend(order_violations(ref, stack, undo_by_key))
    for key, calls in undo_by_key.items():
        if key not in known_undo_keys:
            report.violations.append(f"compensation under unknown key {key} ({len(calls)} calls)")
    return report


def owned(entry: Body, uid: str | None) -> bool:
    """The saga's own entry: its ownerReferences carry the saga's uid (what ties them)."""
    return any(o.get("kind") == "Saga" and o.get("uid") == uid for o in entry["metadata"].get("ownerReferences", []))


def unowned_violations(ref: str, unowned: Sequence[Body], status: Body) -> list[str]:
    """An entry that names the saga without being its own is never compensated by it, says why,
    and is named on the saga (its calls, had there been any, are under keys the check never
    learns: counted as unknown keys)."""
    violations = []
    listed = set(status.get("unownedEntries") or [])
    for entry in unowned:
        name, state = entry["metadata"]["name"], entry.get("status", {}).get("state", "Pending")
        if state != "Pending" or entry.get("status", {}).get("reason") != "NotOwnedBySaga":
            violations.append(
                f"{ref}: {name}, not its own, is {state} with reason {entry.get('status', {}).get('reason')}"
            )
        if name not in listed:
            violations.append(f"{ref}: {name}, not its own, is not named in status.unownedEntries")
    return violations


def order_violations(ref: str, stack: Sequence[Body], undo_by_key: dict[str, list[Call]]) -> list[str]:
    """An entry's first compensation call comes only after every entry that must be undone
    before it has succeeded, transitively: with `dependsOn`, the higher entries that name its
    step; without it (or naming a step that is not below it), every higher entry (LIFO).
    Written apart from the operator's rule, over the raw objects."""
    ascending = sorted(stack, key=lambda e: e["spec"]["stackPosition"])
    below: dict[str, set[str]] = {}
    seen: set[str] = set()
    for entry in ascending:
        below[entry["metadata"]["name"]] = set(seen)
        seen.add(entry["spec"]["step"])

    def waits(upper: Body, lower: Body) -> bool:
        if upper["spec"]["stackPosition"] <= lower["spec"]["stackPosition"]:
            return False
        named = upper["spec"].get("dependsOn")
        if named is None or not set(named) <= below[upper["metadata"]["name"]]:
            return True
        return bool(lower["spec"]["step"] in named)

    before: dict[str, set[str]] = {}  # name -> every entry that must be undone before it
    for lower in reversed(ascending):
        direct = [u["metadata"]["name"] for u in ascending if waits(u, lower)]
        before[lower["metadata"]["name"]] = set(direct).union(*(before[u] for u in direct))
    calls_of = {
        e["metadata"]["name"]: sorted(undo_by_key.get(f"undo-{e['spec']['undoId']}", []), key=lambda c: c.at)
        for e in stack
        if e["spec"].get("compensation") is not None
    }
    first_success = {
        name: min(c.at for c in calls if 200 <= c.replied < 300)
        for name, calls in calls_of.items()
        if any(200 <= c.replied < 300 for c in calls)
    }
    violations = []
    for entry in reversed(ascending):
        name = entry["metadata"]["name"]
        calls = calls_of.get(name)
        if not calls:
            continue
        early = [(first_success[u], u) for u in before[name] if u in first_success and calls[0].at < first_success[u]]
        if early:
            violations.append(f"{ref}: {name} was compensated before {max(early)[1]} had succeeded (order broken)")
    return violations


def archive_violations(rows: Sequence[Body], observed: dict[str, set[str]], remaining: set[str]) -> list[str]:
    """The archive's promise, over its rows and what the run saw in etcd: every row holds
    exactly the entries its saga had (names seen in etcd for its uid, from listings taken while
    the run went on), and every saga gone from etcd has a row. `rows`: {uid, name, entries};
    `observed`: entry names by saga uid; `remaining`: uids still in etcd. Written apart from the
    operator's rule (which counts stackDepth), over the raw objects."""
    violations = []
    archived = {row["uid"]: row for row in rows}
    for uid, names in observed.items():
        row = archived.get(uid)
        if row is None:
            if uid not in remaining:
                violations.append(f"saga uid {uid} was deleted from etcd with no archive row")
            continue
        held = {e["metadata"]["name"] for e in row["entries"]}
        if held != names:
            violations.append(
                f"{row['name']} (uid {uid}): its row holds {sorted(held)}, its saga had {sorted(names)}"
                + ("; deleted from etcd" if uid not in remaining else "")
            )
    return violations
