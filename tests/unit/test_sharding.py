"""Which replica drives which saga (decisions.sharding, conventions.bucket_of): every bucket in
exactly one shard, the selector naming exactly the shard's buckets, and replicas that follow
may_take / to_hand_back ending with every shard held once and nobody over its share."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from undolog.conventions import BUCKET_LABEL, BUCKETS, bucket_labels, bucket_of, generated_name
from undolog.decisions.sharding import MAX_SHARDS, Shard, all_shards, fair_share, may_take, to_hand_back

counts = st.integers(min_value=1, max_value=MAX_SHARDS)
names = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?", fullmatch=True)


@given(counts)
def test_every_bucket_is_in_exactly_one_shard_and_shards_differ_by_one_bucket_at_most(count: int) -> None:
    shards = all_shards(count)
    owners = [[s.index for s in shards if b in s.buckets] for b in range(BUCKETS)]
    assert all(len(o) == 1 for o in owners)
    sizes = [len(s.buckets) for s in shards]
    assert max(sizes) - min(sizes) <= 1


@given(counts, names, names)
def test_the_selector_of_the_shard_that_owns_a_saga_names_its_bucket_and_no_other_does(
    count: int, namespace: str, saga: str
) -> None:
    bucket = str(bucket_of(namespace, saga))
    owning = [s for s in all_shards(count) if s.owns(namespace, saga)]
    assert len(owning) == 1
    if count == 1:
        assert owning[0].selector() is None  # one shard: everything, labelled or not
        return
    for shard in all_shards(count):
        selector = shard.selector()
        assert selector is not None
        assert selector.startswith(f"{BUCKET_LABEL} in (")
        values = selector[len(BUCKET_LABEL) + len(" in (") : -1].split(",")
        assert (bucket in values) == (shard == owning[0])


def test_the_bucket_of_a_saga_never_changes_between_versions() -> None:
    # The SDK of one release labels what the operator of another lists: the hash is a contract.
    # Pinned from the first release that sharded (sha256 of "<namespace>/<name>", mod 64).
    assert bucket_labels("team-a", "onboard-ada") == {BUCKET_LABEL: "53"}
    assert bucket_of("team-a", "onboard-ada") == bucket_of("team-a", "onboard-ada")


@given(st.text(alphabet="abc-", min_size=1, max_size=80))
def test_a_generated_name_keeps_the_prefix_within_the_name_limit(prefix: str) -> None:
    name = generated_name(prefix)
    assert len(name) <= 63
    assert name.startswith(prefix[:58])


@pytest.mark.parametrize(("index", "count"), [(0, 0), (0, MAX_SHARDS + 1), (3, 3), (-1, 2)])
def test_shard_numbers_out_of_range_are_refused(index: int, count: int) -> None:
    with pytest.raises(ValueError, match="shard"):
        Shard(index, count)


def settle(shards: int, replicas: int, held: list[list[int]], rng: random.Random) -> list[list[int]]:
    """Rounds of the election as the replicas run it, in a random order each round: a free
    shard goes to the first replica that may take one; a replica over its share hands its
    highest back."""
    for _ in range(4 * shards + 4):
        for r in rng.sample(range(replicas), replicas):
            back = to_hand_back(held[r], shards, replicas)
            if back is not None:
                held[r].remove(back)
            free = sorted(set(range(shards)) - {s for h in held for s in h})
            if free and may_take(len(held[r]), shards, replicas):
                held[r].append(free[0])
    return held


@given(counts, st.integers(min_value=1, max_value=8), st.integers(min_value=0, max_value=2**32), st.data())
def test_replicas_end_with_every_shard_held_once_and_none_over_its_share(
    shards: int, replicas: int, seed: int, data: st.DataObject
) -> None:
    rng = random.Random(seed)
    # Any start: what the replicas held before one joined or died (each shard by one at most).
    start: list[list[int]] = [[] for _ in range(replicas)]
    for shard in range(shards):
        owner = data.draw(st.integers(min_value=-1, max_value=replicas - 1))
        if owner >= 0:
            start[owner].append(shard)
    held = settle(shards, replicas, start, rng)
    assert sorted(s for h in held for s in h) == list(range(shards))
    assert all(len(h) <= fair_share(shards, replicas) for h in held)
