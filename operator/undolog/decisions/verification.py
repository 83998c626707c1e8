"""Verifying an orchestrated saga's compensation paths before production (`undolog verify`):
which runs to make, and what each run must show. Pure: manifests and final objects in.

Each failure point is a variant of the saga run for real against its participants:
- after step k (every Compensatable step before the Pivot): a step is added after step k whose
  function does not exist, so the saga fails there, provably without sending anything, and
  steps k..1 must be undone in the dependency order;
- in the compensation of step j: as "after the last Compensatable step", with step j's
  compensation pointed at a function that does not exist yet, so the saga halts there; the
  function is then registered (as a copy of the real one) and the saga retried, as a person
  would, and everything must still be undone in order, each entry exactly once.
Steps after a committed Pivot are never compensated (forward recovery), so there is no failure
point there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from undolog.api import AttemptKind, Call, EntryState, Saga, SagaPhase, Step, StepType, UndoEntry
from undolog.decisions import compensation_plan

INJECTED_STEP = "undolog-verify-failure"
MISSING_FUNCTION = "undolog-verify-no-such-function"


def broken_function(step: str) -> str:
    """The stand-in function name for step `step`'s compensation in its failure run."""
    return f"undolog-verify-{step.replace('_', '-')}"[:253]


@dataclass(frozen=True)
class FailurePoint:
    label: str  # "after step 2 (assign_permissions)", "in the compensation of create_user"
    suffix: str  # of the variant's saga name: a2, c1
    steps: list[Step]  # the variant's steps
    halts_on: Step | None = None  # the step whose compensation fails first (then is fixed)


def failure_points(steps: Sequence[Step]) -> list[FailurePoint]:
    compensatable = [s for s in steps if s.type == StepType.COMPENSATABLE]
    if not compensatable:
        return []
    missing = Call(function=MISSING_FUNCTION)
    injected = Step(name=INJECTED_STEP, action=missing, compensation=missing)
    points = [
        FailurePoint(f"after step {k} ({s.name})", f"a{k}", [*compensatable[:k], injected])
        for k, s in enumerate(compensatable, start=1)
    ]
    for j, broken in enumerate(compensatable, start=1):
        if broken.compensation is None:  # refused at admission; nothing to break
            continue
        stand_in = broken.compensation.model_copy(update={"function": broken_function(broken.name)})
        variant = [s.model_copy(update={"compensation": stand_in}) if s is broken else s for s in compensatable]
        points.append(FailurePoint(f"in the compensation of {broken.name}", f"c{j}", [*variant, injected], broken))
    return points


def variant_manifest(original: dict[str, Any], point: FailurePoint, name: str) -> dict[str, Any]:
    """The saga manifest of one run: the original's spec with the variant's steps."""
    spec = {k: v for k, v in original.get("spec", {}).items() if k not in ("steps", "outcome", "rewind", "effects")}
    spec["steps"] = [s.model_dump(by_alias=True, exclude_none=True) for s in point.steps]
    return {"apiVersion": original["apiVersion"], "kind": "Saga", "metadata": {"name": name}, "spec": spec}


def undone_in_order(entries: Sequence[UndoEntry]) -> list[str]:
    """The steps compensated, in the order their compensations succeeded."""
    done = [(e.status.compensated_at, e.spec.step) for e in entries if e.status.state == EntryState.COMPENSATED]
    return [step for at, step in sorted((at, step) for at, step in done if at is not None)]


def gaps(point: FailurePoint, saga: Saga, entries: Sequence[UndoEntry]) -> list[str]:
    """What the run shows is wrong: not compensated, an entry left, out of order, more than
    one successful compensation of an entry."""
    found: list[str] = []
    if saga.status.phase != SagaPhase.COMPENSATED:
        found.append(f"ended {saga.status.phase} ({saga.status.reason})")
    ran = [e for e in entries if e.spec.step != INJECTED_STEP]
    for entry in ran:
        if entry.status.state != EntryState.COMPENSATED:
            why = (entry.status.last_error or entry.status.skip_reason or "")[:160]
            found.append(f"{entry.spec.step} is {entry.status.state}, not undone{': ' + why if why else ''}")
        succeeded = [a for a in entry.status.attempts if a.kind == AttemptKind.COMPENSATION and a.status_code]
        if sum(1 for a in succeeded if 200 <= (a.status_code or 0) < 300) > 1:
            found.append(f"{entry.spec.step} was compensated successfully more than once")
    declared = compensation_plan.declared_dependencies(entries)
    for lower in ran:
        attempts = [a.time for a in lower.status.attempts if a.kind == AttemptKind.COMPENSATION]
        if not attempts:
            continue
        for upper in ran:
            done = upper.status.compensated_at
            if compensation_plan.depends(upper, lower, declared) and (done is None or min(attempts) < done):
                found.append(f"{lower.spec.step} was compensated before {upper.spec.step} was (order broken)")
    return found
