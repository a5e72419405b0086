"""The pod spec in deploy/ held against the real program: the command line
parses with the real CLI, the ConfigMap's file loads with the real config
loader, and the ports, paths, probes, security context, Services, budget and
grace period agree with what that config says."""

from __future__ import annotations

import base64
import copy
import dataclasses
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from gateway import __main__ as cli
from gateway import config
from tests.support.deploy_helpers import (GATEWAY, container, dockerfile_instructions, effective_config, generated_secret, mount_secrets, pod_environment, pod_names, pod_spec,
                                  port_number, the)

# Flush window plus closing the store (last fdatasync): what the kubelet must wait beyond shutdown_grace_s.
STORE_CLOSE_MARGIN_S = 5.0


def test_container_runs_the_documented_command(rendered: list[dict[str, Any]]) -> None:
    ctr = container(rendered)
    assert ctr["command"] == ["gateway"]
    assert ctr["args"][0] == "serve"
    args = cli.parser().parse_args(ctr["args"])  # exits (fails) on an unknown flag
    assert args.command == "serve"
    assert (args.bind, args.data_dir, args.log_format) == ("0.0.0.0", "/data", "json")
    assert args.config == "/etc/gateway/gateway.toml"
    help_text = subprocess.run([GATEWAY, "serve", "--help"], capture_output=True, text=True, timeout=30, check=True).stdout
    for flag in (a for a in ctr["args"] if a.startswith("--")):
        assert flag in help_text, f"{flag} is not in `gateway serve --help`"
    assert ctr["image"].startswith("gateway:"), "the images: entry gives the tag"


def test_configmap_file_loads_and_agrees_with_the_pod(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    sts = the(rendered, "StatefulSet")
    pod = pod_spec(sts)
    ctr = container(rendered)
    cfg, args = effective_config(rendered, tmp_path)
    # The file alone (without the flags, with the pod's environment) loads too, and says the same thing.
    environment = mount_secrets(rendered, pod_environment(rendered, pod_names(rendered)[0]), tmp_path / "secrets")
    alone = config.load(str(tmp_path / "gateway.toml"), environ=environment)
    assert (alone.bind, alone.data_dir, alone.log_format) == (cfg.bind, cfg.data_dir, cfg.log_format)

    ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
    assert cfg.ha is not None
    replication = int(cfg.ha.replication_listen.rpartition(":")[2])
    assert ports == {"stomp": cfg.stomp_port, "mqtt": cfg.mqtt_port, "admin": cfg.admin_port,
                     "probe": cfg.admin.probe_port, "replication": replication}
    assert ports == {"stomp": 61613, "mqtt": 1883, "admin": 8161, "probe": 8163, "replication": 7000}

    mounts = {m["name"]: m for m in ctr["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    # --config is the ConfigMap's key, mounted read-only.
    config_mount = next(m for m in ctr["volumeMounts"] if args.config.startswith(m["mountPath"].rstrip("/") + "/"))
    assert config_mount["readOnly"] is True
    assert volumes[config_mount["name"]]["configMap"]["name"] == the(rendered, "ConfigMap")["metadata"]["name"]
    # The data folder is the claim from volumeClaimTemplates.
    assert mounts["data"]["mountPath"] == cfg.data_dir
    assert [c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]] == ["data"]
    assert "data" not in volumes
    # The admin users file is the Secret's key, named by the variable the broker reads.
    env = pod_environment(rendered, pod_names(rendered)[0])
    users_env = "GATEWAY_ADMIN_USERS_FILE"
    try:
        from gateway.admin.api import USERS_FILE_ENV
    except ImportError:
        pass
    else:
        assert USERS_FILE_ENV == users_env
    users_path = env[users_env]
    secret_mount = next(m for m in ctr["volumeMounts"] if users_path.startswith(m["mountPath"].rstrip("/") + "/"))
    assert secret_mount["readOnly"] is True
    secret = generated_secret(rendered, "gateway-admin-users")
    assert volumes[secret_mount["name"]]["secret"]["secretName"] == secret["metadata"]["name"]
    assert Path(users_path).name in secret["data"]
    # The kubelet waits for the whole drain before SIGKILL.
    assert pod["terminationGracePeriodSeconds"] >= cfg.shutdown_grace_s + STORE_CLOSE_MARGIN_S
    # Service links would put GATEWAY_* variables (from the Service "gateway") in the environment.
    assert pod["enableServiceLinks"] is False


def test_probes_hit_the_probe_port(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    ctr = container(rendered)
    cfg, _ = effective_config(rendered, tmp_path)
    # The probe port's own listener ([admin] probe_port), not the admin port
    # idle sockets can fill; it serves these paths without a login.
    assert cfg.admin.probe_port > 0 and cfg.admin.probe_port != cfg.admin_port
    expected = {"readinessProbe": "/readyz", "livenessProbe": "/healthz", "startupProbe": "/healthz"}
    for probe, path in expected.items():
        get = ctr[probe]["httpGet"]
        assert get["path"] == path, probe
        assert port_number(ctr, get["port"]) == cfg.admin.probe_port, probe
    startup = ctr["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 60, "store recovery gets at least a minute"


def _quantity(value: str | int) -> float:
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9}
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(value))
    assert match, value
    return float(match[1]) * units.get(match[2], 1) if match[2] else float(match[1])


def test_security_context_and_resources(rendered: list[dict[str, Any]]) -> None:
    pod = pod_spec(the(rendered, "StatefulSet"))
    ctr = container(rendered)
    psc, csc = pod["securityContext"], ctr["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] > 0 and psc["fsGroup"] > 0
    assert csc["runAsNonRoot"] is True
    assert csc["readOnlyRootFilesystem"] is True
    assert csc["allowPrivilegeEscalation"] is False
    assert csc["capabilities"]["drop"] == ["ALL"] and "add" not in csc["capabilities"]
    assert psc["seccompProfile"]["type"] == "RuntimeDefault"
    # A read-only root needs a writable /tmp.
    tmp_mount = next(m for m in ctr["volumeMounts"] if m["mountPath"] == "/tmp")
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == tmp_mount["name"])
    # The image's USER is the uid the pod runs as.
    user = dockerfile_instructions()["USER"][-1].split(":")
    assert int(user[0]) == psc["runAsUser"] == csc.get("runAsUser", psc["runAsUser"])
    resources = ctr["resources"]
    for kind in ("cpu", "memory"):
        request, limit = _quantity(resources["requests"][kind]), _quantity(resources["limits"][kind])
        assert 0 < request <= limit, kind


def test_services_pdb_and_statefulset_fit_together(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    sts = the(rendered, "StatefulSet")
    template_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert sts["spec"]["replicas"] == 3, "one primary, two backups (test_deploy_ha.py checks the group)"
    assert sts["spec"]["selector"]["matchLabels"].items() <= template_labels.items()
    cfg, _ = effective_config(rendered, tmp_path)
    ctr = container(rendered)

    service = the(rendered, "Service", "gateway")
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert service["spec"]["selector"].items() <= template_labels.items()
    exposed = {p["name"]: (p["port"], port_number(ctr, p["targetPort"])) for p in service["spec"]["ports"]}
    # What clients use; the replication port is for the group alone (the headless Service).
    assert exposed == {"stomp": (61613, cfg.stomp_port), "mqtt": (1883, cfg.mqtt_port), "admin": (8161, cfg.admin_port)}
    notes = service["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true"
    assert int(notes["prometheus.io/port"]) == cfg.admin_port
    assert notes["prometheus.io/path"] == "/metrics"

    headless = the(rendered, "Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"].items() <= template_labels.items()

    pdb = the(rendered, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= template_labels.items()


def test_admin_users_secret_is_a_placeholder_that_admits_nobody(rendered: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = generated_secret(rendered, "gateway-admin-users")
    text = base64.b64decode(secret["data"]["users.toml"]).decode()
    assert "REPLACE" in text and "gateway passwd" in text, "the placeholder tells operators what to do"
    users = tomllib.loads(text)["users"]
    assert users and all({"name", "password_hash", "role"} <= set(u) for u in users)
    from gateway import auth
    from gateway.admin import api as adminapi
    path = tmp_path / "users.toml"
    path.write_text(text)
    monkeypatch.setenv(adminapi.USERS_FILE_ENV, str(path))
    cfg, _ = effective_config(rendered, tmp_path)
    loaded = adminapi.load_users(cfg.admin)
    assert set(loaded) == {u["name"] for u in users}
    for name, (hashed, _) in loaded.items():
        for guess in ("", "admin", "password", "changeme", name, "REPLACE-ME"):
            assert not auth.verify_password(guess, hashed), f"the placeholder admits {name}:{guess!r}"


def test_client_users_come_from_their_own_secret(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    """GATEWAY_USERS_FILE names the key of Secret gateway-client-users, mounted
    read-only; as shipped it holds no user (so only the pod's loopback gets in
    anonymously: test_the_shipped_manifests_are_not_open_to_the_network), and
    the users an operator puts there are the broker's [auth] users."""
    ctr = container(rendered)
    pod = pod_spec(the(rendered, "StatefulSet"))
    volumes = {v["name"]: v for v in pod["volumes"]}
    env = pod_environment(rendered, pod_names(rendered)[0])
    from gateway.config import USERS_FILE_ENVIRONMENT

    path = env[USERS_FILE_ENVIRONMENT]
    mount = next(m for m in ctr["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/"))
    assert mount["readOnly"] is True
    secret = generated_secret(rendered, "gateway-client-users")
    assert volumes[mount["name"]]["secret"]["secretName"] == secret["metadata"]["name"]
    assert volumes[mount["name"]]["secret"]["defaultMode"] == 0o440
    (tmp_path / "shipped").mkdir()
    (tmp_path / "filled").mkdir()
    shipped, _ = effective_config(rendered, tmp_path / "shipped")
    assert shipped.auth.users == [] and shipped.admin.users == []

    from gateway.auth import hash_password

    users = f'users = [{{ name = "app", password_hash = "{hash_password("app-pw", iterations=1000)}", groups = ["producers"] }}]\n'
    filled = copy.deepcopy(rendered)  # the module's rendering stays as shipped
    generated_secret(filled, "gateway-client-users")["data"][Path(path).name] = base64.b64encode(users.encode()).decode()
    cfg, _ = effective_config(filled, tmp_path / "filled")
    assert [(u["name"], u["groups"]) for u in cfg.auth.users] == [("app", ["producers"])]


def test_the_shipped_manifests_are_not_open_to_the_network(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    """As shipped (no client user, bound to all the pod's addresses), the
    config the pod runs refuses an anonymous client from the pod network,
    lets a port-forward (the pod's loopback) in, and says at start, in one
    line, that remote anonymous clients are refused and how to change that.
    Opening it takes an explicit ``anonymous = "true"``, which says so loudly."""
    from structlog.testing import capture_logs

    from gateway import startup
    from gateway.auth import AccessDenied, Gatekeeper, Transport

    cfg, _ = effective_config(rendered, tmp_path)
    assert cfg.bind == "0.0.0.0" and cfg.auth.users == [] and cfg.auth.anonymous != "true"
    gatekeeper = Gatekeeper(cfg.auth)
    for login in (None, "guest"):
        with pytest.raises(AccessDenied) as refused:
            gatekeeper.admit(login, "guest", Transport(peer="10.244.1.7:51234", host="10.244.1.7"))
        assert refused.value.kind == "remote_anonymous"
    assert gatekeeper.admit(None, None, Transport(peer="127.0.0.1:51234", host="127.0.0.1")).name == "anonymous"
    with capture_logs() as logged:
        startup.announce_access(cfg, structlog_logger())
    assert [(e["event"], e["log_level"]) for e in logged] == [("remote_anonymous_refused", "warning")]
    assert 'anonymous = "true"' in logged[0]["detail"] and "GATEWAY_USER" in logged[0]["detail"]

    opened = dataclasses.replace(cfg, auth=dataclasses.replace(cfg.auth, anonymous="true"))
    with capture_logs() as logged:
        startup.announce_access(opened, structlog_logger())
    assert [(e["event"], e["log_level"]) for e in logged] == [("broker_open_to_network", "warning")]


def structlog_logger() -> Any:
    import structlog

    return structlog.get_logger()
