"""The benchmarks' port picker: the ports one process is given never coincide."""

from __future__ import annotations

import socket

from benchmarks.common import free_port, free_ports


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(8)
    assert len(ports) == 8
    assert len(set(ports)) == 8
    socks = [socket.socket() for _ in ports]
    try:
        for s, p in zip(socks, ports, strict=True):
            s.bind(("127.0.0.1", p))  # each is free once the picker let it go
    finally:
        for s in socks:
            s.close()


def test_free_port_is_one_bindable_port() -> None:
    p = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", p))
        assert s.getsockname()[1] == p
