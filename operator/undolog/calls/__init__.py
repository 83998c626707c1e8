"""Calls to participants over HTTP: the function registry (Webhooks) and the runner."""
