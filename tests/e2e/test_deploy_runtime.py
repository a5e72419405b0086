"""The real broker run as deploy/'s three pods would run it, on loopback and a
real ZooKeeper: each `gateway serve` gets the pod's own arguments and
environment (node id and advertised address from the pod's name) and the
ConfigMap's file.  Exactly one node is ready; the probe paths answer; the
scrape path wants credentials; and the rolling upgrade of deploy/README.md
(each backup deleted and back in sync in turn, the primary last) keeps every
receipted message and costs exactly one failover, each SIGTERM ending its
process cleanly within the pod's grace period.

Loopback differs from a cluster in two places only, both in [ha]: the
ZooKeeper servers (the test's own, under the ConfigMap's chroot) and the
replication address (every pod binds 0.0.0.0:7000 on its own IP; here the
three share 127.0.0.1, so each gets a port of its own)."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
import tomllib
from pathlib import Path
from typing import Any

from tests.support.deploy_helpers import GATEWAY, container, generated_secret, mount_secrets, pod_environment, pod_names, pod_spec, the
from tests.support.helpers import RawClient, http_request, wait_for
from tests.support.processes import HOST, free_port
from tests.support.zookeeper_helpers import ZooKeeperServer

WAIT_S = 60.0  # any role change or restart: far beyond the session timeout on a loaded machine


def _get(url: str, auth: tuple[str, str] | None = None) -> tuple[int, str]:
    return http_request(url, auth, timeout=2)


class Pod:
    """One pod of the StatefulSet as a `gateway serve` process; its JSON log
    (stderr) kept in a file across restarts, as `kubectl logs` would be per pod."""

    def __init__(self, rendered: list[dict[str, Any]], name: str, tmp_path: Path, zookeeper: ZooKeeperServer,
                 users_file: Path) -> None:
        from gateway.admin.api import USERS_FILE_ENV

        self.name = name
        self.dir = tmp_path / name
        self.dir.mkdir()
        ctr = container(rendered)
        text = the(rendered, "ConfigMap")["data"]["gateway.toml"]
        ha = tomllib.loads(text)["ha"]
        self.replication_port = free_port()
        chroot = ha["zookeeper"].partition("/")[2]
        text = text.replace(ha["zookeeper"], f"{zookeeper.hosts}/{chroot}")
        text = text.replace(f'"{ha["replication_listen"]}"', f'"{HOST}:{self.replication_port}"')
        # The probe port, one of its own per pod here (in Kubernetes each pod has its own address).
        self.probe_port = free_port()
        probe_line = f"probe_port = {tomllib.loads(text)['admin']['probe_port']}"
        assert probe_line in text
        text = text.replace(probe_line, f"probe_port = {self.probe_port}")
        self.config = self.dir / "gateway.toml"
        self.config.write_text(text)
        # The pod's own arguments, with loopback where the pod has 0.0.0.0 and ports of its own.
        self.stomp_port, self.admin_port = free_port(), free_port()
        args = list(ctr["args"])
        args[args.index("--config") + 1] = str(self.config)
        args[args.index("--bind") + 1] = HOST
        args[args.index("--data-dir") + 1] = str(self.dir / "data")
        self.args = [*args, "--stomp-port", str(self.stomp_port), "--mqtt-port", "0", "--admin-port", str(self.admin_port)]
        env = pod_environment(rendered, name)
        headless = the(rendered, "StatefulSet")["spec"]["serviceName"]
        assert env["GATEWAY_HA_NODE_ID"] == name
        assert env["GATEWAY_HA_ADVERTISE"] == f"{name}.{headless}:{ha['replication_listen'].rpartition(':')[2]}"
        env["GATEWAY_HA_ADVERTISE"] = f"{HOST}:{self.replication_port}"
        env = mount_secrets(rendered, env, self.dir / "secrets")  # the client users Secret, as shipped
        self.env = {**os.environ, **env, USERS_FILE_ENV: str(users_file)}
        self.log_path = self.dir / "pod.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Pod:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen([GATEWAY, *self.args], cwd=self.dir, env=self.env, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=log)
        return self

    def events(self) -> list[dict[str, Any]]:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.startswith("{") and line.endswith("}")]

    def url(self, path: str) -> str:
        return f"http://{HOST}:{self.admin_port}{path}"

    def status(self, path: str) -> int | None:
        try:
            return _get(self.url(path))[0]
        except OSError:
            return None  # not listening (starting, or between roles)

    def probe(self, path: str) -> int | None:
        """A kubelet's probe: GET ``path`` on the probe port."""
        try:
            return _get(f"http://{HOST}:{self.probe_port}{path}")[0]
        except OSError:
            return None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self, grace_s: float) -> int:
        """SIGTERM, as the kubelet sends it; the exit code, which must come within the grace period."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=grace_s)

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(timeout=10)

    def tail(self, lines: int = 25) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return f"---- {self.name}\n" + "\n".join(text.splitlines()[-lines:])


def wait_ready(pods: list[Pod]) -> Pod:
    """The one ready pod, once exactly one is ready and every other answers 503 (alive, not ready)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for pod in pods:
            assert pod.alive(), f"{pod.name} exited\n" + "\n".join(p.tail() for p in pods)
        answers = {pod.name: pod.probe("/readyz") for pod in pods}
        ready = [p for p in pods if answers[p.name] == 200]
        assert len(ready) <= 1, f"two ready pods: {answers}"
        if ready and all(answers[p.name] == 503 for p in pods if p is not ready[0]):
            return ready[0]
        time.sleep(0.1)
    raise AssertionError("no single ready pod\n" + "\n".join(p.tail() for p in pods))


def in_sync_count(primary: Pod, backup: Pod) -> int:
    """How often the primary has counted ``backup`` in sync (once per time it caught up)."""
    return sum(1 for e in primary.events() if e.get("event") == "backup_in_sync" and e.get("backup") == backup.name)


def _users_file(rendered: list[dict[str, Any]], tmp_path: Path) -> Path:
    """The Secret's users plus a read-only user for the scrape, as README says to add."""
    from gateway.auth import hash_password

    users = tomllib.loads(base64.b64decode(generated_secret(rendered, "gateway-admin-users")["data"]["users.toml"]).decode())["users"]
    users.append({"name": "prometheus", "password_hash": hash_password("scrape-me", iterations=1000), "role": "read"})
    path = tmp_path / "users.toml"
    path.write_text("users = [\n" + "".join(
        f'  {{ name = "{u["name"]}", password_hash = "{u["password_hash"]}", role = "{u["role"]}" }},\n' for u in users
    ) + "]\n")
    return path


def test_the_pods_form_one_group_and_roll_with_one_failover(rendered: list[dict[str, Any]], tmp_path: Path,
                                                           zookeeper: ZooKeeperServer) -> None:
    ctr = container(rendered)
    grace_s = pod_spec(the(rendered, "StatefulSet"))["terminationGracePeriodSeconds"]
    users = _users_file(rendered, tmp_path)
    pods = [Pod(rendered, name, tmp_path, zookeeper, users).start() for name in pod_names(rendered)]
    sent: list[bytes] = []

    def send(client: RawClient, n: int) -> None:
        for _ in range(n):
            body = f"order {len(sent)}".encode()
            client.send_frame("SEND", {"destination": "/queue/orders", "persistent": "true", "receipt": f"r{len(sent)}"}, body)
            client.receipt(f"r{len(sent)}", timeout=WAIT_S)  # released once a backup has it on disk too
            sent.append(body)

    try:
        primary = wait_ready(pods)
        backups = [p for p in pods if p is not primary]
        # Liveness and start-up on every pod; readiness on the primary alone (wait_ready).
        for pod in pods:
            assert pod.probe(ctr["livenessProbe"]["httpGet"]["path"]) == 200
            assert pod.probe(ctr["startupProbe"]["httpGet"]["path"]) == 200
        # The scrape path of the annotations needs credentials; the placeholder admits nobody.
        path = the(rendered, "Service", "gateway")["metadata"]["annotations"]["prometheus.io/path"]
        assert _get(primary.url(path))[0] == 401
        assert _get(primary.url(path), ("admin", "admin"))[0] == 401
        status, body = _get(primary.url(path), ("prometheus", "scrape-me"))
        assert status == 200 and "# TYPE" in body

        producer = RawClient((HOST, primary.stomp_port), timeout=WAIT_S)
        producer.connect()
        send(producer, 10)
        wait_for(lambda: all(in_sync_count(primary, b) >= 1 for b in backups), timeout=WAIT_S, interval=0.1,
                 what="both backups counted in sync")

        # The rolling upgrade: each backup deleted, back, and in sync again before the next.
        for backup in backups:
            before = in_sync_count(primary, backup)
            assert backup.terminate(grace_s) == 0, backup.tail()
            send(producer, 5)  # the other backup confirms meanwhile
            backup.start()
            send(producer, 5)
            wait_for(lambda: in_sync_count(primary, backup) > before, timeout=WAIT_S, interval=0.1,
                     what=f"{backup.name} counted in sync again")
            assert wait_ready(pods) is primary, "a backup's restart moves nobody"

        # The primary last: SIGTERM drains it and hands over, once.
        promotions = {p.name: sum(e.get("event") == "ha_promoted" for e in p.events()) for p in pods}
        assert primary.terminate(grace_s) == 0, primary.tail()
        producer.abort()
        names = [e.get("event") for e in primary.events()]
        assert "shutdown_requested" in names and "broker_stopped" in names, names
        new = wait_ready(backups)
        primary.start()  # the StatefulSet brings the pod back: it rejoins as a backup
        assert wait_ready(pods) is new
        promoted = {p.name: sum(e.get("event") == "ha_promoted" for e in p.events()) - promotions[p.name] for p in pods}
        assert promoted == {p.name: int(p is new) for p in pods}, "exactly one failover"

        consumer = RawClient((HOST, new.stomp_port), timeout=WAIT_S)
        consumer.connect()
        consumer.send_frame("SUBSCRIBE", {"destination": "/queue/orders", "id": "s", "ack": "auto"})
        got = [consumer.expect("MESSAGE", timeout=WAIT_S).body for _ in sent]
        assert sorted(got) == sorted(sent)
        assert consumer.quiet_for(0.5) == []
        consumer.close()

        # Every pod ends cleanly on SIGTERM within the grace period.
        for pod in [p for p in pods if p is not new] + [new]:
            assert pod.terminate(grace_s) == 0, pod.tail()
            assert [e.get("event") for e in pod.events()].count("shutdown_requested") >= 1
    finally:
        for pod in pods:
            pod.kill()
