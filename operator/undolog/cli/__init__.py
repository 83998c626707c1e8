"""The `undolog` command (also installed as `kubectl-undolog`)."""

from undolog.cli.app import app, main

__all__ = ["app", "main"]
