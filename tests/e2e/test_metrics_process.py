"""/metrics of a real `gateway serve` before anyone connects and around a
few connections: every listener's connection gauge has a sample at zero
(an alert on it needs one), and the process families Prometheus' own clients
export (CPU, open and maximum file descriptors, start time) are there and
follow the process."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.test_first_users import ADMIN, ADMIN_PASSWORD, ENVIRONMENT, Broker
from tests.support.helpers import wait_for
from tests.support.processes import HOST


def scrape(broker: Broker) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = broker.get("/metrics", (ADMIN, ADMIN_PASSWORD))
    assert status == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_connection_gauges_have_samples_at_zero_and_process_metrics_follow_the_process(tmp_path):
    launched = time.time()
    broker = Broker(tmp_path, ENVIRONMENT)
    try:
        # (The start-up probe's one STOMP connection has come and gone.)
        before = wait_for(lambda: (now := scrape(broker))[("gateway_connections", (("protocol", "stomp"),))] == 0 and now,
                          what="no STOMP connection")
        for protocol in ("mqtt", "stomp-ws", "mqtt-ws"):  # nobody ever connected: samples at zero
            assert before[("gateway_connections", (("protocol", protocol),))] == 0, protocol
            assert before[("gateway_connections_accepted_total", (("protocol", protocol),))] == 0, protocol

        pid = broker.process.pid
        assert 0 < before[("process_open_fds", ())] <= before[("process_max_fds", ())]
        soft = int(Path(f"/proc/{pid}/limits").read_text().split("Max open files")[1].split()[0])
        assert before[("process_max_fds", ())] == soft
        assert launched - 1 <= before[("process_start_time_seconds", ())] <= time.time()
        assert before[("process_cpu_seconds_total", ())] > 0  # start-up and recovery took some
        assert before[("process_resident_memory_bytes", ())] > 0

        sockets = [socket.create_connection((HOST, broker.stomp_port)) for _ in range(5)]
        try:
            def counted() -> dict:
                now = scrape(broker)
                return now if now[("gateway_connections", (("protocol", "stomp"),))] == 5 else {}

            during = wait_for(counted, what="5 STOMP connections counted")
            assert during[("process_open_fds", ())] >= before[("process_open_fds", ())] + 5
            assert during[("process_cpu_seconds_total", ())] >= before[("process_cpu_seconds_total", ())]
        finally:
            for sock in sockets:
                sock.close()
    finally:
        broker.stop()


def test_free_disk_space_has_a_sample_with_the_alarm_off_too(tmp_path):
    config = tmp_path / "gateway.toml"
    config.write_text("[store]\nmin_free_bytes = 0\n")  # no disk alarm
    broker = Broker(tmp_path, ENVIRONMENT, "--config", str(config))
    try:
        got = scrape(broker)
        assert got[("gateway_disk_free_bytes", ())] > 0
        assert got[("gateway_disk_alarm", ())] == 0
    finally:
        broker.stop()
