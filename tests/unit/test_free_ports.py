"""Ports for the processes the tests, the demo and the benchmarks start side by side."""

from __future__ import annotations

import socket

from devtools.control_plane.local import free_ports


def test_ports_picked_together_are_distinct_and_free() -> None:
    ports = free_ports(64)
    assert len(set(ports)) == len(ports)
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # raises if something still holds it
