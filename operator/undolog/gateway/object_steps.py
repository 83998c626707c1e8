"""Tool calls that change a Kubernetes object (a mapping's `kubernetes`): the object named from
the call's arguments, read over the API before the call and right after it, as the user its
undo will act as (the caller, or the mapping's ServiceAccount): the gateway never reads, and the
operator never writes, with more rights than that user has."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from undolog import errors
from undolog.api import ActAs, GuardStatus, ObjectUndo
from undolog.api.gateway import ObjectMapping
from undolog.decisions import object_undo
from undolog.decisions.principals import SERVICE_ACCOUNT_PREFIX, Principal
from undolog.decisions.undo_expressions import fill
from undolog.errors import UndoLogError
from undolog.kube import Kube
from undolog.kube.objects import ObjectReads, Objects

log = logging.getLogger("undolog.gateway")


class ObjectNotRead(UndoLogError):
    """The object could not be named or read before the call: nothing is called."""


@dataclass(frozen=True)
class ObjectStep:
    """A call's object, as registered, and how to read it again after the call."""

    undo: ObjectUndo
    objects: Objects

    async def left(self) -> GuardStatus | None:
        """The object right after the call; None (its undo then halts for a person) when it
        cannot be read or is too large to keep."""
        try:
            return object_undo.left(await self.objects.get(self.undo.object))
        except Exception as error:  # the call is made: its undo halts for a person instead
            log.warning("%s could not be read after the call: %s", self.undo.object, error)
            return None


class ObjectSteps:
    def __init__(self, kube: Kube) -> None:
        self.reads = ObjectReads(kube)

    async def before(
        self, mapping: ObjectMapping, arguments: dict[str, Any], namespace: str, caller: Principal | None
    ) -> ObjectStep:
        """The object the call changes, read as the user its undo acts as; ObjectNotRead when it
        cannot be named or read, or is more than UndoLog keeps."""
        named = fill(mapping.model_dump(exclude={"service_account"}), {"args": arguments}, "", defer_output=False)
        values: dict[str, Any] = named.value
        changes = values["changes"] if isinstance(values["changes"], dict) else None
        act_as = acting_as(mapping, namespace, caller)
        resource, where = str(values["resource"]), values["namespace"] or namespace
        try:
            objects, ref, before = await self.reads.before(resource, where, str(values["name"]), act_as)
        except errors.KubeError as refused:
            raise ObjectNotRead(f"the object it changes could not be read: {refused.message}") from None
        return ObjectStep(ObjectUndo(object=ref, before=before, act_as=act_as, changes=changes), objects)


def acting_as(mapping: ObjectMapping, namespace: str, caller: Principal | None) -> ActAs:
    """The mapping's ServiceAccount (of the saga's namespace), else the caller."""
    if mapping.service_account is not None:
        return ActAs(user=f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{mapping.service_account}")
    if caller is None:
        raise ObjectNotRead(
            "its undo acts as the caller, and this gateway does not know who calls (auth: none): configure auth, or "
            "name a ServiceAccount in the mapping's kubernetes.serviceAccount"
        )
    return ActAs(user=caller.name)
