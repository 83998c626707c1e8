"""Every error UndoLog raises on purpose, in one hierarchy.

The Kubernetes adapter (`undolog.kube`) maps the client's exceptions to `KubeError`s once;
nothing else looks at HTTP status codes of the API. Reasons are enums, never parsed from text.
"""

from __future__ import annotations

from dataclasses import dataclass

from undolog.api.undo_entry import CALL_REFUSALS, EntryReason


class UndoLogError(Exception):
    """Base of UndoLog's errors."""


# -- the Kubernetes API --------------------------------------------------------------------------


@dataclass(frozen=True)
class StatusCause:
    """One cause of a refusal, from the API's Status: the field (a JSON path) and what is wrong."""

    message: str
    field: str = ""
    reason: str = ""


@dataclass(frozen=True)
class StatusDetails:
    """What the API's Status says the refusal is about: the object and each cause."""

    kind: str = ""
    name: str = ""
    group: str = ""
    causes: tuple[StatusCause, ...] = ()


class KubeError(UndoLogError):
    """The Kubernetes API refused or could not answer. `message` is the apiserver's own (it names
    the object and the field), or what went wrong on the way; `details`, the Status's details
    when it sent them (a validation refusal names every field that is wrong there)."""

    def __init__(
        self, message: str, *, status: int | None = None, reason: str = "", details: StatusDetails | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason
        self.details = details


class NotFound(KubeError):
    """404: the object does not exist (or no longer)."""


class Conflict(KubeError):
    """409: the object changed since it was read (a conditional write lost the race)."""


class AlreadyExists(Conflict):
    """409 AlreadyExists: an object of that name exists."""


class Gone(KubeError):
    """410: a watch's resourceVersion is too old to resume from."""


class Unauthorized(KubeError):
    """401: the API did not accept the credentials (a token or certificate expired, revoked, or
    for another cluster), even once read again; log in again."""


class Forbidden(KubeError):
    """403: the user is known, and RBAC (or an admission policy) refused the request."""


class Invalid(KubeError):
    """400 or 422: the request can never succeed as sent (validation, admission)."""


class Unavailable(KubeError):
    """5xx, 429, a timeout or a broken connection: the same request may succeed later."""


class KubeconfigInvalid(KubeError):
    """The kubeconfig (or the Pod's service account, or an exec credential plugin) cannot be
    used as it is; nothing was sent. The message names the file, the entry and the field."""


# -- participant calls ---------------------------------------------------------------------------


class CallNotPossible(UndoLogError):
    """The call cannot be made at all (decided before any byte left); `reason` is recorded."""

    def __init__(self, reason: EntryReason, message: str) -> None:
        assert reason in CALL_REFUSALS, f"{reason} is not a reason a call is refused for"
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class UnresolvedReference(CallNotPossible, ValueError):
    """A `${steps...}` reference that cannot be resolved; the message names it."""

    def __init__(self, message: str) -> None:
        super().__init__(EntryReason.UNRESOLVED_REFERENCE, message)


class ArgumentsTooLarge(CallNotPossible):
    """A Call's args, their references resolved, are larger than a participant is sent."""

    def __init__(self, message: str) -> None:
        super().__init__(EntryReason.ARGUMENTS_TOO_LARGE, message)


# -- the operator --------------------------------------------------------------------------------


class StaleEntry(UndoLogError):
    """An entry with this name belongs to an earlier saga of the same name, not yet collected."""


class NotLeading(UndoLogError):
    """This operator no longer holds the Lease (or cannot be sure it does): it sends nothing."""


# -- agents and people ---------------------------------------------------------------------------


class SagaEnded(UndoLogError):
    """The saga is no longer Active: no step may be registered or run."""


class NotSent(UndoLogError):
    """Raised by an agent inside a step whose tool call provably never left (refused locally,
    before any request): the effect is recorded NotSent and the step is not compensated. Raise
    it only with that proof; when in doubt let the real error through (it is compensated)."""


class TaskAbandoned(UndoLogError):
    """The server ended the task it ran for a step cancelled or failed (MCP's tasks extension):
    by its word nothing was done, so there is nothing to undo."""


class RewindNotDone(UndoLogError):
    """A rewind was refused (past a committed Pivot, the saga ending), or the saga halted or
    failed while rewinding; the message says which and why."""


class NoSaga(UndoLogError):
    """An @undoable tool was called outside `async with saga:`."""


class CommandError(UndoLogError):
    """A refusal a person can act on (the CLI prints it without a traceback, exit code 1)."""
