"""The API's answers as Python values, however deep the objects in them nest.

orjson parses them (Python's json was 5% of the operator's CPU with sagas compensating); what
orjson refuses (an integer past 64 bits, NaN, nesting past its 1,024 levels, no JSON at all)
goes to Python's json as before, which has the last word.

The apiserver stores objects nested up to 10,000 levels (its JSON decoder's limit) in the
fields it keeps as they come (a call's args, an entry's output). Python's json parses about
1,000 on the caller's stack and raises RecursionError past it: one such object in a LIST made
every listing of its namespace fail, and the operator could not take charge of any saga there.
Such an answer is parsed again on a thread of its own, with room for the API's deepest; the
objects in it are then refused by the kinds' own bound on nesting (`undolog.api.common`), each
on its own, so the rest of the answer is used as usual.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

import orjson

from undolog import errors

# The API's limit, plus the levels a LIST or a watch event wraps an object in.
DEEPEST = 10_000 + 8
# C stack for DEEPEST levels: json's C parser takes ~200 bytes a level (2 MiB is enough); only
# the pages touched are ever resident.
STACK_BYTES = 64 * 1024 * 1024
_deep = threading.Lock()  # one deep parse at a time: the recursion limit is the interpreter's


def decoded(raw: bytes | str) -> Any:
    """`raw` parsed as JSON; None when it is not JSON."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(raw)
    except RecursionError:
        return _decoded_deep(raw)
    except ValueError:
        return None


def _decoded_deep(raw: bytes | str) -> Any:
    outcome: list[Any] = []

    def parse() -> None:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, DEEPEST + 100))
        try:
            outcome.append(json.loads(raw))
        except Exception as error:  # RecursionError, not JSON, out of memory: said, never skipped
            outcome.append(error)
        finally:
            sys.setrecursionlimit(limit)

    with _deep:
        size = threading.stack_size(STACK_BYTES)
        try:
            thread = threading.Thread(target=parse, name="deep JSON", daemon=True)
            thread.start()
        finally:
            threading.stack_size(size)
        thread.join()
    result = outcome[0]
    if isinstance(result, ValueError):
        return None
    if isinstance(result, RecursionError):
        raise errors.Unavailable(f"the API answered with JSON nested deeper than {DEEPEST} levels")
    if isinstance(result, Exception):
        raise errors.Unavailable(f"the API's answer could not be parsed: {result!r}")
    return result
