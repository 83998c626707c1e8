"""Plot compensation throughput against concurrency (docs/throughput.png) from bench/results."""

from __future__ import annotations

import json

import matplotlib

from bench.harness import RESULTS, ROOT

matplotlib.use("Agg")
import matplotlib.pyplot as plt

OUT = ROOT / "docs" / "throughput.png"


def main() -> None:
    operator = json.loads((RESULTS / "compensation.json").read_text())["results"]
    sqlite = json.loads((RESULTS / "sqlite.json").read_text())["results"]["compensation"]
    figure, axis = plt.subplots(figsize=(7, 4.2), dpi=120)
    for rows, label, marker in (
        (operator, "UndoLog operator (etcd via kube-apiserver)", "o"),
        (sqlite, "in-process SQLite ledger", "s"),
    ):
        axis.plot([r["sagas"] for r in rows], [r["compensations_per_second"] for r in rows], marker=marker, label=label)
    ceiling = [(r["sagas"], r["raw_writes_per_second"] / r["api_writes_per_saga"] * 3) for r in operator]
    axis.plot(
        *zip(*ceiling, strict=True), linestyle="--", color="grey", label="raw API write ceiling, in compensations/s"
    )
    axis.set_xscale("log")
    axis.set_xlabel("sagas aborted together (3 entries each)")
    axis.set_ylabel("compensations per second")
    axis.set_title("Compensation throughput, 2 cores, everything on one machine")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(OUT)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
