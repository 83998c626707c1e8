"""A step that changes one Kubernetes object, undone natively by the operator:

async with changing(saga, "scale-web", "deployment", "web", namespace="shop") as step:
    ...  # scale it, patch it, delete it, create it: with kubectl, a client, anything

The object is read before the step (absent, or its manifest) and after it, as the agent's own
user; on an abort the operator puts back what the step changed, acting as that user, and only
where nothing changed it again since (else the entry halts as Conflict for a person)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from undolog.api import ActAs, ObjectUndo
from undolog.api.undo_entry import MAX_OBJECT_BYTES
from undolog.decisions import object_undo
from undolog.decisions.arguments import within
from undolog.kube import Kube
from undolog.kube.objects import Discovery, Objects
from undolog.sdk.saga import SagaRun, StepRun


async def acting_self(kube: Kube) -> ActAs:
    """The agent's own user and groups, as the API sees them (a SelfSubjectReview): what the
    undo acts as."""
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    answer = await kube.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", review)
    info = answer["status"]["userInfo"]
    return ActAs(user=str(info["username"]), groups=[str(g) for g in info.get("groups") or ()])


@asynccontextmanager
async def changing(
    saga: SagaRun,
    step: str,
    resource: str,
    name: str,
    *,
    namespace: str | None = None,
    changes: dict[str, Any] | None = None,
    depends_on: Sequence[str] | None = None,
) -> AsyncIterator[StepRun]:
    """Register `step` as a change to the object `resource`/`name` (named as kubectl names it:
    deployment, configmap, cm, deployments.apps), in `namespace` (the saga's by default; none
    for a cluster-scoped one); run the body; record the object as the body left it. `changes`:
    the shape of what the body writes (a merge patch, e.g. {"spec": {"replicas": 0}}): only
    those fields are undone, so another writer's change to others meanwhile is kept."""
    kube = saga.kube
    ref = await Discovery(kube).resolve(resource, namespace or saga.namespace, name)
    objects = Objects(kube)
    before = await objects.get(ref)
    if before is not None and not within(before, MAX_OBJECT_BYTES):
        raise ValueError(f"{ref} is more than the {MAX_OBJECT_BYTES} bytes UndoLog keeps: step {step!r} not registered")
    undo = ObjectUndo(object=ref, before=before, act_as=await acting_self(kube), changes=changes)
    run = await saga.register(step, None, depends_on, kubernetes=undo)
    try:
        yield run
    except BaseException as error:
        run.left = object_undo.left(await objects.get(ref))
        saga.note_failure(run)
        await saga.finish(run, error)
        raise
    run.left = object_undo.left(await objects.get(ref))
    await saga.finish(run)
