"""The order sagas waiting for a slot are served in (decisions.turns): every saga once, each
namespace's in its own order, and no namespace served twice while another waits."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from undolog.decisions.turns import Turns

arrivals = st.lists(st.tuples(st.sampled_from("abcd"), st.booleans()), max_size=60)  # (namespace, serve one after)


@given(arrivals)
def test_every_item_is_served_once_each_namespace_in_order_and_none_twice_while_another_waits(
    steps: list[tuple[str, bool]],
) -> None:
    turns: Turns[tuple[str, int]] = Turns()
    served: list[tuple[str, frozenset[str]]] = []  # whose turn it was, and who was waiting then
    order: list[tuple[str, int]] = []  # what was served, in order
    items: list[tuple[str, int]] = []

    def serve() -> None:
        waiting = frozenset(ns for ns, _ in items if (ns, _) not in done)
        item = turns.popleft()
        done.add(item)
        order.append(item)
        served.append((item[0], waiting))

    done: set[tuple[str, int]] = set()
    for number, (namespace, then_serve) in enumerate(steps):
        turns.append(namespace, (namespace, number))
        items.append((namespace, number))
        if then_serve:
            serve()
    assert len(turns) == len(items) - len(done)
    while turns:
        serve()
    assert sorted(order) == sorted(items)
    for namespace in "abcd":
        assert [n for ns, n in items if ns == namespace] == [n for ns, n in order if ns == namespace]
    # Between two turns of one namespace, every other namespace waiting all along had one.
    for i, (namespace, waiting_then) in enumerate(served):
        later = next((j for j in range(i + 1, len(served)) if served[j][0] == namespace), None)
        if later is None:
            continue
        between = {ns for ns, _ in served[i + 1 : later]}
        for other in waiting_then - {namespace}:
            assert other in between or other not in served[later][1], (namespace, other, served)


def test_a_namespace_that_arrives_behind_a_long_queue_is_served_next() -> None:
    turns: Turns[str] = Turns()
    for i in range(1000):
        turns.append("busy", f"busy-{i}")
    assert turns.popleft() == "busy-0"
    turns.append("quiet", "quiet-0")
    assert [turns.popleft(), turns.popleft(), turns.popleft()] == ["busy-1", "quiet-0", "busy-2"]
    assert len(turns) == 997
    turns.clear()
    assert not turns
