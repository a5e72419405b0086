"""The real broker started with deploy/'s ConfigMap file and the pod's own
arguments (loopback, port 0 through the same flags): its probe paths answer,
the scrape path wants credentials, and SIGTERM ends it cleanly within the
pod's grace period."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import threading
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.deploy_helpers import GATEWAY, container, pod_spec, the
from tests.helpers import wait_for


def _get(url: str, auth: tuple[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url)
    if auth is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


def test_broker_with_the_configmap_answers_the_probes(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    from gateway.admin.api import USERS_FILE_ENV
    from gateway.auth import hash_password

    ctr = container(rendered)
    pod = pod_spec(the(rendered, "StatefulSet"))
    cm = the(rendered, "ConfigMap")
    conf = tmp_path / "gateway.toml"
    conf.write_text(cm["data"]["gateway.toml"])
    # The Secret's users plus a read-only user for the scrape, as README says to add.
    users = tomllib.loads(base64.b64decode(the(rendered, "Secret")["data"]["users.toml"]).decode())["users"]
    users.append({"name": "prometheus", "password_hash": hash_password("scrape-me", iterations=1000), "role": "read"})
    users_file = tmp_path / "users.toml"
    users_file.write_text("users = [\n" + "".join(
        f'  {{ name = "{u["name"]}", password_hash = "{u["password_hash"]}", role = "{u["role"]}" }},\n' for u in users
    ) + "]\n")

    # The pod's own arguments, with loopback and port 0 where the pod has 0.0.0.0 and fixed ports.
    args = list(ctr["args"])
    args[args.index("--config") + 1] = str(conf)
    args[args.index("--bind") + 1] = "127.0.0.1"
    args[args.index("--data-dir") + 1] = str(tmp_path / "data")
    args += ["--stomp-port", "0", "--mqtt-port", "0", "--admin-port", "0"]
    env = {**os.environ, **{e["name"]: e["value"] for e in ctr["env"]}, USERS_FILE_ENV: str(users_file)}
    proc = subprocess.Popen([GATEWAY, *args], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []  # the JSON log (--log-format json goes to stderr), read by a thread so no wait blocks
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()

    def events() -> list[dict[str, Any]]:
        return [json.loads(line) for line in list(lines)]

    try:
        def started() -> dict[str, int] | None:
            if proc.poll() is not None:
                reader.join(timeout=5)
                raise AssertionError(f"gateway exited with {proc.returncode}: {''.join(lines)}")
            return next((e["ports"] for e in events() if e.get("event") == "broker_started"), None)

        ports = wait_for(started, timeout=20, interval=0.02, what="broker_started in the JSON log")
        admin = f"http://127.0.0.1:{ports['admin']}"
        assert _get(admin + ctr["livenessProbe"]["httpGet"]["path"])[0] == 200
        assert wait_for(lambda: _get(admin + ctr["readinessProbe"]["httpGet"]["path"])[0] == 200, timeout=10, what="ready")
        assert _get(admin + ctr["startupProbe"]["httpGet"]["path"])[0] == 200
        # The scrape path of the annotations needs credentials; the placeholder admits nobody.
        path = the(rendered, "Service", "gateway")["metadata"]["annotations"]["prometheus.io/path"]
        assert _get(admin + path)[0] == 401
        assert _get(admin + path, ("admin", "admin"))[0] == 401
        status, body = _get(admin + path, ("prometheus", "scrape-me"))
        assert status == 200 and "# TYPE" in body

        # SIGTERM, as the kubelet sends it: a clean exit well within the grace period.
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=pod["terminationGracePeriodSeconds"]) == 0, "".join(lines)
        reader.join(timeout=5)
        names = [e.get("event") for e in events()]
        assert "shutdown_requested" in names and names[-1] == "broker_stopped", names
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        reader.join(timeout=5)
        proc.stderr.close()
