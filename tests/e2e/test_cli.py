"""The real process: `gateway --help`, `gateway serve` with a TOML file and
flags that override it, configuration errors, SIGTERM / SIGINT, JSON logs."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tests.support.helpers import Client, RawClient, unique, wait_for
from tests.support.processes import GATEWAY, Process, accepting, free_port

@pytest.fixture
def clients():
    made: list[Client] = []

    def connect(port: int, **kwargs) -> Client:
        client = Client(("127.0.0.1", port), **kwargs)
        made.append(client)
        client.connect()
        return client

    yield connect
    for client in made:
        client.close()


def run_gateway(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GATEWAY, *args], cwd=cwd, capture_output=True, text=True, timeout=20)


# -- help ----------------------------------------------------------------------


def test_help_lists_the_serve_command(tmp_path):
    result = run_gateway("--help", cwd=tmp_path)
    assert result.returncode == 0
    assert "serve" in result.stdout
    assert "--config" in result.stdout or "TOML" in result.stdout


def test_serve_help_explains_every_flag_and_default_port(tmp_path):
    result = run_gateway("serve", "--help", cwd=tmp_path)
    assert result.returncode == 0
    text = result.stdout
    for flag in ("--config", "--bind", "--stomp-port", "--mqtt-port", "--admin-port", "--data-dir", "--log-format"):
        assert flag in text, flag
    for default in ("61613", "1883", "8161", "json", "console"):
        assert default in text, default


# -- config file and flags -------------------------------------------------------


def test_config_file_is_used_and_flags_override_it(gateway, clients, tmp_path):
    file_port, flag_port = free_port(), free_port()
    config = tmp_path / "gateway.toml"
    config.write_text(
        f"""
bind = "127.0.0.1"
stomp_port = {file_port}
data_dir = "{tmp_path / 'from-file'}"
log_format = "json"

[stomp]
heartbeat_send_ms = 1234
heartbeat_receive_ms = 0
"""
    )
    process = gateway("--config", str(config), "--stomp-port", str(flag_port), "--data-dir", str(tmp_path / "from-flag"))
    process.wait_listening(flag_port)
    assert not accepting(file_port), "the flag did not override the file's port"
    client = clients(flag_port)
    # A setting only the file names is applied.
    assert client.rec.connected.headers["heart-beat"] == "1234,0"
    queue = f"/queue/{unique('cli')}"
    client.subscribe(queue)
    client.send(queue, b"through the real process")
    assert client.wait_messages(1)[0].body == b"through the real process"
    assert (tmp_path / "from-flag").is_dir()
    assert not (tmp_path / "from-file").exists()
    client.close()
    process.signal(signal.SIGTERM)
    assert process.wait_exit() == 0
    lines = [line for line in process.stderr.splitlines() if line.strip()]
    assert lines and all(json.loads(line) for line in lines), "log_format from the file was not applied"


def test_log_format_flag_overrides_the_file(gateway, tmp_path):
    port = free_port()
    config = tmp_path / "gateway.toml"
    config.write_text(f'log_format = "json"\nstomp_port = {port}\n')
    process = gateway("--config", str(config), "--log-format", "console", "--data-dir", str(tmp_path / "d"))
    process.wait_listening(port)
    process.signal(signal.SIGTERM)
    assert process.wait_exit() == 0
    lines = [line for line in process.stderr.splitlines() if line.strip()]
    assert lines
    for line in lines:
        with pytest.raises(json.JSONDecodeError):
            json.loads(line)


def test_flags_alone_without_a_config_file(gateway, clients, tmp_path):
    port = free_port()
    process = gateway("--bind", "127.0.0.1", "--stomp-port", str(port), "--mqtt-port", "0", "--admin-port", "0", "--data-dir", str(tmp_path / "d"))
    process.wait_listening(port)
    client = clients(port)
    assert client.rec.connected.headers["version"] == "1.2"


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("stomp_port = \"sixty\"\n", ["stomp_port", "int"]),
        ("no_such_setting = 1\n", ["no_such_setting"]),
        ("stomp_port = 70000\n", ["stomp_port", "70000"]),
        ('log_format = "xml"\n', ["log_format", "xml"]),
        ("[stomp]\nmax_frame_bytes = \"big\"\n", ["max_frame_bytes"]),
        ("[stomp]\nno_such_limit = 3\n", ["no_such_limit"]),
        ("stomp = 5\n", ["stomp", "table"]),
        ("this is = not = toml\n", ["gateway.toml"]),
    ],
)
def test_invalid_config_file_exits_2_with_a_clear_message(tmp_path, content, words):
    config = tmp_path / "gateway.toml"
    config.write_text(content)
    result = run_gateway("serve", "--config", str(config), "--data-dir", str(tmp_path / "d"), cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    message = result.stderr.strip()
    assert message.startswith("gateway:"), message
    for word in words:
        assert word in message, (word, message)


def test_missing_config_file_exits_2(tmp_path):
    result = run_gateway("serve", "--config", str(tmp_path / "absent.toml"), cwd=tmp_path)
    assert result.returncode == 2
    assert "absent.toml" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args", [["--stomp-port", "abc"], ["--log-format", "xml"], ["--no-such-flag"]])
def test_invalid_flags_exit_2(tmp_path, args):
    result = run_gateway("serve", *args, cwd=tmp_path)
    assert result.returncode == 2
    assert "usage:" in result.stderr


def test_port_already_in_use_fails_cleanly(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_gateway("serve", "--stomp-port", str(port), "--data-dir", str(tmp_path / "d"), cwd=tmp_path)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "startup_failed" in result.stderr


# -- signals -------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_tells_clients_delivers_what_was_receipted_and_exits_0(gateway, clients, tmp_path, signum):
    port = free_port()
    process = gateway("--stomp-port", str(port), "--data-dir", str(tmp_path / "d"))
    process.wait_listening(port)
    queue = f"/queue/{unique('sig')}"
    consumer = clients(port)
    consumer.subscribe(queue)
    watcher = RawClient(("127.0.0.1", port))
    try:
        watcher.connect(heart_beat="0,0")
        producer = clients(port)
        # Enough bytes that some are still on their way to the consumer when
        # the signal lands (shutdown must flush them, not cut them off), and
        # less than the consumer's outbox holds (see the slow consumer below).
        bodies = [f"m{i}:".encode() + b"x" * 2048 for i in range(300)]
        for i, body in enumerate(bodies):
            producer.send(queue, body, receipt=(i % 50 == 49))  # the last one receipted
        process.signal(signum)
        # Each client is told: an ERROR frame, or at least a clean close.
        told = watcher.wait_closed()
        assert not watcher.reset, "connection reset instead of closed"
        assert all(f.command == "ERROR" for f in told)
        if told:
            assert "shut" in told[0].headers["message"]
        watcher.close()
        # Within the shutdown grace (10 s by default) and its margin: a slow
        # machine may take longer to flush, but the broker never waits past it.
        assert consumer.rec.disconnected.wait(15)
        assert process.wait_exit(timeout=15) == 0
        # Every receipted message reached the live consumer, in order.
        consumer.wait_messages(len(bodies))
        assert consumer.bodies == bodies, "receipted messages lost at shutdown"
    finally:
        watcher.close()


def test_signal_stops_accepting_new_connections_at_once(gateway, tmp_path):
    port = free_port()
    process = gateway("--stomp-port", str(port), "--data-dir", str(tmp_path / "d"))
    process.wait_listening(port)
    # A client that neither reads nor closes keeps the process draining for a moment.
    lingering = RawClient(("127.0.0.1", port))
    try:
        lingering.connect(heart_beat="0,0")
        process.signal(signal.SIGTERM)
        wait_for(lambda: not accepting(port), timeout=2, what="listener closed")
        assert process.proc.poll() is None, "process gone before the check: nothing proven"
        assert process.wait_exit() == 0
    finally:
        lingering.close()


# -- logs ----------------------------------------------------------------------


def test_json_logs_one_line_per_connection_event_with_conn_id(gateway, clients, tmp_path):
    port = free_port()
    process = gateway("--stomp-port", str(port), "--data-dir", str(tmp_path / "d"), "--log-format", "json")
    process.wait_listening(port)
    client = clients(port)
    session = client.rec.connected.headers["session"]
    queue = f"/queue/{unique('log')}"
    client.subscribe(queue)
    for i in range(50):
        client.send(queue, str(i).encode())
    client.wait_messages(50)
    client.close()
    bad = RawClient(("127.0.0.1", port))
    try:
        bad_session = bad.connect(heart_beat="0,0").headers["session"]
        bad.send(b"BOGUS\n\n\x00")
        bad.expect_error_and_close()
    finally:
        bad.close()
    process.signal(signal.SIGTERM)
    assert process.wait_exit() == 0

    records = [json.loads(line) for line in process.stderr.splitlines() if line.strip()]
    assert records, "no log output"
    assert all("event" in r and "level" in r for r in records)
    mine = [r for r in records if r.get("conn_id") == session]
    events = [r["event"] for r in mine]
    assert "connection_opened" in events and "connection_closed" in events
    assert all("peer" in r for r in mine)
    # Nothing per message at INFO: 50 messages, a handful of lines.
    assert len(mine) < 10, events
    rejected = [r for r in records if r.get("conn_id") == bad_session and r["level"] in ("warning", "error")]
    assert len(rejected) == 1, rejected
    assert "BOGUS" in json.dumps(rejected[0])
