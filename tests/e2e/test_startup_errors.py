"""Start-up failures an operator meets, through the real command: each
exits non-zero with one line that names the thing (the listener and its
port, the data folder, the users file) and says what to do; no traceback.
And ``gateway store check`` on a running broker's folder says the folder is
in use, with its own exit code, instead of reporting it like damage."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from tests.support.processes import GATEWAY, HOST, BrokerProcess

TIMEOUT_S = 60


def serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`gateway serve` on free ports, errors only: what an operator sees when it fails."""
    ports = {"--stomp-port": "0", "--mqtt-port": "0", "--admin-port": "0", "--data-dir": str(tmp_path / "data")}
    given = dict(zip(args[::2], args[1::2]))
    argv = [a for flag, value in {**ports, **given}.items() for a in (flag, value)]
    return subprocess.run([GATEWAY, "serve", "--log-level", "error", *argv], capture_output=True, text=True,
                          timeout=TIMEOUT_S, cwd=tmp_path)


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("listener", ["stomp", "mqtt", "admin"])
def test_a_busy_port_names_the_listener_and_the_port(tmp_path, listener):
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = serve(tmp_path, f"--{listener}-port", str(port))
    assert result.returncode == 1
    line = one_line(result)
    assert "startup_failed" in line
    assert f"{listener} listener cannot listen on {HOST}:{port}" in line, line
    assert "already in use" in line and f"--{listener}-port" in line, line


def test_an_address_not_on_this_machine_says_to_change_bind(tmp_path):
    result = serve(tmp_path, "--bind", "192.0.2.1")  # TEST-NET-1: never a local address
    assert result.returncode == 1
    line = one_line(result)
    assert "stomp listener cannot listen on 192.0.2.1" in line and "--bind" in line, line


def test_a_data_folder_held_by_another_broker_says_so(tmp_path):
    first = BrokerProcess(tmp_path)
    first.start()
    try:
        result = serve(tmp_path, "--data-dir", str(first.data_dir))
    finally:
        assert first.terminate() == 0
    assert result.returncode == 1
    line = one_line(result)
    assert "in use by another process" in line and "--data-dir" in line, line


def test_a_data_folder_that_cannot_be_made_says_which_and_what_to_do(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = serve(tmp_path, "--data-dir", str(blocker / "data"))
    assert result.returncode == 1
    line = one_line(result)
    assert f"data folder {blocker / 'data'}" in line and "--data-dir" in line, line


@pytest.mark.parametrize(
    ("content", "words"),
    [(None, ["does not exist", "GATEWAY_ADMIN_USERS_FILE"]),
     ("users = [ {", ["admin users file"]),
     ('users = [{ name = "ops", password_hash = "x", role = "root" }]', ["role read|browse|write", "ops"])],
    ids=["missing", "not-toml", "bad-role"],
)
def test_an_unusable_admin_users_file_exits_2_with_one_line(tmp_path, content, words):
    users = tmp_path / "users.toml"
    if content is not None:
        users.write_text(content)
    config = tmp_path / "gateway.toml"
    config.write_text(f'[admin]\nusers_file = "{users}"\n')
    result = serve(tmp_path, "--config", str(config))
    assert result.returncode == 2
    line = one_line(result)
    assert line.startswith("gateway: ")
    for word in words:
        assert word in line, (word, line)


def test_store_check_on_a_running_brokers_folder_says_in_use_not_corrupt(tmp_path):
    running = BrokerProcess(tmp_path)
    running.start()
    try:
        busy = subprocess.run([GATEWAY, "store", "check", str(running.data_dir)], capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    finally:
        assert running.terminate() == 0
    assert busy.returncode == 3, busy
    assert "in use" in busy.stderr and "not damage" in busy.stderr and "stop the broker" in busy.stderr
    assert "corrupt" not in (busy.stdout + busy.stderr)
    # Stopped, the same folder checks clean.
    stopped = subprocess.run([GATEWAY, "store", "check", str(running.data_dir)], capture_output=True, text=True,
                             timeout=TIMEOUT_S)
    assert stopped.returncode == 0, stopped


def test_an_ha_node_without_zookeeper_says_where_it_looked(tmp_path):
    """kazoo's own complaints come through our log (at --log-level error,
    none), so the operator sees one line naming the ensemble to check."""
    with socket.socket() as closed:
        closed.bind((HOST, 0))
        port = closed.getsockname()[1]  # nothing listens here once closed
    config = tmp_path / "node.toml"
    config.write_text(f'[ha]\nnode_id = "n1"\nzookeeper = "{HOST}:{port}/gw"\nreplication_listen = "{HOST}:0"\n'
                      f'advertise = "{HOST}:1"\nzookeeper_session_timeout_s = 2.0\n')
    result = serve(tmp_path, "--config", str(config))
    assert result.returncode == 1
    line = one_line(result)
    assert "ha_start_failed" in line and f"check [ha] zookeeper ({HOST}:{port}/gw)" in line, line
