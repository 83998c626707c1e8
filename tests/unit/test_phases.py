"""The saga state machine and LIFO planning, driven to the end with simulated outcomes; the
completeness rule (no compensation without a listing, no Compensated without a fresh one)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from undolog.api import EntryReason, EntryState, Saga, SagaPhase, SagaReason, UndoEntry
from undolog.conventions import FINALIZER, PHASE_LABEL, RETRY_ANNOTATION, SKIP_ANNOTATION, UNDO_ANYWAY_ANNOTATION
from undolog.decisions import compensation_plan, moves, phases, resolutions
from undolog.decisions.moves import EntryProof
from undolog.decisions.stack import Stack

FRESH = EntryProof.FRESH

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def make_saga(phase: str | None = "Active", **spec: Any) -> Saga:
    labels = {PHASE_LABEL: phase.lower()} if phase else {}
    return Saga.model_validate(
        {
            "metadata": {
                "name": "s",
                "namespace": "ns",
                "uid": "uid-1",
                "labels": labels,
                "finalizers": [FINALIZER],
                "creationTimestamp": NOW.isoformat(),
            },
            "spec": spec,
            "status": {"phase": phase, "startTime": NOW.isoformat()} if phase else {},
        }
    )


def make_entry(
    position: int,
    state: str = "Pending",
    compensation: bool = True,
    effect: str = "Committed",
    depends_on: list[str] | None = None,
) -> UndoEntry:
    spec: dict[str, Any] = {
        "saga": "s",
        "undoId": str(uuid.uuid4()),
        "stackPosition": position,
        "effectId": f"uid-1:step{position}:fwd",
        "step": f"step{position}",
        "registeredAt": NOW.isoformat(),
    }
    if compensation:
        spec["compensation"] = {"function": "undo"}
    if depends_on is not None:
        spec["dependsOn"] = depends_on
    return UndoEntry.model_validate(
        {"metadata": {"name": f"s-{position}"}, "spec": spec, "status": {"state": state, "effect": effect}}
    )


def with_state(entry: UndoEntry, state: str) -> UndoEntry:
    return entry.model_copy(update={"status": entry.status.model_copy(update={"state": state})})


def test_first_sight_holds_the_finalizer_then_initializes_then_labels() -> None:
    fresh = make_saga(None)
    assert isinstance(phases.decide(fresh, [], NOW), moves.Initialize)
    fresh.metadata.finalizers.clear()
    assert phases.decide(fresh, [], NOW) == moves.SyncMetadata({PHASE_LABEL: "active"}, [FINALIZER])
    active = make_saga("Active").model_copy(update={"metadata": make_saga(None).metadata})
    assert phases.decide(active, [], NOW) == moves.SyncMetadata({PHASE_LABEL: "active"}, [FINALIZER])


def test_a_saga_that_failed_before_its_first_status_goes_straight_to_compensating() -> None:
    """Aborted while the operator was down: no Active write first (a proof of its entries still)."""
    entries = [make_entry(1), make_entry(2)]
    aborted = make_saga(None, outcome="Abort")
    assert phases.decide(aborted, entries, NOW) == moves.ProveEntries()
    move = phases.decide(aborted, entries, NOW, EntryProof.STALE)
    assert isinstance(move, moves.Transition)
    assert (move.phase, move.reason) == (SagaPhase.COMPENSATING, SagaReason.ABORTED)
    late = make_saga(None, activeDeadlineSeconds=60)
    assert isinstance(phases.decide(late, entries, NOW + timedelta(seconds=61), EntryProof.STALE), moves.Transition)
    orchestrated = make_saga(None, outcome="Abort", steps=[{"name": "a", "action": {"function": "f"}}])
    assert isinstance(phases.decide(orchestrated, [], NOW + timedelta(seconds=5)), moves.Initialize)


def test_a_listing_after_a_copy_proves_what_that_copy_showed_by_then() -> None:
    assert phases.proof_due_by(make_saga(None, outcome="Abort"), NOW)
    assert phases.proof_due_by(make_saga(outcome="Commit"), NOW)
    assert phases.proof_due_by(make_saga("Compensating"), NOW)
    assert not phases.proof_due_by(make_saga(), NOW)
    # A deadline passed after the listing is a failure after it: the listing proves nothing then.
    expiring = make_saga(activeDeadlineSeconds=60)
    assert not phases.proof_due_by(expiring, NOW + timedelta(seconds=59))
    assert phases.proof_due_by(expiring, NOW + timedelta(seconds=61))


def test_active_saga_moves() -> None:
    # A failure is written with the start of its compensation, once a LIST has shown every entry.
    assert phases.decide(make_saga(outcome="Abort"), [], NOW) == moves.ProveEntries()
    assert phases.decide(make_saga(outcome="Abort"), [make_entry(1)], NOW, FRESH) == moves.Transition(
        SagaPhase.COMPENSATING, SagaReason.ABORTED, "spec.outcome is Abort; undoing 1 entry"
    )
    # A commit is recorded on a proven stack: an entry above its top came later.
    assert phases.decide(make_saga(outcome="Commit"), [], NOW) == moves.ProveEntries()
    assert phases.decide(make_saga(outcome="Commit"), [], NOW, FRESH) == moves.Transition(
        SagaPhase.COMPLETED, SagaReason.COMMITTED, "spec.outcome is Commit"
    )
    assert phases.decide(make_saga(), [make_entry(1)], NOW) == moves.UpdateDepth(1)
    late = make_saga(activeDeadlineSeconds=5)
    assert phases.decide(late, [], NOW + timedelta(seconds=4)) == moves.Wait(until=NOW + timedelta(seconds=5))
    expired = phases.decide(late, [], NOW + timedelta(seconds=5), FRESH)
    assert isinstance(expired, moves.Transition)
    assert (expired.phase, expired.reason) == ("Compensating", "DeadlineExceeded")


def test_deleting_an_active_saga_fails_it_first() -> None:
    saga = make_saga()
    saga.metadata.deletion_timestamp = NOW
    move = phases.decide(saga, [], NOW, FRESH)
    assert isinstance(move, moves.Transition)
    assert (move.phase, move.reason) == ("Compensating", "Deleted")


entry_sets = st.lists(
    st.tuples(st.booleans(), st.sampled_from(["Pending", "Running", "Compensated", "Skipped"])),
    min_size=0,
    max_size=12,
)


@given(entry_sets, st.sets(st.integers(1, 12)), st.sampled_from(["Halt", "Continue"]), st.randoms())
def test_compensation_is_lifo_complete_and_halts_as_the_policy_says(
    specs: list[tuple[bool, str]], failing: set[int], policy: str, rng: Any
) -> None:
    positions = sorted(rng.sample(range(1, 1000), len(specs)))
    entries = {p: make_entry(p, state, compensation) for p, (compensation, state) in zip(positions, specs, strict=True)}
    owed_at_start = {p for p, e in entries.items() if e.status.state in compensation_plan.OWED}
    saga = make_saga("Compensating", compensationPolicy={"onFailure": policy})
    order: list[int] = []
    for _ in range(100):
        move = phases.decide(saga, list(entries.values()), NOW, FRESH)
        if not isinstance(move, moves.CompensateEntries):
            break
        (entry,) = move.entries  # without dependsOn, one at a time
        position = entry.spec.stack_position
        order.append(position)
        fails = position in failing and entry.spec.compensation is not None
        entries[position] = with_state(entry, "Failed" if fails else "Compensated")
    assert isinstance(move, moves.Transition)
    assert order == sorted(order, reverse=True)  # strictly newest first, each once
    assert len(set(order)) == len(order)
    failed = [p for p in order if entries[p].status.state == "Failed"]
    if not failed:
        assert move.phase == "Compensated"
        assert set(order) == owed_at_start
    elif policy == "Halt":
        assert move.phase == "Halted"
        assert order[-1] == failed[0]  # nothing below the failure was touched
        assert all(
            entries[p].status.state == "Pending" or entries[p].status.state == "Running"
            for p in owed_at_start - set(order)
        )
    else:
        assert move.phase == "Halted"
        assert set(order) == owed_at_start  # Continue: everything owed was tried


def test_halt_message_names_entry_function_and_error() -> None:
    failed = make_entry(2, "Failed")
    failed.status.last_error = "HTTP 400: nope"
    move = phases.decide(make_saga("Compensating"), [make_entry(1), failed], NOW, FRESH)
    assert isinstance(move, moves.Transition)
    assert move.phase == "Halted"
    assert move.reason == "CompensationFailed"
    assert "entry s-2 (step step2, undo v1) could not be compensated: HTTP 400: nope" in move.message
    assert "undolog retry s -n ns" in move.message
    assert "undolog skip s 2 -n ns" in move.message


def test_resolutions_apply_only_to_halted_sagas() -> None:
    halted = make_saga("Halted")
    halted.metadata.annotations[RETRY_ANNOTATION] = "ticket 9"
    assert phases.decide(halted, [], NOW) == moves.Retry("ticket 9", SagaPhase.COMPENSATING)
    active = make_saga("Active")
    active.metadata.annotations[RETRY_ANNOTATION] = "x"
    assert isinstance(phases.decide(active, [], NOW), moves.RefuseAnnotation)

    entry = make_entry(1, "Failed")
    entry.metadata.annotations[SKIP_ANNOTATION] = "done by hand"
    assert phases.decide(make_saga("Halted"), [entry], NOW) == moves.SkipEntry(
        entry, "done by hand", SagaPhase.COMPENSATING
    )
    compensated = with_state(entry, "Compensated")
    move = phases.decide(make_saga("Halted"), [compensated], NOW)
    assert isinstance(move, moves.RefuseAnnotation)
    assert "only a Pending or Failed entry of a Halted saga" in move.message
    # The CLI and the dashboard refuse with the same words (decisions.resolutions).


def test_final_sagas_release_their_finalizer_then_rest() -> None:
    move = phases.decide(make_saga("Compensated"), [make_entry(1, "Compensated")], NOW)
    # The label is right; the finalizer goes, and with it the field owners (kept forever: the entries' too).
    assert move == moves.SyncMetadata({}, [], final=True, entries_too=True)
    done = make_saga("Completed")
    done.metadata.finalizers.clear()
    assert phases.decide(done, [make_entry(1)], NOW) == moves.Wait(finished=True)


def test_an_entry_registered_after_compensation_reopens_it() -> None:
    move = phases.decide(make_saga("Compensated"), [make_entry(1, "Compensated"), make_entry(2)], NOW)
    assert move == moves.Transition(
        SagaPhase.COMPENSATING, SagaReason.LATE_ENTRY, "entry s-2 was registered after the saga was compensated"
    )


def test_an_entry_registered_after_completion_is_recorded_once() -> None:
    done = make_saga("Completed")
    done.metadata.finalizers.clear()
    done.status.top_position = 1
    late = make_entry(2)
    assert phases.decide(done, [make_entry(1), late], NOW) == moves.RecordLateEntry(late)
    assert phases.decide(done, [make_entry(1), with_state(late, "Skipped")], NOW) == moves.Wait(finished=True)


@st.composite
def dependency_stacks(draw: st.DrawFn) -> list[UndoEntry]:
    """A stack of up to 12 entries, each depending on everything below (no dependsOn), on
    nothing, or on some lower steps (sometimes naming a step that is not below it)."""
    size = draw(st.integers(1, 12))
    entries = []
    for position in range(1, size + 1):
        lower = [f"step{p}" for p in range(1, position)]
        kind = draw(st.sampled_from(["all", "none", "some", "unknown"]))
        named = {
            "all": None,
            "none": [],
            "some": draw(st.lists(st.sampled_from(lower), unique=True)) if lower else [],
            "unknown": [*draw(st.lists(st.sampled_from(lower), unique=True, max_size=2)), f"step{position + 1}"]
            if lower
            else None,
        }[kind]
        entries.append(make_entry(position, depends_on=named))
    return entries


def must_wait(upper: UndoEntry, lower: UndoEntry) -> bool:
    """The oracle, written apart from the rule: `upper` is undone before `lower`."""
    if upper.spec.stack_position <= lower.spec.stack_position:
        return False
    named = upper.spec.depends_on
    trusted = named is not None and all(int(n.removeprefix("step")) < upper.spec.stack_position for n in named)
    return not trusted or lower.spec.step in (named or [])


@given(dependency_stacks(), st.sets(st.integers(1, 12), max_size=3), st.sampled_from(["Halt", "Continue"]))
def test_compensation_follows_the_dependency_order_and_runs_independent_entries_together(
    stack: list[UndoEntry], failing: set[int], policy: str
) -> None:
    entries = {e.spec.stack_position: e for e in stack}
    saga = make_saga("Compensating", compensationPolicy={"onFailure": policy})
    done: set[int] = set()
    for _ in range(100):
        move = phases.decide(saga, list(entries.values()), NOW, FRESH)
        if not isinstance(move, moves.CompensateEntries):
            break
        assert 1 <= len(move.entries) <= compensation_plan.PARALLEL
        for entry in move.entries:
            waiting = [u for u in stack if must_wait(u, entry)]
            settled = {"Compensated", "Skipped"} | ({"Failed"} if policy == "Continue" else set())
            assert all(entries[u.spec.stack_position].status.state in settled for u in waiting), (
                entry.spec.stack_position,
                [u.spec.stack_position for u in waiting],
            )
        # Everything the rule let go at once is independent: none must wait for another of them.
        assert not any(must_wait(a, b) for a in move.entries for b in move.entries)
        for entry in move.entries:
            position = entry.spec.stack_position
            entries[position] = with_state(entry, "Failed" if position in failing else "Compensated")
            done.add(position)
    assert isinstance(move, moves.Transition)
    failed = {p for p, e in entries.items() if e.status.state == "Failed"}
    if not failed:
        assert move.phase == "Compensated"
        assert done == set(entries)
    else:
        assert move.phase == "Halted"
        if policy == "Continue":
            assert done == set(entries)  # the rest went on first
        else:  # nothing that had to wait for a failed entry was touched
            assert not any(must_wait(entries[f], entries[p]) for f in failed for p in done)


def test_independent_entries_go_together_and_the_plan_shows_waves() -> None:
    independent = [make_entry(p, depends_on=[]) for p in range(1, 13)]
    move = phases.decide(make_saga("Compensating"), independent, NOW, FRESH)
    assert isinstance(move, moves.CompensateEntries)
    assert [e.spec.stack_position for e in move.entries] == list(range(12, 2, -1))  # PARALLEL at once, newest first
    diamond = [
        make_entry(1),
        make_entry(2, depends_on=["step1"]),
        make_entry(3, depends_on=["step1"]),
        make_entry(4, depends_on=["step2", "step3"]),
    ]
    waves = [[e.spec.stack_position for e in wave] for wave in compensation_plan.waves(diamond)]
    assert waves == [[4], [3, 2], [1]]
    lifo = [make_entry(p) for p in (1, 2, 3)]
    assert [[e.spec.stack_position for e in w] for w in compensation_plan.waves(lifo)] == [[3], [2], [1]]


proofs = st.sampled_from(list(EntryProof))


@given(entry_sets, proofs, st.sampled_from(["Failed", "Compensating"]))
def test_nothing_is_compensated_unlisted_and_nothing_declared_compensated_on_an_old_listing(
    specs: list[tuple[bool, str]], proof: EntryProof, phase: str
) -> None:
    """The completeness rule: a watch may lag, so only a consistent LIST since the failure lets a
    compensation start (LIFO from the real top), and only one since the last call ends it."""
    entries = [make_entry(p, state, compensation) for p, (compensation, state) in enumerate(specs, start=1)]
    move = phases.decide(make_saga(phase), entries, NOW, proof)
    if proof == EntryProof.NONE:
        assert move == moves.ProveEntries()
    if isinstance(move, moves.CompensateEntries):
        assert proof != EntryProof.NONE
        assert [e.spec.stack_position for e in move.entries] == [
            max(e.spec.stack_position for e in entries if e.status.state in compensation_plan.OWED)
        ]
    if isinstance(move, moves.Transition) and move.phase == SagaPhase.COMPENSATED:
        assert proof == EntryProof.FRESH
        assert not compensation_plan.owed(entries)


def test_conditions_keep_the_failure_reason_while_compensating() -> None:
    saga = make_saga("Active")
    failed = phases.with_phase(
        saga.status, SagaPhase.FAILED, reason=SagaReason.ABORTED, message="m", now=NOW, generation=2
    )
    later = NOW + timedelta(seconds=3)
    compensated = phases.with_phase(
        failed, SagaPhase.COMPENSATED, reason=SagaReason.COMPENSATED, message="ok", now=later, generation=2
    )
    by_type = {c.type: c for c in compensated.conditions}
    assert (by_type["Succeeded"].status, by_type["Succeeded"].reason) == ("False", "Aborted")
    assert by_type["Succeeded"].last_transition_time == NOW
    assert (by_type["Compensated"].status, by_type["Compensated"].reason) == ("True", "Compensated")
    assert compensated.completion_time == later


@given(
    st.lists(st.sampled_from(["Pending", "Running", "Compensated", "Skipped", "Failed"]), max_size=30), st.booleans()
)
def test_the_lifo_plan_without_sorting_is_the_dependency_plan_without_dependencies(
    states: list[str], failed_blocks: bool
) -> None:
    entries = [with_state(make_entry(position), state) for position, state in enumerate(states, start=1)]
    done = compensation_plan.SETTLED if failed_blocks else compensation_plan.SETTLED | {EntryState.FAILED}
    lifo = compensation_plan.lifo_ready(Stack(entries), failed_blocks=failed_blocks)
    assert lifo == compensation_plan.dependency_ready(entries, done)


def test_entries_the_saga_does_not_own_halt_it_instead_of_compensated() -> None:
    """Entries naming the saga that it does not own were never compensated: their effects may
    remain, so the saga halts for a person (UnownedEntries); it reads Compensated once none is left."""
    saga = make_saga("Compensating")
    saga.status.unowned_entries = ["s-2"]
    move = phases.decide(saga, [make_entry(1, "Compensated")], NOW, FRESH)
    assert isinstance(move, moves.Transition)
    assert (move.phase, move.reason) == (SagaPhase.HALTED, SagaReason.UNOWNED_ENTRIES)
    assert move.message.startswith("s-2 names this saga in spec.saga but it does not own it (no ownerReference to uid")
    assert move.message.endswith(f"`kubectl annotate saga s {RETRY_ANNOTATION}=<what you did>`")
    saga.status.unowned_entries = []
    move = phases.decide(saga, [make_entry(1, "Compensated")], NOW, FRESH)
    assert isinstance(move, moves.Transition)
    assert move.phase == SagaPhase.COMPENSATED


def test_a_conflict_halts_naming_the_three_ways_out_and_only_a_conflict_may_be_undone_anyway() -> None:
    conflict = make_entry(2, "Failed")
    conflict.status.reason = EntryReason.CONFLICT
    conflict.status.last_error = "what the step left has changed since: replicas differ. " + (
        resolutions.how_to_resolve_conflict(make_saga("Halted"), conflict)
    )
    move = phases.decide(make_saga("Compensating"), [make_entry(1), conflict], NOW, FRESH)
    assert isinstance(move, moves.Transition)
    assert (move.phase, move.reason) == (SagaPhase.HALTED, SagaReason.CONFLICT)
    assert "entry s-2 (step step2) was not undone: what the step left has changed since" in move.message
    for way in ("undolog skip s 2 -n ns", "undolog undo-anyway s 2 -n ns", "undolog retry s -n ns"):
        assert way in move.message

    conflict.metadata.annotations[UNDO_ANYWAY_ANNOTATION] = "the autoscaler's change is wrong"
    assert phases.decide(make_saga("Halted"), [make_entry(1), conflict], NOW) == moves.UndoAnyway(
        conflict, "the autoscaler's change is wrong", SagaPhase.COMPENSATING
    )
    failed = make_entry(2, "Failed")  # failed for another reason: no conflict to override
    failed.metadata.annotations[UNDO_ANYWAY_ANNOTATION] = "x"
    move = phases.decide(make_saga("Halted"), [make_entry(1), failed], NOW)
    assert isinstance(move, moves.RefuseAnnotation)
    assert "only an entry of a Halted saga that failed as Conflict" in move.message
