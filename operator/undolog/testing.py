"""Contract checks for people who write participants, as a pytest plugin (`participant_contract`
fixture, loaded by pytest when undolog is installed) and plain functions.

What the operator relies on, checked over real HTTP with the wire protocol's headers:
- the forward call and the compensation honour `Idempotency-Key`: the same call twice gives the
  same answer (and, by the participant's word, no second effect);
- a compensation for a forward call the participant never saw is accepted (2xx): the operator
  compensates whenever the outcome is unknown, e.g. a timeout before the request arrived;
- every answer comes within the Webhook's `timeoutSeconds`;
- with `signing_secret` (the Webhook's `spec.signing` key), every call is signed as the operator
  signs it, and the participant refuses one whose body was changed, one signed with another key
  and one whose `webhook-timestamp` is 10 minutes old (a replay of a captured request); a
  request sent again unchanged is answered as the first (the Idempotency-Key rule);
- with `fences=True`, a call whose `Undolog-Fence` is lower than one already seen for its
  `Undolog-Shard` is refused 409 (the check uses a shard of its own, `<random>/1000000`, which no
  operator runs, so a participant's real fences are left alone);
- under calls at once (with a forward call): `keys_at_once` keys, each forward call sent three
  times together and its compensation (twice, together) 50 ms after, while the effect is in
  flight (`slow_forward_args` make it slow, as an outside call would): every call answered
  within `timeoutSeconds` (a participant that stalls is named), the repeats of a call answered
  alike, and, by the participant's own records (`effects`), one effect per key and none left
  once compensated.

    from undolog.testing import Participant

    def test_identity(participant_contract):
        participant_contract(Participant(
            compensation_url="http://127.0.0.1:8101/users/delete",
            forward_url="http://127.0.0.1:8101/users", forward_args={"email": "ada@example.com"},
            compensation_args=lambda output: {"user_id": output.get("user_id")},
            timeout_seconds=5,
        ))

Only the standard library is used for HTTP, so the SDK install stays lean (signing needs the
`standardwebhooks` package, which a participant verifying signatures has already).
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from undolog.calls import protocol
from undolog.conventions import LATE_FORWARD_STATUS, compensation_key, forward_key

Arguments = Mapping[str, Any] | Callable[[Mapping[str, Any]], Mapping[str, Any]]


@dataclass(frozen=True)
class Participant:
    """One compensation endpoint (and optionally its forward call) under test."""

    compensation_url: str
    # Or built from the forward call's answer (called with {} for a forward call never seen, as the
    # operator then resolves ${steps...} references to null: use output.get(...)).
    compensation_args: Arguments = field(default_factory=dict)
    forward_url: str | None = None
    forward_args: Mapping[str, Any] = field(default_factory=dict)
    timeout_seconds: float = 10.0  # the Webhook's timeoutSeconds
    step: str = "contract-check"
    signing_secret: str | None = None  # whsec_...: calls are signed and forgeries must be refused
    # Whether the forward call under this Idempotency-Key made its effect (the participant's own
    # records), where a test can tell: the late forward's effect must not have been made.
    applied: Callable[[str], bool] | None = None
    fences: bool = False  # check that an older fence of a shard is refused (rule 6)
    # Under calls at once: forward arguments that make the effect slow (an argument or a test
    # hook of the participant's), and how many effects the forward call under a key has left now
    # (made minus undone), by the participant's own records, where a test can tell.
    slow_forward_args: Mapping[str, Any] | None = None
    effects: Callable[[str], int] | None = None
    keys_at_once: int = 10


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any
    seconds: float


def post(url: str, body: Mapping[str, Any] | bytes, headers: Mapping[str, str], timeout: float) -> Answer:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json", **headers}, method="POST"
    )
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            status, raw = answer.status, answer.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        parsed: Any = json.loads(raw) if raw else None
    except ValueError:
        parsed = raw.decode(errors="replace")
    return Answer(status, parsed, time.monotonic() - started)


def same_answer(what: str, first: Answer, again: Answer, why: str) -> list[str]:
    """A 2xx, and the same answer to the same call sent again under its key."""
    if not 200 <= first.status < 300:
        return [f"{what} answered {first.status}: {first.body}"]
    if (again.status, again.body) != (first.status, first.body):
        return [
            f"{what} sent twice under one Idempotency-Key answered {first.status} {first.body} then "
            f"{again.status} {again.body}: {why}"
        ]
    return []


def problems(participant: Participant) -> list[str]:
    """Every way this participant breaks the contract (empty: it keeps it)."""
    found: list[str] = []
    saga = f"contract/{uuid.uuid4().hex[:8]}"
    run = str(uuid.uuid4())
    step = participant.step
    forward = forward_key(run, step)
    limit = participant.timeout_seconds

    def timed(what: str, answer: Answer) -> Answer:
        if answer.seconds > limit:
            found.append(f"{what} took {answer.seconds:.2f} s, over the Webhook's timeoutSeconds={limit:g}")
        return answer

    def undo(args: Mapping[str, Any], key: str, forward_of: str, attempt: int) -> Answer:
        headers = protocol.headers(
            idempotency_key=key, saga=saga, step=step, org=None, attempt=attempt, forward=forward_of
        )
        signed = signed_headers(participant.signing_secret, key, json.dumps(args).encode())
        return timed("the compensation", post(participant.compensation_url, args, headers | signed, limit + 1))

    output: Mapping[str, Any] = {}
    if participant.forward_url is not None:
        headers = protocol.headers(idempotency_key=forward, saga=saga, step=step, org=None, attempt=1)
        headers |= signed_headers(participant.signing_secret, forward, json.dumps(participant.forward_args).encode())
        first = timed("the forward call", post(participant.forward_url, participant.forward_args, headers, limit + 1))
        again = timed("the forward call", post(participant.forward_url, participant.forward_args, headers, limit + 1))
        found += same_answer("the forward call", first, again, "a retry would repeat the effect")
        output = first.body if isinstance(first.body, Mapping) else {}
    args = participant.compensation_args
    resolved = args(output) if callable(args) else args
    key = compensation_key(str(uuid.uuid4()))
    first, again = undo(resolved, key, forward, 1), undo(resolved, key, forward, 2)
    found += same_answer(
        "the compensation", first, again, "the operator retries under the same key and needs the same answer"
    )
    never_seen = forward_key(str(uuid.uuid4()), step)
    unknown_args = args({}) if callable(args) else args  # what the operator sends: no forward output known
    unknown = undo(unknown_args, compensation_key(str(uuid.uuid4())), never_seen, 1)
    if not 200 <= unknown.status < 300:
        found.append(
            f"a compensation for a forward call it never saw (Undolog-Forward-Key {never_seen}) answered "
            f"{unknown.status} {unknown.body}: it must succeed (nothing to undo), since the operator compensates "
            "whenever a forward call's outcome is unknown"
        )
    found += late_forward_applied(participant, saga, never_seen)
    if participant.signing_secret is not None:
        found.extend(forgeries_accepted(participant, saga, unknown_args))
    if participant.fences:
        found.extend(older_fence_accepted(participant, saga, unknown_args))
    return found + concurrency_problems(participant, saga)


def late_forward_applied(participant: Participant, saga: str, compensated: str) -> list[str]:
    """The forward call under a key whose compensation came first: refused, and not applied."""
    if participant.forward_url is None:
        return []
    headers = protocol.headers(idempotency_key=compensated, saga=saga, step=participant.step, org=None, attempt=1)
    payload = json.dumps(participant.forward_args).encode()
    headers |= signed_headers(participant.signing_secret, compensated, payload)
    late = post(participant.forward_url, participant.forward_args, headers, participant.timeout_seconds + 1)
    found = []
    if late.status != LATE_FORWARD_STATUS:
        found.append(
            f"a forward call arriving after its compensation (Idempotency-Key {compensated}) answered {late.status} "
            f"{late.body}: it must be refused {LATE_FORWARD_STATUS} and never applied, or its effect stays under a "
            "saga that reads Compensated"
        )
    if participant.applied is not None and participant.applied(compensated):
        found.append(f"a forward call arriving after its compensation (Idempotency-Key {compensated}) was applied")
    return found


def signed_headers(secret: str | None, message_id: str, payload: bytes, at: datetime | None = None) -> dict[str, str]:
    """The Standard Webhooks headers the operator sends (none without a secret)."""
    if secret is None:
        return {}
    from undolog.calls.signing import webhook_headers  # needs standardwebhooks: only when signing

    return webhook_headers(message_id, payload, [secret], at or datetime.now(UTC))


def unseen_compensation(participant: Participant, saga: str) -> tuple[str, dict[str, str]]:
    """A new compensation key and the headers of its call, undoing a forward call never made."""
    key = compensation_key(str(uuid.uuid4()))
    forward = forward_key(str(uuid.uuid4()), participant.step)
    return key, protocol.headers(
        idempotency_key=key, saga=saga, step=participant.step, org=None, attempt=1, forward=forward
    )


def forgeries_accepted(participant: Participant, saga: str, args: Mapping[str, Any]) -> list[str]:
    """Calls that are not what the operator signed, each of which the participant must refuse."""
    secret = participant.signing_secret
    assert secret is not None
    payload = json.dumps(args).encode()
    other = "whsec_" + base64.b64encode(uuid.uuid4().bytes).decode()
    forgeries = {
        "a changed body": (payload, payload + b" ", secret, None),
        "a signature made with another key": (payload, payload, other, None),
        "a webhook-timestamp 10 minutes old": (payload, payload, secret, datetime.now(UTC) - timedelta(minutes=10)),
    }
    found = []
    for what, (signed, sent, key, at) in forgeries.items():
        message_id, headers = unseen_compensation(participant, saga)
        headers |= signed_headers(key, message_id, signed, at)
        answer = post(participant.compensation_url, sent, headers, participant.timeout_seconds + 1)
        if 200 <= answer.status < 300:
            found.append(f"a compensation with {what} was accepted ({answer.status}): it must be refused (4xx)")
    return found


def older_fence_accepted(participant: Participant, saga: str, args: Mapping[str, Any]) -> list[str]:
    """A compensation carrying a fence lower than one its shard has seen: it must be refused 409."""
    shard = f"{uuid.uuid4().int % 1_000_000}/1000000"
    answers = []
    for fence in (2, 1):
        key, headers = unseen_compensation(participant, saga)
        headers |= {protocol.FENCE_HEADER: str(fence), protocol.SHARD_HEADER: shard}
        headers |= signed_headers(participant.signing_secret, key, json.dumps(args).encode())
        answers.append(post(participant.compensation_url, args, headers, participant.timeout_seconds + 1))
    newer, older = answers
    if not 200 <= newer.status < 300:
        return [f"a compensation with Undolog-Fence 2 on a new shard answered {newer.status} {newer.body}"]
    if older.status != 409:
        return [
            f"a compensation with Undolog-Fence 1 after 2 on shard {shard} answered {older.status}: an older fence "
            "must be refused 409 (it comes from an operator replaced while it was frozen)"
        ]
    return []


REPEATS = 3  # a forward call sent this many times together under one key
RACE_SECONDS = 0.05  # each compensation sent this long after its forward calls: while the effect runs


def concurrency_problems(participant: Participant, saga: str) -> list[str]:
    """Keys at once, each forward call repeated and compensated while its effect is in flight;
    then keys at once repeated only, their effects counted, then compensated one by one. Each
    problem said once, with how many keys showed it."""
    if participant.forward_url is None:
        return []
    said = f"under {participant.keys_at_once} keys at once (each forward call sent {REPEATS} times together"
    raced_said = f"{said}, its compensation {RACE_SECONDS * 1000:g} ms after)"

    def effects(key: str) -> int | None:  # None: the participant's records are not known
        return participant.effects(key) if participant.effects is not None else None

    raced = racing(participant, saga, compensated=True)
    found = judged(participant, raced)
    found += [(f"{left} effect(s) left", key) for key in raced if (left := effects(key)) not in (0, None)]
    problems = grouped(raced_said, found, participant.keys_at_once)
    repeated = racing(participant, saga, compensated=False)
    found = judged(participant, repeated)
    for key, (forwards, _) in repeated.items():
        if (made := effects(key)) is not None and made > 1:
            found.append((f"the forward call made {made} effects", key))
        try:
            undone = compensated(participant, saga, key, forwards)
        except OSError as error:  # urllib's timeout or a refused connection
            found.append((f"a compensation sent alone afterwards got no answer ({type(error).__name__})", key))
            continue
        if effects(key) not in (0, None) and 200 <= undone.status < 300:
            found.append((f"an effect is left after its compensation answered {undone.status}", key))
    return problems + grouped(f"{said})", found, participant.keys_at_once)


def grouped(said: str, found: list[tuple[str, str]], keys: int) -> list[str]:
    """Each problem once: how many keys showed it, and one of them."""
    by_problem: dict[str, list[str]] = {}
    for problem, key in found:
        by_problem.setdefault(problem, []).append(key)
    return [
        f"{said}: {problem} ({len(set(shown))} of {keys} keys, e.g. Idempotency-Key {shown[0]})"
        for problem, shown in by_problem.items()
    ]


Raced = dict[str, tuple[list["Answer | str"], list["Answer | str"]]]  # by key: forward answers, compensations'


def racing(participant: Participant, saga: str, compensated: bool) -> Raced:
    """Each key's forward call REPEATS times at once, and (compensated) its compensation twice
    at once RACE_SECONDS later: every answer, or why there was none."""
    args = participant.slow_forward_args or participant.forward_args
    compensation = participant.compensation_args
    undo_args = compensation({}) if callable(compensation) else compensation  # the outcome is not known yet
    keys = [forward_key(str(uuid.uuid4()), participant.step) for _ in range(participant.keys_at_once)]
    calls: dict[str, tuple[list[Future[Answer]], list[Future[Answer]]]] = {}
    with ThreadPoolExecutor(max_workers=participant.keys_at_once * (REPEATS + 2)) as pool:
        for key in keys:
            calls[key] = ([pool.submit(sent_forward, participant, saga, key, args) for _ in range(REPEATS)], [])
        if compensated:
            time.sleep(RACE_SECONDS)  # the race itself: compensations arrive while the effects run
            for key in keys:
                undo = compensation_key(str(uuid.uuid4()))
                calls[key][1].extend(pool.submit(sent_undo, participant, saga, undo, key, undo_args) for _ in range(2))
    return {
        key: ([_answer(f) for f in forwards], [_answer(f) for f in undos]) for key, (forwards, undos) in calls.items()
    }


def _answer(future: Future[Answer]) -> Answer | str:
    try:
        return future.result()
    except OSError as error:  # urllib's timeout or a refused connection
        return type(error).__name__


def judged(participant: Participant, raced: Raced) -> list[tuple[str, str]]:
    """What the answers say, by key: a call with no answer or one over the timeout (a
    participant that stalls), a 5xx, and repeats of one call answered differently."""
    found: list[tuple[str, str]] = []
    limit = participant.timeout_seconds
    for key, (forwards, undos) in raced.items():
        for what, answers in (("forward call", forwards), ("compensation", undos)):
            for answer in answers:
                if isinstance(answer, str):
                    found.append((f"a {what} got no answer within {limit + 1:g} s ({answer})", key))
                elif answer.seconds > limit:
                    found.append((f"a {what} took longer than timeoutSeconds={limit:g}", key))
                elif answer.status >= 500:
                    found.append((f"a {what} answered {answer.status}", key))
            said = {(a.status, json.dumps(a.body, sort_keys=True)) for a in answers if isinstance(a, Answer)}
            if len(said) > 1 and what == "compensation":
                found.append(("one compensation sent twice at once answered differently", key))
            if len({s for s in said if 200 <= s[0] < 300}) > 1:
                found.append((f"one forward call sent {REPEATS} times at once answered differently", key))
    return found


def sent_forward(participant: Participant, saga: str, key: str, args: Mapping[str, Any]) -> Answer:
    assert participant.forward_url is not None
    headers = protocol.headers(idempotency_key=key, saga=saga, step=participant.step, org=None, attempt=1)
    headers |= signed_headers(participant.signing_secret, key, json.dumps(args).encode())
    return post(participant.forward_url, args, headers, participant.timeout_seconds + 1)


def sent_undo(participant: Participant, saga: str, key: str, forward: str, args: Mapping[str, Any]) -> Answer:
    headers = protocol.headers(
        idempotency_key=key, saga=saga, step=participant.step, org=None, attempt=1, forward=forward
    )
    headers |= signed_headers(participant.signing_secret, key, json.dumps(args).encode())
    return post(participant.compensation_url, args, headers, participant.timeout_seconds + 1)


def compensated(participant: Participant, saga: str, key: str, forwards: list[Answer | str]) -> Answer:
    """The forward call under `key` compensated, with what its answer gives the compensation."""
    answered = next((a for a in forwards if isinstance(a, Answer) and 200 <= a.status < 300), None)
    output = answered.body if answered is not None and isinstance(answered.body, Mapping) else {}
    args = participant.compensation_args
    return sent_undo(
        participant, saga, compensation_key(str(uuid.uuid4())), key, args(output) if callable(args) else args
    )


def check(participant: Participant) -> None:
    """AssertionError naming every broken rule."""
    found = problems(participant)
    if found:
        raise AssertionError(
            f"{participant.compensation_url} breaks the participant contract:\n- " + "\n- ".join(found)
        )


try:  # the pytest plugin, when pytest runs
    import pytest
except ImportError:  # pragma: no cover - used without pytest
    pass
else:

    @pytest.fixture
    def participant_contract() -> Callable[[Participant], None]:
        """Check a participant against the contract: `participant_contract(Participant(...))`."""
        return check
