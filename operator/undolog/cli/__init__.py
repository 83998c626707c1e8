"""The `undolog` command (also installed as `kubectl-undolog`)."""

from __future__ import annotations

import sys


def main() -> None:
    """The command; without the `cli` extra, how to get it (the SDK installs lean, without typer)."""
    try:
        from undolog.cli.app import main as run
    except ModuleNotFoundError as missing:
        if missing.name not in ("typer", "click", "psycopg", "psycopg_pool"):
            raise
        print(
            f"error: the undolog command needs {missing.name}, which `pip install undolog` leaves out: "
            "pip install 'undolog[cli]'",
            file=sys.stderr,
        )
        raise SystemExit(1) from None
    run()
