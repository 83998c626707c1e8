"""The triage CLI as a subprocess against the real cluster: output and exit codes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.test_compensation import abort, external_saga, register
from tests.conftest import BIN, Cluster, own_control_plane
from tests.support.identities import service_account_kubeconfig
from tests.support.manifests import call, saga, undo_entry
from tests.support.operator_process import OperatorProcess
from tests.support.participants import Participant, Reply
from tests.support.waiting import saga_phase
from undolog.api import MAX_NESTING
from undolog.inspect import Inspector
from undolog.kube import Kube

pytestmark = pytest.mark.cluster


def undolog(
    cluster: Cluster, *args: str, kubeconfig: Path | None = None, archive: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI as a person runs it; `archive`: the archive's DSN in its environment."""
    env = {**cluster.env, "KUBECONFIG": str(kubeconfig or cluster.kubeconfig), "COLUMNS": "250"}
    if archive:
        env["UNDOLOG_ARCHIVE_DSN"] = archive
    return subprocess.run(
        [sys.executable, "-m", "undolog.cli", *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def parse_in_another_process(text: str) -> str:
    """What `python -c 'import yaml,sys; yaml.safe_load(sys.stdin)'` makes of the output."""
    script = "import yaml,sys; print(yaml.safe_load(sys.stdin)['items'][0]['metadata']['annotations']['note'])"
    parsed = subprocess.run([sys.executable, "-c", script], input=text, capture_output=True, text=True, check=True)
    return parsed.stdout.strip()


def complete(cluster: Cluster, words: str, cword: int) -> str:
    """What bash completion asks of `undolog` (typer's protocol) for the words typed so far."""
    completion = {"_UNDOLOG_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(cword)}
    installed = Path(sys.executable).parent / "undolog"
    ran = subprocess.run(
        [str(installed)], env={**cluster.env, **completion}, capture_output=True, text=True, check=False
    )
    return ran.stdout


async def halted_saga(kube: Kube, namespace: str, participant: Participant, name: str = "stuck") -> dict[str, Any]:
    participant.script("/revoke", Reply(400, {"error": "no such grant"}))
    await register(kube, namespace, participant, "delete-user", "revoke", "unsend")
    await external_saga(kube, namespace, name, [call("delete-user"), call("revoke"), call("unsend")], orgId="acme")
    await saga_phase(kube, namespace, name, "Active")  # its timeline starts there (aborted sooner: at Compensating)
    await abort(kube, namespace, name)
    return await saga_phase(kube, namespace, name, "Halted")


async def test_list_puts_halted_first_and_filters(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    await halted_saga(kube, namespace, participant)
    await external_saga(kube, namespace, "fine", [call("unsend")])
    await saga_phase(kube, namespace, "fine", "Active")
    listed = undolog(cluster, "list", "-n", namespace)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["NAME", "PHASE", "STEPS", "UNDONE", "REASON", "AGE"]  # one namespace: as kubectl
    assert lines[1].split()[:5] == ["stuck", "Halted", "3", "1", "CompensationFailed"]
    assert lines[2].split()[:4] == ["fine", "Active", "1", "0"]
    assert "\x1b[" not in listed.stdout  # no colour, no styling: plain text

    halted = json.loads(undolog(cluster, "list", "-n", namespace, "--phase", "halted", "-o", "json").stdout)
    assert [item["metadata"]["name"] for item in halted["items"]] == ["stuck"]
    by_org = undolog(cluster, "list", "-A", "--org", "acme", "-o", "yaml")
    assert "name: stuck" in by_org.stdout
    assert "name: fine" not in by_org.stdout
    everywhere = undolog(cluster, "list", "-A")
    assert everywhere.stdout.splitlines()[0].split()[0] == "NAMESPACE"
    assert "stuck" in everywhere.stdout
    names = undolog(cluster, "list", "-n", namespace, "-o", "name")
    assert names.stdout.split() == ["saga.undolog.io/stuck", "saga.undolog.io/fine"]
    wide = undolog(cluster, "list", "-n", namespace, "-o", "wide").stdout.splitlines()
    assert wide[0].split()[-4:] == ["ORG", "FAILED-STEP", "PRINCIPAL", "MESSAGE"]
    assert "acme" in wide[1]
    calling = undolog(cluster, "list", "-n", namespace, "--function", "revoke", "-o", "name")
    assert calling.stdout.split() == ["saga.undolog.io/stuck"]


async def test_templates_field_selectors_and_no_headers_like_kubectl(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    await halted_saga(kube, namespace, participant)
    await external_saga(kube, namespace, "fine", [call("unsend")])
    await saga_phase(kube, namespace, "fine", "Active")
    template = '{range .items[*]}{.metadata.name}={.status.phase}{"\\n"}{end}'
    lines = undolog(cluster, "list", "-n", namespace, "-o", f"jsonpath={template}")
    print(f"\n$ undolog list -n {namespace} -o jsonpath='{template}'\n{lines.stdout}")
    assert lines.stdout.splitlines() == ["stuck=Halted", "fine=Active"], lines.stderr
    phase = undolog(cluster, "show", "stuck", "-n", namespace, "-o", "jsonpath={.status.phase}")
    assert phase.stdout.strip() == "Halted"
    columns = undolog(cluster, "list", "-n", namespace, "-o", "custom-columns=NAME:.metadata.name,ORG:.spec.orgId")
    assert columns.stdout.split() == ["NAME", "ORG", "stuck", "acme", "fine", "<none>"]
    selected = undolog(cluster, "list", "-n", namespace, "--field-selector", "status.phase=Halted", "--no-headers")
    assert [line.split()[0] for line in selected.stdout.splitlines()] == ["stuck"], selected.stderr
    # The same field as kubectl selects it (the CRD declares it selectable).
    kubectl = cluster.kubectl("get", "sagas", "-n", namespace, "--field-selector", "spec.orgId=acme", "-o", "name")
    assert kubectl.stdout.split() == ["saga.undolog.io/stuck"]
    bad = undolog(cluster, "list", "-n", namespace, "-o", "jsonpath={.items[}")
    assert bad.returncode == 2
    assert "is not a JSONPath expression" in bad.stderr
    timed = undolog(cluster, "list", "-n", namespace, "--request-timeout", "soon")
    assert timed.returncode == 2
    assert "'soon' is not a duration such as 30s, 2m or 1h" in timed.stderr
    assert undolog(cluster, "list", "-n", namespace, "--request-timeout", "30s", "-o", "name").returncode == 0


async def test_machine_output_survives_brackets_and_markup(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    """-o yaml/json are written as plain text: brackets, markup-like text and long lines pass
    through untouched and parse back."""
    await halted_saga(kube, namespace, participant)
    odd = "[bold red]not markup[/] [link=x]y[/link] " + "z" * 300
    await kube.patch("sagas", namespace, "stuck", {"metadata": {"annotations": {"note": odd}}})
    listed = undolog(cluster, "list", "-n", namespace, "-o", "yaml")
    parsed = parse_in_another_process(listed.stdout)
    print(f"\nundolog list -o yaml | python -c 'yaml.safe_load(...)' -> note = {parsed[:60]}...")
    assert parsed == odd
    shown = json.loads(undolog(cluster, "show", "stuck", "-n", namespace, "-o", "json").stdout)
    assert [item["kind"] for item in shown["items"]] == ["Saga", "UndoEntry", "UndoEntry", "UndoEntry"]
    assert shown["items"][0]["metadata"]["annotations"]["note"] == odd
    planned = yaml.safe_load(undolog(cluster, "plan", "stuck", "-n", namespace, "-o", "yaml").stdout)
    assert [(p["order"], p["entry"]) for p in planned["items"]] == [(1, "stuck-2"), (2, "stuck-1")]


async def test_text_a_participant_or_an_agent_wrote_cannot_drive_the_terminal(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    """A participant's error answer and an agent's abort reason reach `undolog show` and `list`;
    an ESC sequence in them was printed raw (restyling or retitling the person's terminal).
    Every control character is shown as its escape; -o json still carries the text as it is."""
    hostile = "\x1b]0;pwned\x07\x1b[2J\x1b[31mgone"
    participant.script("/revoke", Reply(400, raw=f"no such grant {hostile}".encode()))
    await register(kube, namespace, participant, "revoke")
    await external_saga(kube, namespace, "odd", [call("revoke")])
    await kube.patch("sagas", namespace, "odd", {"metadata": {"annotations": {"undolog.io/abort-reason": hostile}}})
    await abort(kube, namespace, "odd")
    await saga_phase(kube, namespace, "odd", "Halted")
    for args in (("show", "odd"), ("list", "-o", "wide")):
        printed = undolog(cluster, *args, "-n", namespace)
        assert printed.returncode == 0, printed.stderr
        assert "\x1b" not in printed.stdout
        assert "\x07" not in printed.stdout
        assert "\\x1b]0;pwned\\x07" in printed.stdout
    shown = json.loads(undolog(cluster, "show", "odd", "-n", namespace, "-o", "json").stdout)
    assert hostile in shown["items"][1]["status"]["lastError"]


async def test_kubeconfig_context_and_impersonation_like_kubectl(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster, tmp_path: Path
) -> None:
    await halted_saga(kube, namespace, participant)
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    context = {**config["contexts"][0], "name": "on-call"}
    context["context"] = {**context["context"], "namespace": namespace}
    config["contexts"].append(context)
    other = tmp_path / "other.kubeconfig"
    other.write_text(yaml.safe_dump(config))
    scoped = undolog(cluster, "list", "--kubeconfig", str(other), "--context", "on-call", "-o", "name")
    assert scoped.stdout.split() == ["saga.undolog.io/stuck"]  # the context's namespace
    # Impersonating a user without rights: kubectl is refused, and so is undolog, by the API.
    nobody = f"system:serviceaccount:{namespace}:nobody"
    kubectl = cluster.kubectl(
        "annotate", "saga", "stuck", "-n", namespace, "undolog.io/retry=x", f"--as={nobody}", check=False
    )
    assert kubectl.returncode != 0
    assert "forbidden" in kubectl.stderr
    refused = undolog(cluster, "retry", "stuck", "-n", namespace, "--as", nobody, "--as-group", "system:authenticated")
    print(
        f"\nkubectl --as: {kubectl.stderr.strip()}\nundolog --as (exit {refused.returncode}): {refused.stderr.strip()}"
    )
    assert refused.returncode == 1
    assert f'forbidden: sagas.undolog.io "stuck" is forbidden: User "{nobody}" cannot get' in refused.stderr
    assert "undolog.io/retry" not in (await kube.get("sagas", namespace, "stuck"))["metadata"].get("annotations", {})


async def test_watch_batch_retry_completion_and_exit_codes(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    participant.script("/revoke", Reply(400), Reply(400))
    await register(kube, namespace, participant, "delete-user", "revoke")
    watching = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "undolog.cli",
        "list",
        "-n",
        namespace,
        "--watch",
        env={**cluster.env, "PYTHONUNBUFFERED": "1"},
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        for name in ("one", "two"):
            await external_saga(kube, namespace, name, [call("delete-user"), call("revoke")])
            await abort(kube, namespace, name)
        for name in ("one", "two"):
            await saga_phase(kube, namespace, name, "Halted")
        seen: list[str] = []
        assert watching.stdout is not None
        while not any(line.split()[:2] == ["two", "Halted"] for line in seen):  # a line per change, as kubectl -w
            seen.append((await asyncio.wait_for(watching.stdout.readline(), timeout=30)).decode())
    finally:
        watching.terminate()
        await watching.wait()
    assert any(line.split()[:2] == ["one", "Halted"] for line in seen)

    batch = undolog(cluster, "retry", "--function", "revoke", "--reason", "revoke fixed", "-n", namespace)
    assert batch.returncode == 0, batch.stderr
    assert sorted(batch.stdout.splitlines()) == [
        f"{namespace}/one: retry requested",
        f"{namespace}/two: retry requested",
    ]
    for name in ("one", "two"):
        await saga_phase(kube, namespace, name, "Compensated")
    assert undolog(cluster, "retry", "-n", namespace).returncode == 2  # neither a saga nor a batch: usage
    assert undolog(cluster, "wait", "one", "-n", namespace, "--for", "compensated").returncode == 0
    wrong = undolog(cluster, "wait", "one", "-n", namespace, "--for", "Finished")
    assert wrong.returncode == 2
    assert "Finished" in wrong.stderr
    assert "Exit codes: 0 done; 1" in undolog(cluster, "--help").stdout
    completion = complete(cluster, f"undolog show -n {namespace} o", 4)
    assert completion.split() == ["one"]  # saga names, completed from the API


async def test_show_and_plan_of_a_halted_saga(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    await halted_saga(kube, namespace, participant)
    shown = undolog(cluster, "show", "stuck", "-n", namespace)
    assert shown.returncode == 0, shown.stderr
    assert f"{namespace}/stuck  Halted  CompensationFailed" in shown.stdout
    stack = [line.split() for line in shown.stdout.splitlines() if line.split()[:1] in (["3"], ["2"], ["1"])]
    assert [row[:6] for row in stack[:3]] == [
        ["3", "step3", "unsend", "v1", "Committed", "Compensated"],
        ["2", "step2", "revoke", "v1", "Committed", "Failed"],
        ["1", "step1", "delete-user", "v1", "Committed", "Pending"],
    ]
    assert "HTTP 400" in shown.stdout
    for reason in ("Active", "Failed", "CompensationFailed", "Halted"):  # successes: in the stack above
        assert reason in shown.stdout

    planned = undolog(cluster, "plan", "stuck", "-n", namespace)
    assert planned.returncode == 0, planned.stderr
    rows = [line.split() for line in planned.stdout.splitlines() if line.split()[:1] in (["1"], ["2"])]
    assert [row[:5] for row in rows] == [
        ["1", "2", "step2", "Failed", "revoke"],
        ["2", "1", "step1", "Pending", "delete-user"],
    ]
    assert participant.url("/revoke") in planned.stdout
    assert len(participant.received("/revoke")) == 1  # plan did not call anything


async def test_show_lists_an_entry_undolog_cannot_read_in_its_place(
    kube: Kube, namespace: str, participant: Participant, cluster: Cluster
) -> None:
    """An entry the API took and UndoLog cannot read (here its args nest one level past the
    bound) was left out of `undolog show` and `plan`: the stack looked complete while the
    operator would halt on it. It is a row of its own in `show`, with why, and `plan` warns that
    the operator halts when it reaches it."""
    await register(kube, namespace, participant, "undo")
    created, _ = await external_saga(kube, namespace, "odd", [call("undo"), call("undo")])
    deep: Any = 1
    for _ in range(MAX_NESTING):
        deep = {"a": deep}
    body = undo_entry("odd", 3, owner_uid=created["metadata"]["uid"], compensation=call("undo", deep=deep))
    await kube.create("undoentries", namespace, body)
    shown = undolog(cluster, "show", "odd", "-n", namespace)
    assert shown.returncode == 0, shown.stderr
    stack = [line.split() for line in shown.stdout.splitlines() if line.split()[:1] in (["3"], ["2"], ["1"])]
    assert [row[:5] for row in stack] == [
        ["3", "step3", "undo", "?", "Unreadable"],
        ["2", "step2", "undo", "v1", "Committed"],
        ["1", "step1", "undo", "v1", "Committed"],
    ]
    assert f"unreadable: spec.compensation.args: nests {MAX_NESTING + 1} levels" in shown.stdout
    planned = undolog(cluster, "plan", "odd", "-n", namespace)
    assert planned.returncode == 0, planned.stderr
    rows = [line.split()[:3] for line in planned.stdout.splitlines() if line.split()[:1] in (["1"], ["2"])]
    assert rows == [["1", "2", "step2"], ["2", "1", "step1"]]
    assert "warning: entry odd-3 cannot be read (unreadable: spec.compensation.args: nests" in planned.stderr
    assert "the operator halts when it reaches it" in planned.stderr


async def test_a_saga_undolog_cannot_read_is_named_and_the_others_are_listed(
    kube: Kube, namespace: str, cluster: Cluster
) -> None:
    """A Saga the API took and UndoLog cannot read (a step's args one level past the bound):
    `undolog list` of its namespace ended in a pydantic traceback, listing none. Now the others
    are listed, it is named on stderr with why, and `show` of it says why (exit 1)."""
    await kube.create("sagas", namespace, saga("fine"))
    deep: Any = 1
    for _ in range(MAX_NESTING):
        deep = {"a": deep}
    steps = [{"name": "s", "action": call("s-do", deep=deep), "compensation": call("s-undo")}]
    await kube.create("sagas", namespace, saga("odd", steps))
    listed = undolog(cluster, "list", "-n", namespace)
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == ["fine"]
    why = f"spec.steps.0.action.args: nests {MAX_NESTING + 1} levels of objects and arrays"
    assert f"warning: saga {namespace}/odd cannot be read ({why}" in listed.stderr
    shown = undolog(cluster, "show", "odd", "-n", namespace)
    assert shown.returncode == 1
    assert f"error: saga 'odd' in namespace '{namespace}' cannot be read ({why}" in shown.stderr


async def test_retry_skip_abort_wait_and_their_refusals(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    await halted_saga(kube, namespace, participant)
    wrong = undolog(cluster, "skip", "stuck", "7", "--reason", "x", "-n", namespace)
    assert wrong.returncode == 1
    assert "saga 'stuck' has no entry at position 7 (it has [1, 2, 3])" in wrong.stderr
    done_entry = undolog(cluster, "skip", "stuck", "3", "--reason", "x", "-n", namespace)
    assert done_entry.returncode == 1
    # The operator's own rule, in its own words (decisions.resolutions).
    assert (
        "skip of stuck-3 refused: only a Pending or Failed entry of a Halted saga can be skipped "
        "(saga Halted, entry Compensated)" in done_entry.stderr
    )

    skipped = undolog(cluster, "skip", "stuck", "2", "--reason", "revoked by hand", "-n", namespace)
    assert skipped.returncode == 0, skipped.stderr
    waited = undolog(cluster, "wait", "stuck", "--for", "Compensated", "--timeout", "30", "-n", namespace)
    assert waited.returncode == 0, waited.stderr
    assert f"{namespace}/stuck is Compensated" in waited.stdout
    entry = await kube.get("undoentries", namespace, "stuck-2")
    assert entry["status"]["skipReason"].startswith("revoked by hand (by ")  # who and when recorded

    again = undolog(cluster, "retry", "stuck", "-n", namespace)
    assert again.returncode == 1
    assert "retry refused: saga stuck is Compensated, not Halted" in again.stderr
    late = undolog(cluster, "abort", "stuck", "--reason", "x", "-n", namespace)
    assert late.returncode == 1
    assert "abort refused: saga stuck is Compensated; only an Active saga can be aborted" in late.stderr

    await external_saga(kube, namespace, "live", [call("unsend")])
    await saga_phase(kube, namespace, "live", "Active")
    never = undolog(cluster, "wait", "live", "--for", "Compensated", "--timeout", "1", "-n", namespace)
    assert never.returncode == 1
    assert "saga 'live' is Active, not Compensated, after 1 s" in never.stderr
    aborted = undolog(cluster, "abort", "live", "--reason", "customer cancelled", "-n", namespace)
    assert aborted.returncode == 0, aborted.stderr
    done = await saga_phase(kube, namespace, "live", "Compensated")
    assert "customer cancelled (by " in done["status"]["conditions"][0]["message"]


async def test_retry_of_a_halted_saga(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    await halted_saga(kube, namespace, participant)
    retried = undolog(cluster, "retry", "stuck", "--reason", "grant restored", "-n", namespace)
    assert retried.returncode == 0, retried.stderr
    done = await saga_phase(kube, namespace, "stuck", "Compensated")
    assert "grant restored (by " in done["status"]["conditions"][2]["message"]


def test_missing_saga_and_rbac_refusal_are_clear(
    cluster: Cluster, namespace: str, kube: Kube, tmp_path: Path, session_loop: asyncio.AbstractEventLoop
) -> None:
    missing = undolog(cluster, "show", "nope", "-n", namespace)
    assert missing.returncode == 1
    assert f"saga 'nope' not found in namespace '{namespace}'" in missing.stderr
    assert "Traceback" not in missing.stderr
    nobody = session_loop.run_until_complete(
        service_account_kubeconfig(kube, cluster.kubeconfig, namespace, "nobody", tmp_path / "nobody.kubeconfig")
    )
    refused = undolog(cluster, "list", "-n", namespace, kubeconfig=nobody)
    assert refused.returncode == 1
    assert (
        f'forbidden: sagas.undolog.io is forbidden: User "system:serviceaccount:{namespace}:nobody"' in refused.stderr
    )


def test_an_age_filter_that_is_no_age_is_refused_naming_the_option(cluster: Cluster, namespace: str) -> None:
    for text, said in (("1000000000d", "is longer than any age"), ("\u0661\u0662m", "is not a duration such as 90s")):
        refused = undolog(cluster, "list", "-n", namespace, "--older-than", text)
        assert refused.returncode == 2, refused.stderr  # a usage error, as click reports one
        assert "--older-than" in refused.stderr
        assert said in refused.stderr
        assert "Traceback" not in refused.stderr
    listed = undolog(cluster, "list", "-n", namespace, "--older-than", "1h30m")
    assert listed.returncode == 0, listed.stderr


async def test_wait_outlasts_an_apiserver_restart(tmp_path: Path) -> None:
    """`undolog wait` in a pipeline while the control plane is upgraded: it exited 1 at the first
    read that failed, though the saga then got where it was awaited (kubectl wait waits it out)."""
    async with own_control_plane(tmp_path) as own:
        namespace = own.namespace
        await own.kube.create("sagas", namespace, saga("deploy"))
        await own.kube.patch_status("sagas", namespace, "deploy", {"status": {"phase": "Compensating"}})
        waiting = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "undolog.cli", "wait", "deploy", "-n", namespace, "--for", "Compensated"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "KUBECONFIG": str(own.kubeconfig)},
        )
        await asyncio.to_thread(own.local.restart, "kube-apiserver", 4.0)
        await own.kube.patch_status("sagas", namespace, "deploy", {"status": {"phase": "Compensated"}})
        out, err = await asyncio.wait_for(waiting.communicate(), timeout=60)
    assert waiting.returncode == 0, err.decode()
    assert out.decode().strip() == f"{namespace}/deploy is Compensated"


def test_installed_as_a_kubectl_plugin(cluster: Cluster, namespace: str) -> None:
    plugin_dir = Path(sys.executable).parent
    assert (plugin_dir / "kubectl-undolog").exists()
    env = {**cluster.env, "PATH": f"{plugin_dir}:{BIN}:{os.environ['PATH']}"}
    result = subprocess.run(
        [str(BIN / "kubectl"), "undolog", "list", "-n", namespace], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stderr
    assert f"No sagas found in {namespace} namespace." in result.stderr  # as kubectl says it
    # `kubectl undolog re<TAB>`: kubectl asks kubectl_complete-undolog, found beside the plugin.
    assert (plugin_dir / "kubectl_complete-undolog").exists()
    completed = subprocess.run(
        [str(BIN / "kubectl"), "__complete", "undolog", "re"], capture_output=True, text=True, env=env, check=False
    )
    assert completed.stdout.splitlines()[:3] == ["retry", "rewind", ":4"], completed.stdout + completed.stderr
    options = subprocess.run(
        [str(BIN / "kubectl"), "__complete", "undolog", "list", "--out"], capture_output=True, text=True, env=env
    )
    assert options.stdout.splitlines()[0] == "--output", options.stdout + options.stderr


async def test_a_watch_goes_on_from_what_was_listed_not_from_when_it_began(kube: Kube, namespace: str) -> None:
    """`list --watch` and `show --watch` (and the dashboard) print a listing, then watch: a watch
    begun from "now" missed whatever changed in between (the dashboard showed a saga Halted for
    good after a retry). They go on from the listing's resourceVersion."""
    await kube.create("sagas", namespace, saga("moving"))
    inspector = Inspector(kube)
    listed = await inspector.listing(namespace)
    shown = await inspector.show(namespace, "moving")
    await kube.patch("sagas", namespace, "moving", {"metadata": {"annotations": {"example.com/n": "1"}}})
    for since in (listed.version, shown.saga.metadata.resource_version):
        changes = inspector.changes(namespace, "moving", since)
        changed = await asyncio.wait_for(anext(changes), 10)
        await changes.aclose()  # type: ignore[attr-defined]
        assert changed is not None
        assert changed.metadata.annotations["example.com/n"] == "1"
