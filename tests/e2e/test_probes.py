"""Kubernetes' probes under a flood of idle sockets (issue 29, item 3): through
the door the kubelet uses, an HTTP GET on the probe port's paths (and on the
admin port, whose default per-address bound must keep it answering too)."""

from __future__ import annotations

import http.client
import socket

import pytest

PROBE_SOURCE = "127.0.0.10"  # the kubelet: an address of its own, flooding nothing


def idle_sockets(port: int, per_source: dict[str, int]) -> list[socket.socket]:
    """Connected sockets that never send a byte, from each source address."""
    opened = []
    for source, count in per_source.items():
        for _ in range(count):
            sock = socket.socket()
            sock.bind((source, 0))
            try:
                sock.connect(("127.0.0.1", port))
            except OSError:  # refused or reset at accept: the server's choice, still a try
                sock.close()
                continue
            opened.append(sock)
    return opened


def probe(port: int, path: str) -> int | str:
    """One probe as the kubelet sends it: a fresh connection, GET, the status."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(PROBE_SOURCE, 0))
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except OSError as exc:  # closed at accept, reset, timed out: a failed probe
        return type(exc).__name__
    finally:
        conn.close()


# About 300 idle sockets from one address, as the issue found, and more from 8 others.
FLOOD = {"127.0.0.1": 300, **{f"127.0.0.{i}": 40 for i in range(2, 10)}}


def test_probes_answer_30_of_30_while_idle_sockets_fill_the_admin_and_probe_ports(broker_factory):
    broker = broker_factory(admin={"probe_port": 0})
    probe_port = broker.running.ports["probe"]
    flood = []
    try:
        for port in (broker.admin_port, probe_port):
            flood += idle_sockets(port, FLOOD)
        paths = ["/healthz", "/readyz", "/livez"] * 10
        assert [probe(probe_port, path) for path in paths] == [200] * 30
        # The admin port's own defaults (a bound per address, idle sockets
        # closed soon) keep its probe paths answering too.
        assert [probe(broker.admin_port, path) for path in ("/healthz", "/readyz") * 15] == [200] * 30
    finally:
        for sock in flood:
            sock.close()


def test_the_probe_port_serves_probes_only_and_without_a_login(broker_factory):
    from gateway.auth import hash_password

    users = [{"name": "ops", "password_hash": hash_password("s3cret", iterations=1000), "role": "write"}]
    broker = broker_factory(admin={"probe_port": 0, "users": users})
    probe_port = broker.running.ports["probe"]
    assert probe(probe_port, "/readyz") == 200
    for path in ("/metrics", "/api/v1/destinations", "/"):
        assert probe(probe_port, path) == 404
    conn = http.client.HTTPConnection("127.0.0.1", probe_port, timeout=10)
    conn.request("POST", "/healthz", body=b"{}")
    assert conn.getresponse().status == 404
    conn.close()


@pytest.mark.parametrize("value", [-2, 70000])
def test_a_probe_port_out_of_range_is_refused_at_start(value):
    from gateway.admin.api import AdminSettings

    with pytest.raises(ValueError, match="admin.probe_port"):
        AdminSettings(probe_port=value)


def test_an_idle_admin_socket_is_closed_after_the_idle_timeout_and_a_slow_request_is_not(broker_factory):
    import time

    broker = broker_factory(admin={"idle_timeout_s": 0.3, "request_timeout_s": 60.0})
    with socket.create_connection(("127.0.0.1", broker.admin_port), timeout=30) as silent:
        assert silent.recv(100) == b""  # closed by the server long before request_timeout_s, no answer owed
    with socket.create_connection(("127.0.0.1", broker.admin_port), timeout=30) as slow:
        slow.sendall(b"GET /healthz HTTP/1.1\r\n")  # begun within the idle timeout ...
        time.sleep(0.6)  # ... and finished after it: the request's own bound applies
        slow.sendall(b"Host: x\r\n\r\n")
        assert slow.recv(100).startswith(b"HTTP/1.1 200")


def test_the_admin_port_bounds_connections_per_address(broker_factory):
    broker = broker_factory(admin={"max_connections_per_address": 3, "request_timeout_s": 60.0, "idle_timeout_s": 60.0})
    held = idle_sockets(broker.admin_port, {"127.0.0.1": 3})
    try:
        extra = idle_sockets(broker.admin_port, {"127.0.0.1": 1})[0]
        with extra:
            extra.settimeout(30)
            try:
                assert extra.recv(100) == b""  # closed at accept: that address has its 3
            except ConnectionResetError:
                pass
        assert probe(broker.admin_port, "/healthz") == 200  # another address is served
    finally:
        for sock in held:
            sock.close()
