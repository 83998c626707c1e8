"""The synchronous SDK is a shell over the asynchronous one: the same methods and parameters."""

from __future__ import annotations

import inspect

from undolog.sdk import saga as async_sdk
from undolog.sdk import sync


def parameters(function: object) -> list[tuple[str, object, object]]:
    signature = inspect.signature(function)  # type: ignore[arg-type]
    return [(p.name, p.kind, p.default) for p in signature.parameters.values() if p.name != "self"]


def test_the_sync_saga_has_every_async_method_with_the_same_parameters() -> None:
    methods = ("stage_effect", "commit", "abort", "rewind_to", "wait")
    for method in methods:
        assert parameters(getattr(sync.Saga, method)) == parameters(getattr(async_sdk.SagaRun, method)), method
    public = {
        name
        for name, member in vars(async_sdk.SagaRun).items()
        if not name.startswith("_") and inspect.isfunction(member)
    }
    internal = {"register", "finish", "end_block", "note_failure"}  # what the sync shell itself is made of
    assert public - internal - set(methods) == {"step", "close"}  # both written for the blocking world
    assert {"step", "close"} <= set(vars(sync.Saga))


def test_open_saga_takes_what_the_async_one_takes_but_a_connection_of_another_loop() -> None:
    assert parameters(sync.open_saga) == [p for p in parameters(async_sdk.open_saga) if p[0] != "kube"]
