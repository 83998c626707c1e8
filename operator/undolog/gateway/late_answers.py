"""An upstream's answer that reaches a client of the gateway after the gateway closed it: a
request it cancelled (past its callSeconds, or as it gave up on the upstream at its start) that
the server answered on its event stream all the same (the `mcp` package's own server does).
Nothing waits for it. The SDK logs it as a parse failure with a traceback, though its own code
says it is not one, and a person reading the gateway's log takes that for a fault: dropped.

Hand-written: the SDK logs it at ERROR with no way to say a closed client expects it."""

from __future__ import annotations

import logging

import anyio

SDK_LOGGER = "mcp.client.streamable_http"
SDK_MESSAGE = "Error parsing SSE message"
CLOSED = (anyio.ClosedResourceError, anyio.BrokenResourceError)


class LateAnswers(logging.Filter):
    """Drops the SDK's record of an answer that found its client closed; keeps every other."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (record.msg == SDK_MESSAGE and isinstance(error, CLOSED))


def drop_late_answers() -> None:
    """The filter on the SDK's logger of streamable HTTP clients (once, however often called)."""
    logger = logging.getLogger(SDK_LOGGER)
    if not any(isinstance(f, LateAnswers) for f in logger.filters):
        logger.addFilter(LateAnswers())
