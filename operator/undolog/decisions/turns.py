"""Which saga waiting for one of the operator's slots goes next: the namespaces take turns.

A namespace is a tenant's unit in Kubernetes. In one queue, first come first served, a tenant
whose 1,000 sagas were aborted at once against a participant that hangs held every slot and
kept the rest of the cluster's compensations behind all of its own, for as long as its calls
took to time out one after another. Taking turns, a saga of another namespace gets the next
slot that frees up; within a namespace the sagas keep their order.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Turns(Generic[T]):
    """A queue per namespace, served round-robin; each namespace that waits is served once
    before any is served twice."""

    def __init__(self) -> None:
        self._waiting: dict[str, deque[T]] = {}
        self._order: deque[str] = deque()  # namespaces with something waiting, next turn first

    def append(self, namespace: str, item: T) -> None:
        queue = self._waiting.get(namespace)
        if queue is None:
            queue = self._waiting[namespace] = deque()
            self._order.append(namespace)
        queue.append(item)

    def upcoming(self) -> str:
        """The namespace whose turn is next (popleft serves it, whatever is appended meanwhile);
        IndexError when nothing waits."""
        return self._order[0]

    def popleft(self) -> T:
        """The next namespace's first item; IndexError when nothing waits."""
        namespace = self._order.popleft()
        queue = self._waiting[namespace]
        item = queue.popleft()
        if queue:
            self._order.append(namespace)
        else:
            del self._waiting[namespace]
        return item

    def clear(self) -> None:
        self._waiting.clear()
        self._order.clear()

    def __len__(self) -> int:
        return sum(len(queue) for queue in self._waiting.values())

    def __bool__(self) -> bool:
        return bool(self._order)
