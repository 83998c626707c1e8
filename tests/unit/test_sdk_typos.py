"""A typo in a Call or a policy is refused at the SDK's door, naming the field and the ones
there are, before anything is registered (it used to be dropped: `arg={...}` sent `args={}`)."""

from __future__ import annotations

from typing import cast

import pytest

from tests.support.manifests import saga
from undolog.api import Call, CompensationPolicy, Saga
from undolog.api.common import unknown_fields
from undolog.kube import Kube
from undolog.sdk import SagaRun, open_saga


def test_a_call_given_a_field_it_has_not_says_which_and_what_it_has() -> None:
    typo = Call(function="delete-user", arg={"user_id": "u-1"}, timeout=5)
    assert unknown_fields(typo) == [
        "Call has no field 'arg' (its fields: function, version, args, max_retries, timeout_seconds)",
        "Call has no field 'timeout' (its fields: function, version, args, max_retries, timeout_seconds)",
    ]
    assert unknown_fields(Call(function="delete-user", args={"user_id": "u-1"}, max_retries=2)) == []
    # As read from the API (camelCase) nothing is unknown.
    assert unknown_fields(Call.model_validate({"function": "f", "maxRetries": 1, "timeoutSeconds": 3})) == []


def test_a_nested_typo_is_found_too() -> None:
    policy = CompensationPolicy.model_validate({"backoff": {"maxRetrys": 4}})
    assert unknown_fields(policy) == [
        "Backoff has no field 'maxRetrys' (its fields: initial_milliseconds, multiplier, max_milliseconds, max_retries)"
    ]


async def test_the_sdk_refuses_it_before_registering_anything() -> None:
    run = SagaRun(
        cast(Kube, None), Saga.model_validate({**saga("order"), "metadata": {"name": "order", "namespace": "a"}})
    )
    typo = Call(function="delete-user", arg={"user_id": "u-1"})
    with pytest.raises(ValueError, match=r"step 'create_user''s compensation: Call has no field 'arg'.*nothing was"):
        await run.register("create_user", typo)  # no API is reached: its client is None
    with pytest.raises(ValueError, match=r"effect 'mail': Call has no field 'arg'"):
        await run.stage_effect("mail", typo)
    with pytest.raises(ValueError, match=r"open_saga's policy: CompensationPolicy has no field 'on_failre'"):
        await open_saga("order", policy=CompensationPolicy(on_failre="Halt"))
