"""Orchestrated sagas going forward: step order, pivot, forward recovery, effects (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tests.unit.test_phases import make_entry, make_saga, with_state
from undolog.api import EffectStatus, Saga, SagaPhase, SagaReason, Step, UndoEntry
from undolog.decisions import moves, phases
from undolog.decisions.forward import reference_problems
from undolog.decisions.moves import EntryProof

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def step(name: str, type_: str = "Compensatable", **args: Any) -> dict[str, Any]:
    function = name.replace("_", "-")
    body: dict[str, Any] = {"name": name, "type": type_, "action": {"function": f"{function}-do", "args": args}}
    if type_ == "Compensatable":
        body["compensation"] = {"function": f"{function}-undo"}
    return body


FRESH = EntryProof.FRESH
ORDER = [step("reserve"), step("authorize"), step("capture", "Pivot"), step("confirm", "Retriable")]


def orchestrated(phase: str = "Active", steps: list[dict[str, Any]] = ORDER, **spec: Any) -> Saga:
    return make_saga(phase, steps=steps, **spec)


def entry(position: int, effect: str, state: str = "Pending") -> UndoEntry:
    made = make_entry(position, state, compensation=position <= 2, effect=effect)
    return made.model_copy(update={"spec": made.spec.model_copy(update={"step": ORDER[position - 1]["name"]})})


def with_effect(made: UndoEntry, effect: str, error: str | None = None) -> UndoEntry:
    status = made.status.model_copy(update={"effect": effect, "last_error": error})
    return made.model_copy(update={"status": status})


def test_steps_are_registered_then_sent_in_order() -> None:
    saga = orchestrated()
    first = phases.decide(saga, [], NOW)
    assert isinstance(first, moves.RegisterStep)
    assert (first.position, first.step.name) == (1, "reserve")
    sent = phases.decide(saga, [entry(1, "Pending")], NOW)
    assert isinstance(sent, moves.ExecuteStep)
    assert sent.step.name == "reserve"
    resent = phases.decide(saga, [entry(1, "Executing")], NOW)  # in flight at a crash: sent again
    assert isinstance(resent, moves.ExecuteStep)
    nxt = phases.decide(saga, [entry(1, "Committed")], NOW)
    assert isinstance(nxt, moves.RegisterStep)
    assert nxt.position == 2


def test_a_failure_before_the_pivot_fails_the_saga_naming_the_step() -> None:
    failed = with_effect(entry(2, "Failed"), "Failed", "HTTP 402: declined (permanent failure)")
    assert phases.decide(orchestrated(), [entry(1, "Committed"), failed], NOW) == moves.ProveEntries()
    move = phases.decide(orchestrated(), [entry(1, "Committed"), failed], NOW, FRESH)
    assert move == moves.Transition(  # failed and compensating in one write, once every entry is listed
        SagaPhase.COMPENSATING,
        SagaReason.STEP_FAILED,
        "step 'authorize' failed: HTTP 402: declined (permanent failure); undoing 2 entries",
        "authorize",
    )


def test_the_pivot_is_recorded_then_abort_is_refused_once() -> None:
    done = [entry(1, "Committed"), entry(2, "Committed"), entry(3, "Committed")]
    assert isinstance(phases.decide(orchestrated(), done, NOW), moves.MarkPivot)
    marked = orchestrated(outcome="Abort")
    marked.status.pivot_committed = True
    assert isinstance(phases.decide(marked, done, NOW), moves.RefuseAbort)
    marked.status.reason = SagaReason.ABORT_REFUSED
    move = phases.decide(marked, done, NOW)
    assert isinstance(move, moves.RegisterStep)  # forward it goes
    assert move.step.name == "confirm"


def test_deadline_and_delete_only_matter_before_the_pivot() -> None:
    late = NOW + timedelta(seconds=60)
    before = orchestrated(activeDeadlineSeconds=10)
    move = phases.decide(before, [entry(1, "Committed")], late, FRESH)
    assert isinstance(move, moves.Transition)
    assert move.reason == "DeadlineExceeded"
    after = orchestrated(activeDeadlineSeconds=10)
    after.status.pivot_committed = True
    done = [entry(1, "Committed"), entry(2, "Committed"), entry(3, "Committed")]
    assert isinstance(phases.decide(after, done, late), moves.RegisterStep)


def test_a_failed_retriable_step_halts_without_compensation() -> None:
    saga = orchestrated()
    saga.status.pivot_committed = True
    done = [entry(1, "Committed"), entry(2, "Committed"), entry(3, "Committed")]
    move = phases.decide(saga, [*done, with_effect(entry(4, "Failed"), "Failed", "HTTP 503")], NOW)
    assert isinstance(move, moves.Transition)
    assert (move.phase, move.reason, move.failed_step) == ("Halted", "ForwardRecoveryExhausted", "confirm")
    assert "nothing is compensated" in move.message


def test_all_steps_committed_completes_then_effects_are_sent() -> None:
    saga = orchestrated(effects=[{"name": "mail", "call": {"function": "mailer"}}])
    saga.status.pivot_committed = True
    done = [entry(p, "Committed") for p in (1, 2, 3, 4)]
    assert phases.decide(saga, done, NOW) == moves.Transition(
        SagaPhase.COMPLETED, SagaReason.COMMITTED, "all 4 steps committed"
    )
    completed = orchestrated("Completed", effects=[{"name": "mail", "call": {"function": "mailer"}}])
    move = phases.decide(completed, done, NOW)
    assert isinstance(move, moves.DeliverEffect)
    assert move.effect.name == "mail"
    assert phases.holds_finalizer(completed)
    completed.status.effects = [EffectStatus(name="mail", state="Delivered")]
    assert phases.decide(completed, done, NOW) == moves.SyncMetadata(
        {}, [], final=True, entries_too=True
    )  # finalizer released
    assert not phases.holds_finalizer(completed)


def test_effects_are_never_sent_for_a_saga_that_did_not_complete() -> None:
    for phase in ("Failed", "Compensating", "Compensated", "Halted"):
        saga = orchestrated(phase, effects=[{"name": "mail", "call": {"function": "mailer"}}])
        move = phases.decide(saga, [with_state(entry(1, "Committed"), "Compensated")], NOW)
        assert not isinstance(move, moves.DeliverEffect), phase


def test_references_to_unknown_or_later_steps_are_named() -> None:
    steps = [
        Step.model_validate(step("create_user")),
        Step.model_validate(
            {
                **step("grant", user="${steps.create_user.output.id}", later="${steps.mail.output.id}"),
                "compensation": {"function": "revoke", "args": {"grant": "${steps.grant.output.id}"}},
            }
        ),
        Step.model_validate(step("mail", "Retriable", to="${steps.ghost.output.email}")),
    ]
    assert reference_problems(steps) == [
        "step 'grant' action refers to ${steps.mail...}, which has not run before it: "
        "a call can only use the outputs of steps before it",
        "step 'mail' action refers to ${steps.ghost...}: there is no such step",
    ]
    move = phases.decide(make_saga(steps=[s.to_api() for s in steps]), [], NOW, FRESH)
    assert isinstance(move, moves.Transition)
    assert (move.phase, move.reason) == ("Compensating", "InvalidReference")


@given(st.lists(st.sampled_from(["Committed", "Failed"]), min_size=1, max_size=4))
def test_forward_runs_in_order_until_the_first_failure(outcomes: list[str]) -> None:
    """Simulate: each registered step ends with the given outcome; check what the saga does."""
    saga = orchestrated()
    entries: dict[int, UndoEntry] = {}
    sent: list[int] = []
    for _ in range(20):
        if all(entries.get(p) and entries[p].status.effect == "Committed" for p in (1, 2, 3)):
            saga.status.pivot_committed = True
        move = phases.decide(saga, list(entries.values()), NOW, FRESH)
        if isinstance(move, moves.RegisterStep):
            entries[move.position] = entry(move.position, "Pending")
        elif isinstance(move, moves.ExecuteStep):
            position = move.entry.spec.stack_position
            sent.append(position)
            outcome = outcomes[position - 1] if position <= len(outcomes) else "Committed"
            entries[position] = with_effect(entries[position], outcome)
        elif isinstance(move, moves.MarkPivot):
            saga.status.pivot_committed = True
        else:
            break
    assert sent == sorted(sent)
    assert sent == list(range(1, len(sent) + 1))  # one at a time, none skipped
    first_failure = next((i for i, o in enumerate(outcomes, start=1) if o == "Failed"), None)
    assert isinstance(move, moves.Transition)
    if first_failure is None:
        assert move.phase == "Completed"
    elif first_failure <= 3:
        assert (move.phase, move.reason) == ("Compensating", "StepFailed")
        assert sent[-1] == first_failure
    else:
        assert (move.phase, move.reason) == ("Halted", "ForwardRecoveryExhausted")


# Steps so far: committed ones, then perhaps one not (yet) committed, as the forward path leaves them.
progress = st.tuples(
    st.integers(0, len(ORDER)), st.sampled_from([None, "Pending", "Executing", "Failed", "NotSent"])
).map(lambda p: ["Committed"] * p[0] + ([p[1]] if p[1] and p[0] < len(ORDER) else []))


@given(
    progress,
    st.floats(0, 5),
    st.sampled_from([None, "Abort", "Commit"]),
    st.booleans(),
    st.sampled_from([None, 1]),
)
def test_steps_run_before_active_only_on_the_happy_path_and_only_for_a_moment(
    effects_so_far: list[str], seconds: float, outcome: str | None, deleted: bool, deadline: int | None
) -> None:
    """Before its Active status is written, a saga only registers and sends steps, or completes;
    a failure, an abort, a delete, a deadline, a pivot to mark or the moment gone start from
    Active, written first, as they always did."""
    spec: dict[str, Any] = {"activeDeadlineSeconds": deadline} if deadline else {}
    if outcome:
        spec["outcome"] = outcome
    saga = orchestrated(None, **spec)  # type: ignore[arg-type]
    if deleted:
        saga.metadata.deletion_timestamp = NOW
    entries = [entry(position, effect) for position, effect in enumerate(effects_so_far, start=1)]
    at = NOW + timedelta(seconds=seconds)
    move = phases.decide(saga, entries, at)
    early = phases.steps_before_active(saga, entries, at)
    assert move == (early or moves.Initialize())
    if early is None:
        return
    assert at < NOW + phases.ACTIVE_WRITE_AFTER
    assert outcome != "Abort"
    assert not deleted
    assert deadline is None or at < NOW + timedelta(seconds=deadline)
    assert not any(e in ("Failed", "NotSent") for e in effects_so_far)
    if isinstance(early, moves.Transition):
        assert early.phase == SagaPhase.COMPLETED
        assert effects_so_far == ["Committed"] * len(ORDER)
    else:
        assert isinstance(early, (moves.RegisterStep, moves.ExecuteStep))
        assert "capture" not in [ORDER[i]["name"] for i, e in enumerate(effects_so_far) if e == "Committed"]


def test_an_external_saga_is_initialized_at_first_sight() -> None:
    assert phases.decide(make_saga(None), [], NOW) == moves.Initialize()
