"""Ports for the processes the tests, the demo and the benchmarks start side by side."""

from __future__ import annotations

import socket

from devtools.control_plane.local import free_ports, port_taken


def test_ports_picked_together_are_distinct_and_free() -> None:
    ports = free_ports(64)
    assert len(set(ports)) == len(ports)
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # raises if something still holds it


def test_a_port_is_taken_only_while_something_listens_on_it_not_while_its_closed_connections_linger() -> None:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the control plane's servers bind
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    assert port_taken(port)
    accepted.close()  # the server closes first, as a stopped apiserver does: its side lingers in TIME_WAIT
    client.close()
    server.close()
    assert not port_taken(port)  # a server started now binds it
    with socket.socket() as other:  # another server takes it
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.bind(("127.0.0.1", port))
        other.listen()
        assert port_taken(port)
