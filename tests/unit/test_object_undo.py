"""The undo of a change to a Kubernetes object: only what the step changed, only where nothing
changed it again since; server-owned fields never compared nor written."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
from hypothesis import given
from hypothesis import strategies as st

from undolog.api import UndoEntry
from undolog.conventions import UNDONE_BY_ANNOTATION
from undolog.decisions.object_undo import (
    AlreadyUndone,
    Conflict,
    Create,
    Delete,
    Manifest,
    Restore,
    Undo,
    changed_paths,
    conflicting_fields,
    kept,
    pointer,
    shown,
    undo,
)
from undolog.inspect import SECRET_VALUE, conflict_fields


def undone(
    before: Manifest | None,
    after: Manifest | None,
    now: Manifest | None,
    *,
    anyway: bool = False,
    changes: Manifest | None = None,
) -> Undo:
    return undo(before, after, now, undone_by="undo-1", anyway=anyway, changes=changes)


def deployment(replicas: int = 2, version: str = "10", uid: str = "u-1", **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "web",
            "namespace": "shop",
            "uid": uid,
            "resourceVersion": version,
            "generation": 3,
            "labels": dict(labels),
            "annotations": {"deployment.kubernetes.io/revision": version},
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": {"replicas": replicas, "template": {"spec": {"containers": [{"name": "web", "image": "web:1"}]}}},
        "status": {"replicas": replicas, "observedGeneration": 3},
    }


def applied(now: dict[str, Any], plan: Restore) -> dict[str, Any]:
    return jsonpatch.apply_patch(now, plan.operations)  # type: ignore[no-any-return]


def test_a_scale_nobody_touched_since_is_scaled_back_on_that_field_alone() -> None:
    before, after = deployment(2, "10"), deployment(5, "11")
    now = deployment(5, "14", team="shop")  # status and an unrelated label changed since
    plan = undone(before, after, now)
    assert isinstance(plan, Restore)
    assert plan.paths == ["spec.replicas"]
    assert plan.operations[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "14"}
    restored = applied(now, plan)
    assert restored["spec"]["replicas"] == 2
    assert restored["metadata"]["labels"] == {"team": "shop"}  # the later change kept
    assert restored["status"] == now["status"]  # never written


def test_a_scale_changed_again_since_is_a_conflict_naming_the_field() -> None:
    plan = undone(deployment(2), deployment(5, "11"), deployment(10, "12"))
    assert isinstance(plan, Conflict)
    assert plan.differing == ["spec.replicas"]
    plan = undone(deployment(2), deployment(5, "11"), deployment(10, "12"), anyway=True)
    assert isinstance(plan, Restore)
    assert plan.paths == ["spec.replicas"]


def test_a_label_with_dots_and_slashes_is_named_and_pointed_to() -> None:
    before = deployment(2, **{"app.kubernetes.io/tier": "gold"})
    after = deployment(2, "11", **{"app.kubernetes.io/tier": "silver"})
    plan = undone(before, after, deployment(2, "12", **{"app.kubernetes.io/tier": "bronze"}))
    assert isinstance(plan, Conflict)
    assert plan.differing == ['metadata.labels["app.kubernetes.io/tier"]']
    restore = undone(before, after, after)
    assert isinstance(restore, Restore)
    assert restore.operations[1]["path"] == "/metadata/labels/app.kubernetes.io~1tier"


def test_a_created_object_is_deleted_only_as_the_step_left_it() -> None:
    created = deployment(2, "11")
    later = deployment(2, "15")  # only its status and revision annotation moved
    assert undone(None, created, later) == Delete("u-1", "15")
    changed = undone(None, created, deployment(4, "16"))
    assert isinstance(changed, Conflict)
    assert changed.differing == ["spec.replicas"]
    again = undone(None, created, deployment(2, "17", uid="u-2"))
    assert isinstance(again, Conflict)
    assert "another uid" in again.message
    assert isinstance(undone(None, created, None), AlreadyUndone)


def test_a_deleted_object_is_created_again_without_what_the_server_set() -> None:
    before = deployment(2, "10", app="web")
    plan = undone(before, None, None)
    assert isinstance(plan, Create)
    assert "status" not in plan.manifest
    assert set(plan.manifest["metadata"]) == {"name", "namespace", "labels", "annotations"}
    assert plan.manifest["metadata"]["annotations"] == {UNDONE_BY_ANNOTATION: "undo-1"}
    assert isinstance(undone(before, None, deployment(1, "30", uid="u-9")), Conflict)
    # Created again by this very undo (a crash before it was recorded): undone, not a conflict.
    ours = {**plan.manifest, "metadata": {**plan.manifest["metadata"], "uid": "u-3", "resourceVersion": "31"}}
    assert isinstance(undone(before, None, ours), AlreadyUndone)


def test_an_object_deleted_since_it_was_changed_is_a_conflict() -> None:
    assert isinstance(undone(deployment(2), deployment(5, "11"), None), Conflict)


def test_nothing_to_write_when_every_changed_field_is_back() -> None:
    """Set back since (by a person, or a second undo): nothing of a later change is lost."""
    assert isinstance(undone(deployment(2), deployment(5, "11"), deployment(2, "12")), AlreadyUndone)


def test_kept_drops_what_the_server_owns() -> None:
    written = kept(deployment())
    assert "status" not in written
    assert set(written["metadata"]) == {"name", "namespace", "labels"}


def test_paths_are_shown_and_pointed() -> None:
    assert shown(("spec", "replicas")) == "spec.replicas"
    assert shown(("data", "a.b")) == 'data["a.b"]'
    assert pointer(("data", "a/b~c")) == "/data/a~1b~0c"


keys = st.sampled_from(["a", "b", "c.d", "e/f"])
leaves = st.one_of(st.integers(-3, 3), st.text(max_size=2), st.none(), st.lists(st.integers(0, 2), max_size=2))
trees = st.recursive(leaves, lambda inner: st.dictionaries(keys, inner, max_size=3), max_leaves=8)
data = st.dictionaries(keys, trees, max_size=3)


def image(payload: dict[str, Any], version: str) -> dict[str, Any]:
    return {"metadata": {"name": "x", "uid": "u", "resourceVersion": version}, "data": payload}


@given(data, data, data)
def test_an_undo_restores_exactly_the_step_s_fields_or_names_a_conflict(
    before: dict[str, Any], after: dict[str, Any], later: dict[str, Any]
) -> None:
    """Whatever a later writer did: the undo either writes the step's fields back to before and
    leaves every other field as the later writer left it, or refuses, naming a field the step
    changed and the later writer changed again."""
    b, a, n = image(before, "1"), image(after, "2"), image(later, "3")
    plan = undone(b, a, copy.deepcopy(n))
    step = changed_paths(kept(b), kept(a))
    if isinstance(plan, Conflict):
        assert plan.differing
        assert set(plan.differing) <= {shown(p) for p in step}
        return
    result = applied(n, plan) if isinstance(plan, Restore) else n
    assert isinstance(plan, (Restore, AlreadyUndone))
    written = kept(result)
    for path in step:
        assert _at(written, path) == _at(kept(b), path)
    untouched = [p for p in changed_paths(kept(n), written) if p not in step]
    assert all(any(p[: len(s)] == s or s[: len(p)] == p for s in step) for p in untouched)
    assert result["metadata"]["resourceVersion"] == "3"


def _at(manifest: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(manifest, dict) or key not in manifest:
            return "<absent>"
        manifest = manifest[key]
    return manifest


def test_a_person_is_shown_each_conflicting_field_before_after_and_now() -> None:
    before, after = deployment(2, team="a"), deployment(5, "11", team="b")
    now = deployment(10, "12", team="b", owner="c")  # replicas changed again; the label the step set kept
    assert conflicting_fields(before, after, now) == [("spec.replicas", 2, 5, 10)]
    assert conflicting_fields(None, after, None) == []  # gone again, as before the step: nothing lost


def test_what_another_writer_changed_while_the_step_ran_is_not_taken_for_the_step_s() -> None:
    """The step scaled (its changes say so); a label landed between the read before and the
    read after: only the replicas are undone, the label is kept."""
    before, after = deployment(2), deployment(5, "12", team="other")
    plan = undone(before, after, after, changes={"spec": {"replicas": 0}})
    assert isinstance(plan, Restore)
    assert plan.paths == ["spec.replicas"]
    assert undone(before, after, after).paths == ["metadata.labels.team", "spec.replicas"]  # type: ignore[union-attr]
    whole = undone(before, after, after, changes={"spec": 5})  # a leaf above a field: all of spec
    assert isinstance(whole, Restore)
    assert whole.paths == ["spec.replicas"]


def test_a_secret_s_conflict_names_its_keys_and_shows_no_value() -> None:
    def secret(password: str, version: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds", "uid": "u", "resourceVersion": version},
            "data": {"password": password},
        }

    entry = UndoEntry.model_validate(
        {
            "metadata": {"name": "s-1", "namespace": "n"},
            "spec": {
                "saga": "s",
                "undoId": "00000000-0000-4000-8000-000000000000",
                "stackPosition": 1,
                "effectId": "e",
                "step": "patch",
                "registeredAt": "2026-12-06T00:00:00Z",
                "kubernetes": {
                    "object": {
                        "apiVersion": "v1",
                        "kind": "Secret",
                        "resource": "secrets",
                        "namespace": "n",
                        "name": "creds",
                    },
                    "before": secret("YmVmb3Jl", "1"),
                    "actAs": {"user": "system:serviceaccount:n:agent"},
                },
            },
            "status": {
                "state": "Failed",
                "reason": "Conflict",
                "guard": {
                    "after": secret("YWZ0ZXI=", "2"),
                    "afterDigest": "sha256:x",
                    "now": secret("bGF0ZXI=", "3"),
                    "differing": ["data.password"],
                },
            },
        }
    )
    assert conflict_fields(entry) == [("data.password", SECRET_VALUE, SECRET_VALUE, SECRET_VALUE)]
