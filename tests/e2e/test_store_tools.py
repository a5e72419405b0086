"""The offline `gateway store check|compact` tools on a broker's data folder:
what they report, and their refusal while a broker holds the folder."""

from __future__ import annotations

import signal
import subprocess

from tests.support.helpers import unique
from tests.support.processes import GATEWAY, free_port
from tests.support.store_fault_helpers import drain, fill


def run_tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GATEWAY, "store", *args], capture_output=True, text=True, timeout=60)


def test_store_check_and_compact_report_what_the_folder_holds(gateway, tmp_path):
    port = free_port()
    data = tmp_path / "d"
    queue = f"/queue/{unique('tool')}"
    process = gateway("--stomp-port", str(port), "--data-dir", str(data))
    process.wait_listening(port)
    fill(port, queue, 20)
    running = run_tool("check", str(data))
    assert running.returncode != 0 and "running broker" in running.stderr  # the broker holds the folder
    process.signal(signal.SIGTERM)
    assert process.wait_exit() == 0

    check = run_tool("check", str(data))
    assert check.returncode == 0, check.stderr
    assert queue in check.stdout and "20" in check.stdout
    compact = run_tool("compact", str(data))
    assert compact.returncode == 0, compact.stderr
    again = gateway("--stomp-port", str(port), "--data-dir", str(data))
    again.wait_listening(port)
    assert len(drain(port, queue)) == 20


def test_store_check_on_a_folder_without_a_store_says_so(tmp_path):
    result = run_tool("check", str(tmp_path))
    assert result.returncode == 2 and "no store" in result.stderr


def test_store_check_reads_the_topic_archives_too(gateway, tmp_path):
    port = free_port()
    data = tmp_path / "d"
    config = tmp_path / "archive.toml"
    config.write_text('[[broker.policies]]\ndestination = "/topic/plant.>"\narchive = true\n[store]\narchive_segment_bytes = 4096\n')
    process = gateway("--config", str(config), "--stomp-port", str(port), "--data-dir", str(data))
    process.wait_listening(port)
    fill(port, "/topic/plant.7.temp", 100)
    process.signal(signal.SIGTERM)
    assert process.wait_exit() == 0
    check = run_tool("check", str(data))
    assert check.returncode == 0, check.stderr
    assert "plant.7.temp:" in check.stdout and "records: 100" in check.stdout and "next_offset: 100" in check.stdout
    segments = sorted((data / "archive" / "plant.7.temp").glob("*.seg"))
    assert len(segments) > 2
    damaged = bytearray(segments[0].read_bytes())
    damaged[30] ^= 0xFF
    segments[0].write_bytes(bytes(damaged))
    check = run_tool("check", str(data))
    assert check.returncode == 1 and "unreadable" in check.stdout
