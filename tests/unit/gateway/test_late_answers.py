"""The SDK's record of an answer that found its client closed is dropped from the gateway's log;
a real parse failure, and any other record of that logger, is kept."""

from __future__ import annotations

import logging

import anyio
import pytest

from undolog.gateway.late_answers import SDK_LOGGER, SDK_MESSAGE, drop_late_answers


def logged(error: Exception, message: str = SDK_MESSAGE) -> None:
    try:
        raise error
    except Exception:
        logging.getLogger(SDK_LOGGER).exception(message)


@pytest.mark.parametrize("closed", [anyio.ClosedResourceError(), anyio.BrokenResourceError()])
def test_an_answer_that_found_its_client_closed_is_not_logged(
    caplog: pytest.LogCaptureFixture, closed: Exception
) -> None:
    drop_late_answers()
    drop_late_answers()
    logged(closed)
    assert not caplog.records
    assert len(logging.getLogger(SDK_LOGGER).filters) == 1


def test_a_message_that_does_not_parse_and_the_logger_s_other_records_are_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    drop_late_answers()
    logged(ValueError("not JSON"))
    logged(anyio.ClosedResourceError(), "GET stream disconnected")
    assert [(r.getMessage(), type(r.exc_info[1]).__name__ if r.exc_info else None) for r in caplog.records] == [
        (SDK_MESSAGE, "ValueError"),
        ("GET stream disconnected", "ClosedResourceError"),
    ]
