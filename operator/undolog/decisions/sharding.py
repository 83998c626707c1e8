"""Which replica drives which saga: sagas are spread over a fixed set of buckets by their name,
buckets over shards, and each shard is driven by the replica that holds its Lease.

The bucket depends only on the saga's namespace and name, never on how many shards there are,
so the SDK stamps it (label `undolog.io/bucket`) on a saga and its entries before the operator
sees them, and the number of shards can change without relabelling anything. A shard is a
contiguous run of buckets, which a label selector (`in (...)`) names on the server: a replica
lists and watches only its shards' sagas and entries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from undolog.conventions import BUCKET_LABEL, BUCKETS, bucket_of

MAX_SHARDS = BUCKETS


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_SHARDS:
            raise ValueError(f"shards={self.count}: between 1 and {MAX_SHARDS}")
        if not 0 <= self.index < self.count:
            raise ValueError(f"shard {self.index} of {self.count} does not exist")

    @property
    def buckets(self) -> range:
        return range(self.index * BUCKETS // self.count, (self.index + 1) * BUCKETS // self.count)

    def owns(self, namespace: str, saga: str) -> bool:
        # Asked on every watch event: with one shard there is nothing to hash.
        return self.count == 1 or bucket_of(namespace, saga) in self.buckets

    def selector(self) -> str | None:
        """The label selector of this shard's objects; None when there is one shard (everything,
        labelled or not)."""
        if self.count == 1:
            return None
        return f"{BUCKET_LABEL} in ({','.join(str(b) for b in self.buckets)})"

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def all_shards(count: int) -> list[Shard]:
    return [Shard(index, count) for index in range(count)]


def fair_share(shards: int, replicas: int) -> int:
    """The most shards one replica should hold while `replicas` are alive."""
    return math.ceil(shards / max(1, replicas))


def may_take(held: int, shards: int, replicas: int) -> bool:
    """Whether a replica holding `held` shards stands for one more that is free."""
    return held < fair_share(shards, replicas)


def to_hand_back(held: list[int], shards: int, replicas: int) -> int | None:
    """The one shard to hand back when holding more than the fair share (a replica joined):
    the highest, one per round, so replicas never hand the same shards back and forth."""
    if len(held) <= fair_share(shards, replicas):
        return None
    return max(held)
