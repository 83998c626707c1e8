"""core/v1 Events as UndoLog writes and reads them: the body of one about an object, and the
records of a listing, oldest first."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from undolog.api import GROUP, VERSION
from undolog.conventions import MAX_EVENT_MESSAGE, now

Body = dict[str, Any]


@dataclass(frozen=True)
class EventRecord:
    """A core/v1 Event about an object, as the timeline shows it."""

    time: datetime | None
    type: str
    reason: str
    message: str
    name: str


def event_records(listed: Body) -> list[EventRecord]:
    records = [
        EventRecord(
            time=_parsed_time(e.get("eventTime") or e.get("lastTimestamp") or e.get("firstTimestamp")),
            type=e.get("type") or "",
            reason=e.get("reason") or "",
            message=e.get("message") or "",
            name=e["metadata"]["name"],
        )
        for e in listed.get("items") or []
    ]
    return sorted(records, key=lambda r: (r.time or datetime.min.replace(tzinfo=UTC), r.name))


def event_body(
    regarding: Body,
    *,
    reason: str,
    message: str,
    warning: bool,
    component: str,
    at: datetime | None,
    name: str | None,
) -> Body:
    meta = regarding["metadata"]
    seconds, micro = _event_times(at or now())
    naming = {"name": name} if name else {"generateName": f"{meta['name']}."}
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {**naming, "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": regarding.get("apiVersion", f"{GROUP}/{VERSION}"),
            "kind": regarding.get("kind"),
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "reason": reason,
        "message": message[:MAX_EVENT_MESSAGE],
        "type": "Warning" if warning else "Normal",
        "firstTimestamp": seconds,
        "lastTimestamp": seconds,
        "eventTime": micro,
        "action": reason,
        "reportingComponent": component,
        "reportingInstance": os.environ.get("HOSTNAME", component),
        "source": {"component": component},
        "count": 1,
    }


def _event_times(when: datetime) -> tuple[str, str]:
    """An Event's Time (seconds) and MicroTime, as the API writes them."""
    utc = when.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%SZ"), utc.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parsed_time(value: object) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) and value else None
