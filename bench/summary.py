"""bench/results/summary.json: the figures the issues ask for, from the JSON the last `make bench`
wrote (compensation, compensation_idle, forward, scale, idle, replicas, footprint, archive,
deep, wave, gateway). A figure that was not measured is null and `not_measured` says why, or
the committed run's value named in `carried_over`; nothing is estimated.
Committed with the change that moves a figure, so figures can be checked without re-running."""

from __future__ import annotations

import json
from typing import Any

from bench.harness import RESULTS

# Every key the summary has, in order; None until measured.
KEYS = (
    "etcd_fsync",
    "abort_first_call_p50_ms",
    "abort_first_call_p99_ms",
    "abort_first_call_max_ms",
    "abort_first_call_p50_ms_10",
    "abort_first_call_p99_ms_10",
    "floor_abort_first_call_p50_ms",
    "floor_abort_first_call_p99_ms",
    "floor_abort_first_call_p50_ms_10",
    "floor_abort_first_call_p99_ms_10",
    "operator_cpu_ms_per_compensated_saga",
    "floor_cpu_ms_per_compensated_saga",
    "python_floor_cpu_ms_per_compensated_saga",
    "writes_per_compensated_saga",
    "writes_per_forward_step",
    "entry_writes_per_forward_step",
    "saga_writes_per_forward_saga",
    "compensation_fraction_of_ceiling",
    "forward_fraction_of_ceiling",
    "rss_mib_10k",
    "idle_rss_mib",
    "idle_cpu_ms_per_s",
    "resume_ratio_10k_to_1k",
    "throughput_by_replicas",
    "etcd_bytes_per_finished_saga",
    "json_bytes_per_finished_saga",
    "compensated_sagas_per_s",
    "archive_sagas_per_s",
    "archive_drain_after_outage_seconds",
    "deep_saga_entries_per_s_2000",
    "deep_saga_entries_per_s_10000",
    "deep_saga_time_ratio_10000_to_2000",
    "wave_halted_sagas",
    "wave_max_calls_in_1s",
    "wave_seconds_after_return",
    "mcp_gateway_added_p50_ms",
    "mcp_gateway_added_p99_ms",
    "mcp_gateway_floor_p50_ms",
    "mcp_gateway_floor_p99_ms",
    "mcp_gateway_added_to_floor_p50",
    "mcp_gateway_added_to_floor_p99",
    "mcp_gateway_entry_writes_per_call",
    "mcp_gateway_session_added_p50_ms",
    "mcp_gateway_session_added_p99_ms",
    "mcp_gateway_session_floor_p50_ms",
    "mcp_gateway_session_floor_p99_ms",
    "mcp_gateway_session_added_to_floor_p50",
    "mcp_gateway_session_added_to_floor_p99",
    "mcp_gateway_auth_service_account_added_p50_ms",
    "mcp_gateway_auth_service_account_added_p99_ms",
    "mcp_gateway_auth_jwt_added_p50_ms",
    "mcp_gateway_auth_jwt_added_p99_ms",
    "mcp_conformance_scenarios_direct",
    "mcp_conformance_scenarios_through_gateway",
    "mcp_conformance_scenarios_direct_2026",
    "mcp_conformance_scenarios_through_gateway_2026",
    "mcp_conformance_everything_direct",
    "mcp_conformance_everything_through_gateway",
    "mcp_conformance_everything_direct_2026",
    "mcp_conformance_everything_through_gateway_2026",
    "mcp_residue_effects_made",
    "mcp_residue_effects_left",
    "guard_added_p50_ms",
    "guard_read_to_undo_p50_ms",
    "guard_entry_writes_added",
)


def load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return dict(json.loads(path.read_text())) if path.exists() else None


def row(results: list[dict[str, Any]], key: str, value: int) -> dict[str, Any] | None:
    return next((r for r in results if r.get(key) == value), None)


def abort_first_call(figures: dict[str, Any], prefix: str, idle: dict[str, Any]) -> None:
    """p50 and p99 of one idle saga, and of 10 at once over several bursts of 10 when they were
    run (one burst is 10 samples)."""
    figures[f"{prefix}abort_first_call_p50_ms"] = idle["abort_to_first_call_p50_ms"]
    figures[f"{prefix}abort_first_call_p99_ms"] = idle["abort_to_first_call_p99_ms"]
    if bursts := idle.get("bursts_of_10"):
        figures[f"{prefix}abort_first_call_p50_ms_10"] = bursts["abort_to_first_call_p50_ms"]
        figures[f"{prefix}abort_first_call_p99_ms_10"] = bursts["abort_to_first_call_p99_ms"]
        # The controller's CPU per compensated saga over those bursts (the operator's, or the floor's).
        figures[f"{prefix or 'operator_'}cpu_ms_per_compensated_saga"] = bursts["driver_cpu_ms_per_saga"]


def summarize() -> dict[str, Any]:
    figures: dict[str, Any] = dict.fromkeys(KEYS)
    missing: dict[str, str] = {}
    names = (
        "compensation",
        "compensation_idle",
        "forward",
        "scale",
        "idle",
        "replicas",
        "footprint",
        "archive",
        "deep",
        "wave",
        "gateway",
        "guard",
        "conformance",
        "residue",
    )
    sources = {name: load(name) for name in names}
    fsync = {name: data.get("etcd_fsync") for name, data in sources.items() if data is not None}
    figures["etcd_fsync"] = all(fsync.values()) if fsync else None

    if idle := sources["compensation_idle"]:
        abort_first_call(figures, "", idle["results"])
        figures["abort_first_call_max_ms"] = idle["results"].get("abort_to_first_call_max_ms")
        # The same bursts compensated by bench/goclients/floor, the least any controller does, in the same run.
        if floor := idle["results"].get("floor"):
            abort_first_call(figures, "floor_", floor)
        # Its requests made from Python (bench/python_floor.py): the language's share, no logic.
        if (python := idle["results"].get("python_floor")) and (bursts := python.get("bursts_of_10")):
            figures["python_floor_cpu_ms_per_compensated_saga"] = bursts["driver_cpu_ms_per_saga"]
    if compensation := sources["compensation"]:
        if ten := row(compensation["results"], "sagas", 10):
            if figures["abort_first_call_p99_ms_10"] is None:
                figures["abort_first_call_p50_ms_10"] = ten["abort_to_first_call_p50_ms"]
                figures["abort_first_call_p99_ms_10"] = ten["abort_to_first_call_p99_ms"]
            # The operator's writes for one 3-entry compensation: the benchmark's abort patch and
            # the Lease renewals (time-based, not per saga) left out.
            writes = ten["api_writes"]
            own = writes.get("sagas", 0) + writes.get("undoentries", 0) + writes.get("events", 0) - ten["sagas"]
            figures["writes_per_compensated_saga"] = round(own / ten["sagas"], 1)
        if hundred := row(compensation["results"], "sagas", 100):
            figures["compensation_fraction_of_ceiling"] = hundred["fraction_of_go_ceiling"]
    if forward := sources["forward"]:
        if one := row(forward["results"], "concurrent_sagas", 1):
            # The operator's writes for one 3-step saga, per step: the benchmark's create left out,
            # as the compensation figure leaves out its abort patch.
            writes = one["api_writes"]
            own = writes.get("sagas", 0) + writes.get("undoentries", 0) + writes.get("events", 0) - 1
            figures["writes_per_forward_step"] = round(own / 3, 2)
            # The same writes apart: each step's entry (created before its call, its outcome after,
            # its field owners dropped once the saga finished), and the saga's own, once a saga.
            figures["entry_writes_per_forward_step"] = one["entry_writes_per_step"]
            figures["saga_writes_per_forward_saga"] = float(writes.get("sagas", 0) - 1)
        if hundred := row(forward["results"], "concurrent_sagas", 100):
            figures["forward_fraction_of_ceiling"] = hundred.get("fraction_of_go_ceiling")
    if scale := sources["scale"]:
        small, large = row(scale["results"], "sagas", 1000), row(scale["results"], "sagas", 10000)
        if large:
            figures["rss_mib_10k"] = large["operator_peak_rss_mib"]
        if small and large:
            figures["resume_ratio_10k_to_1k"] = round(
                large["resume_and_finish_seconds"] / small["resume_and_finish_seconds"], 1
            )
    if operator_idle := sources["idle"]:
        figures["idle_rss_mib"] = operator_idle["results"]["operator_rss_mib"]
        if "operator_cpu_ms_per_s" in operator_idle["results"]:
            figures["idle_cpu_ms_per_s"] = operator_idle["results"]["operator_cpu_ms_per_s"]
    if replicas := sources["replicas"]:
        figures["throughput_by_replicas"] = {
            str(r["replicas"]): r["sagas_per_second"] for r in replicas["results"]["throughput"]
        }

    if (footprint := sources["footprint"]) and (measured := footprint["results"].get("footprint")):
        figures["etcd_bytes_per_finished_saga"] = measured["etcd_bytes_per_finished_saga"]
        figures["json_bytes_per_finished_saga"] = measured["json_bytes_per_finished_saga"]
    if archive := sources["archive"]:
        # The same run: sagas compensated a second, and archived a second counted from the same start.
        figures["compensated_sagas_per_s"] = archive["results"]["compensated_sagas_per_s"]
        figures["archive_sagas_per_s"] = archive["results"]["archive_sagas_per_s"]
        if "archive_drain_after_outage_seconds" in archive["results"]:
            figures["archive_drain_after_outage_seconds"] = archive["results"]["archive_drain_after_outage_seconds"]

    if deep := sources["deep"]:
        for depth in (2000, 10000):
            if measured_depth := row(deep["results"]["depths"], "depth", depth):
                figures[f"deep_saga_entries_per_s_{depth}"] = measured_depth["entries_per_s"]
        if {r["depth"] for r in deep["results"]["depths"]} >= {2000, 10000}:
            figures["deep_saga_time_ratio_10000_to_2000"] = deep["results"]["time_ratio"]

    if wave := sources["wave"]:
        # 500 sagas of 3 entries aborted while their participant refused connections for 60 s.
        figures["wave_halted_sagas"] = wave["results"]["halted_sagas"]
        figures["wave_max_calls_in_1s"] = wave["results"]["max_calls_in_1s"]
        figures["wave_seconds_after_return"] = wave["results"]["seconds_after_return"]

    if gateway := sources["gateway"]:
        # 200 mapped tool calls through `undolog mcp`, each beside the same call made directly,
        # on today's stateless revision (the handle); then on the session era.
        figures["mcp_gateway_entry_writes_per_call"] = gateway["results"]["entry_writes_per_call"]
        # The floor: the two entry writes alone from Python in the same rounds, plus the read-only hop.
        for prefix, measured in (
            ("mcp_gateway", gateway["results"]),
            ("mcp_gateway_session", gateway["results"].get("session")),
        ):
            if measured is None:
                continue
            figures[f"{prefix}_added_p50_ms"] = measured["added"]["p50_ms"]
            figures[f"{prefix}_added_p99_ms"] = measured["added"]["p99_ms"]
            if floor := measured.get("floor"):
                figures[f"{prefix}_floor_p50_ms"] = floor["p50_ms"]
                figures[f"{prefix}_floor_p99_ms"] = floor["p99_ms"]
                figures[f"{prefix}_added_to_floor_p50"] = measured["added_to_floor"]["p50_ms"]
                figures[f"{prefix}_added_to_floor_p99"] = measured["added_to_floor"]["p99_ms"]
        # What requiring a token adds, against the gateway without auth in the same rounds.
        for kind, measured in gateway["results"].get("authenticated", {}).items():
            figures[f"mcp_gateway_auth_{kind}_added_p50_ms"] = measured["auth_added"]["p50_ms"]
            figures[f"mcp_gateway_auth_{kind}_added_p99_ms"] = measured["auth_added"]["p99_ms"]

    if guard := sources["guard"]:
        # 200 one-step sagas aborted one at a time, alternately guarded and not.
        figures["guard_added_p50_ms"] = guard["results"]["added_p50_ms"]
        figures["guard_read_to_undo_p50_ms"] = guard["results"]["guard_read_p50_ms"]
        measured = guard["results"]
        figures["guard_entry_writes_added"] = (
            measured["guarded"]["entry_writes"] - measured["unguarded"]["entry_writes"]
        )

    if conformance := sources["conformance"]:
        # The suite's server scenarios: 0.1.16's (the session era), and 2026-07-28's requirements.
        # Against the tests' upstream, then against server-everything from npm.
        judged = [
            ("scenarios", conformance["results"]),
            ("everything", conformance["results"].get("server-everything")),
        ]
        for server, results in judged:
            for era, suffix in (("2025-11-25", ""), ("2026-07-28", "_2026")):
                if found := (results or {}).get(era):
                    scenarios = found["scenarios"]
                    figures[f"mcp_conformance_{server}_direct{suffix}"] = f"{len(found['direct'])}/{scenarios}"
                    figures[f"mcp_conformance_{server}_through_gateway{suffix}"] = (
                        f"{len(found['through_gateway'])}/{scenarios}"
                    )

    if residue := sources["residue"]:
        # Scripted sessions on real servers, each aborted after every prefix of its calls.
        servers = residue["results"].values()
        figures["mcp_residue_effects_made"] = sum(s["effects_made"] for s in servers)
        figures["mcp_residue_effects_left"] = sum(s["effects_left"] for s in servers)

    for key, value in figures.items():
        if value is None:
            missing.setdefault(key, "not in bench/results: run `make bench`")
    return {**figures, "not_measured": missing}


def carried(summary: dict[str, Any], previous: dict[str, Any]) -> dict[str, Any]:
    """Figures this run did not measure keep the committed run's value, named in `carried_over`
    (a benchmark run alone, `python -m bench.deep`, updates its own keys and no others)."""
    kept = {k: previous[k] for k, v in summary.items() if v is None and previous.get(k) is not None}
    missing = {k: why for k, why in summary["not_measured"].items() if k not in kept}
    return {**summary, **kept, "not_measured": missing, "carried_over": sorted(kept)}


def main() -> None:
    path = RESULTS / "summary.json"
    previous = json.loads(path.read_text()) if path.exists() else {}
    summary = carried(summarize(), previous)
    path.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
