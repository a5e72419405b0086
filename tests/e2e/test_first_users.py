"""A first user without a file: ``gateway serve`` started with
GATEWAY_ADMIN_USER/_PASSWORD and GATEWAY_USER/_PASSWORD in its environment
admits stomp.py and paho-mqtt with the client user, answers the admin API
with the admin user, and refuses wrong passwords at both doors; a half-set
pair stops start-up with one line; and an admin users file still holding
deploy/'s placeholder hash is warned about at start."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
import stomp

from gateway.auth import hash_password
from tests.support.helpers import Client, RawClient, http_request, unique, wait_for
from tests.support.mqtt_helpers import Paho
from tests.support.processes import GATEWAY, HOST, BrokerProcess, free_port

ADMIN, ADMIN_PASSWORD = "ops", "admin-pass-1"
USER, PASSWORD = "app", "client-pass-1"
ENVIRONMENT = {
    "GATEWAY_ADMIN_USER": ADMIN, "GATEWAY_ADMIN_PASSWORD": ADMIN_PASSWORD,
    "GATEWAY_USER": USER, "GATEWAY_PASSWORD": PASSWORD,
}
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def http(port: int, path: str, auth: tuple[str, str] | None = None, method: str = "GET") -> tuple[int, str]:
    return http_request(f"http://{HOST}:{port}{path}", auth, method)


class Broker:
    """A real ``gateway serve`` with the given environment and known ports."""

    def __init__(self, tmp_path: Path, env: dict[str, str], *extra: str) -> None:
        self.mqtt_port, self.admin_port = free_port(), free_port()
        self.process = BrokerProcess(tmp_path, "--mqtt-port", str(self.mqtt_port), "--admin-port", str(self.admin_port),
                                     *extra, env=env)
        self.process.start()
        wait_for(lambda: self.get("/readyz")[0] == 200, timeout=20, what="/readyz")

    @property
    def stomp_port(self) -> int:
        return self.process.port

    def get(self, path: str, auth: tuple[str, str] | None = None) -> tuple[int, str]:
        try:
            return http(self.admin_port, path, auth)
        except OSError:
            return 0, ""

    def events(self) -> list[dict]:
        text = self.process.log_path.read_text(errors="replace")
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

    def stop(self) -> None:
        if self.process.proc is not None and self.process.proc.poll() is None:
            assert self.process.terminate() == 0


@pytest.fixture
def broker(tmp_path):
    running = Broker(tmp_path, ENVIRONMENT, "--log-format", "json")
    yield running
    running.stop()


def test_the_client_user_from_the_environment_logs_in_with_stomp_py_and_paho(broker):
    topic = unique("first")
    client = Client((HOST, broker.stomp_port)).connect(login=USER, passcode=PASSWORD)
    try:
        client.subscribe(f"/topic/{topic}")
        paho = Paho(broker.mqtt_port, unique("device"), username=USER, password=PASSWORD)
        try:
            assert paho.connacks == [(False, 0)]
            paho.publish(topic, b"from paho", qos=1)
        finally:
            paho.close()
        client.send(f"/topic/{topic}", b"from stomp.py")
        client.wait_messages(2)
        assert sorted(client.bodies) == [b"from paho", b"from stomp.py"]
    finally:
        client.close()


def test_a_wrong_client_password_and_no_login_are_refused(broker):
    for headers in ({"login": USER, "passcode": "wrong"}, {}):
        client = Client((HOST, broker.stomp_port))
        try:
            with pytest.raises(stomp.exception.ConnectFailedException):
                client.connect(**headers)
            assert "authentication failed" in client.rec.errors[0].headers["message"]
        finally:
            client.close()
    paho = Paho(broker.mqtt_port, unique("device"), username=USER, password="wrong")
    try:
        assert paho.connacks and paho.connacks[0][1] != 0, "a wrong MQTT password was accepted"
    finally:
        paho.drop()


def test_the_admin_user_from_the_environment_may_read_and_write(broker):
    status, body = broker.get("/api/v1/destinations", (ADMIN, ADMIN_PASSWORD))
    assert status == 200 and isinstance(json.loads(body), list)
    queue = unique("admin-sent")
    sent = http(broker.admin_port, f"/api/v1/destinations/queue/{queue}/messages", (ADMIN, ADMIN_PASSWORD), "POST")
    assert sent[0] == 201, sent
    assert broker.get("/api/v1/destinations", (ADMIN, "wrong"))[0] == 401
    assert broker.get("/api/v1/destinations")[0] == 401
    # The client user is no admin, nor the admin a client.
    assert broker.get("/api/v1/destinations", (USER, PASSWORD))[0] == 401
    refused = Client((HOST, broker.stomp_port))
    try:
        with pytest.raises(stomp.exception.ConnectFailedException):
            refused.connect(login=ADMIN, passcode=ADMIN_PASSWORD)
    finally:
        refused.close()
    # No password of theirs reached the log.
    log = broker.process.log_path.read_text()
    assert ADMIN_PASSWORD not in log and PASSWORD not in log


@pytest.mark.parametrize("given", [{"GATEWAY_USER": USER}, {"GATEWAY_ADMIN_PASSWORD": ADMIN_PASSWORD}])
def test_half_a_pair_stops_start_up_with_one_line(tmp_path, given):
    env = {"PATH": "/usr/bin:/bin", **given}
    result = subprocess.run([GATEWAY, "serve", "--stomp-port", "0", "--mqtt-port", "0", "--admin-port", "0",
                             "--data-dir", str(tmp_path / "data")], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "go together" in lines[0] and "is not set" in lines[0], result.stderr


def test_a_user_in_the_file_and_the_environment_is_refused(tmp_path):
    config = tmp_path / "gateway.toml"
    config.write_text('[admin]\nusers = [{ name = "ops", password_hash = "pbkdf2_sha256$1$AAAA$AAAA", role = "read" }]\n')
    result = subprocess.run([GATEWAY, "serve", "--config", str(config), "--stomp-port", "0", "--mqtt-port", "0",
                             "--admin-port", "0", "--data-dir", str(tmp_path / "data")],
                            env={"PATH": "/usr/bin:/bin", **ENVIRONMENT}, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "'ops' is in [admin] users and in GATEWAY_ADMIN_USER" in result.stderr


def test_the_deploy_placeholder_secret_is_warned_about_at_start(tmp_path):
    """deploy/admin-users.toml as the Secret mounts it: the broker starts
    (the pod must not crash-loop), and says at start that its admin user
    cannot log in and what to do."""
    users = tmp_path / "users.toml"
    users.write_text((DEPLOY / "admin-users.toml").read_text())
    running = Broker(tmp_path, {"GATEWAY_ADMIN_USERS_FILE": str(users)}, "--log-format", "json")
    try:
        warned = [e for e in running.events() if e.get("event") == "admin_user_unusable"]
        assert [e["user"] for e in warned] == ["admin"]
        assert warned[0]["level"] == "warning" and "gateway passwd" in warned[0]["detail"]
        assert running.get("/api/v1/destinations", ("admin", "REPLACE-ME"))[0] == 401
    finally:
        running.stop()


def test_a_usable_admin_users_file_gets_no_warning(broker):
    assert not [e for e in broker.events() if e.get("event") in ("admin_user_unusable", "user_unusable", "admin_api_locked")]


def test_client_users_from_a_users_file_and_a_reloaded_password(tmp_path):
    """GATEWAY_USERS_FILE (deploy/'s client users Secret): its users log in,
    anonymous clients no longer do, and a SIGHUP after the file changed (a
    rotated password) applies it to the next login."""
    users = tmp_path / "clients.toml"

    def write(password: str) -> None:
        users.write_text(f'users = [{{ name = "device", password_hash = "{hash_password(password, iterations=1000)}" }}]\n')

    def login(passcode: str | None) -> str:
        client = RawClient((HOST, running.stomp_port))
        try:
            headers = {"accept-version": "1.2", "host": "h"}
            if passcode is not None:
                headers |= {"login": "device", "passcode": passcode}
            client.send_frame("CONNECT", headers)
            return client.next_frame().command
        finally:
            client.close()

    write("first-pw")
    running = Broker(tmp_path, {"GATEWAY_USERS_FILE": str(users)}, "--log-format", "json")
    try:
        assert login("first-pw") == "CONNECTED"
        assert login(None) == "ERROR"
        write("second-pw")
        running.process.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: any(e.get("event") == "config_reloaded" for e in running.events()), what="the reload")
        assert [e["changed"] for e in running.events() if e.get("event") == "config_reloaded"] == [["auth.users ~device"]]
        assert login("second-pw") == "CONNECTED"
        assert login("first-pw") == "ERROR"
    finally:
        running.stop()


def test_without_admin_users_the_api_and_the_log_say_how_to_make_one(tmp_path):
    config = tmp_path / "gateway.toml"
    config.write_text("log_level = \"info\"\n")
    running = Broker(tmp_path, {}, "--config", str(config), "--log-format", "json")
    try:
        status, body = running.get("/api/v1/destinations", ("ops", "ops-pw"))
        assert status == 403
        reason = json.loads(body)["reason"]
        assert "GATEWAY_ADMIN_USER and GATEWAY_ADMIN_PASSWORD" in reason and "SIGHUP" in reason
        (locked,) = [e for e in running.events() if e.get("event") == "admin_api_locked"]
        assert "GATEWAY_ADMIN_USER" in locked["detail"] and locked["level"] == "warning"
        # The second way it names: a user in the file and a SIGHUP, no restart.
        entry = f'{{ name = "ops", password_hash = "{hash_password("ops-pw", iterations=1000)}", role = "write" }}'
        config.write_text(f"[admin]\nusers = [{entry}]\n")
        running.process.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: running.get("/api/v1/destinations", ("ops", "ops-pw"))[0] == 200, what="the admin user")
    finally:
        running.stop()
