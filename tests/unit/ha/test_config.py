"""The ``[ha]`` table (gateway/config.py): read with its defaults, absent
means single-node, and every unusable value is refused naming the setting."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway import config

GOOD = """
[ha]
node_id = "gw-0"
zookeeper = "zk-0:2181,zk-1:2181/gateway"
replication_listen = "0.0.0.0:7000"
advertise = "gw-0.gw:7000"
"""


def load(tmp_path: Path, text: str) -> config.Config:
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    return config.load(str(path))


def test_an_ha_table_is_read_with_its_defaults(tmp_path: Path) -> None:
    ha = load(tmp_path, GOOD).ha
    assert ha == config.HaSettings("gw-0", "zk-0:2181,zk-1:2181/gateway", "0.0.0.0:7000", "gw-0.gw:7000", 3, 1, 10.0, 10.0)


def test_the_link_liveness_settings_are_read(tmp_path: Path) -> None:
    ha = load(tmp_path, GOOD + "link_heartbeat_s = 1\nlink_timeout_s = 3\n").ha
    assert ha is not None and (ha.link_heartbeat_s, ha.link_timeout_s) == (1.0, 3.0)
    assert (config.HaSettings().link_heartbeat_s, config.HaSettings().link_timeout_s) == (0.5, 2.0)


def test_without_an_ha_table_the_broker_is_single_node(tmp_path: Path) -> None:
    assert load(tmp_path, "").ha is None


@pytest.mark.parametrize(("line", "message"), [
    ('node_id = "no/slash"', "ha.node_id must be"),
    ('advertise = "gw-0"', "ha.advertise must be \"host:port\""),
    ('replication_listen = "h:99999"', "ha.replication_listen must be"),
    ('zookeeper = "/gateway"', "ha.zookeeper must be"),
    ("sync_replicas = -1", "ha.sync_replicas must be >= 0"),
    ("sync_replicas = 3", "ha.replicas must be >= 1 and more than ha.sync_replicas, not replicas = 3 with "
                          "sync_replicas = 3"),
    ("replicas = 0", "ha.replicas must be >= 1"),
    ("zookeeper_session_timeout_s = 0", "must be > 0"),
    ('sync_replicas = "1"', "ha.sync_replicas: expected int"),
    ("colour = 1", "unknown setting ha.'colour'"),
    ("link_heartbeat_s = 0", "ha.link_heartbeat_s must be > 0 and ha.link_timeout_s at least 3 times it, not 0 and 2"),
    ("link_timeout_s = 1", "ha.link_heartbeat_s must be > 0 and ha.link_timeout_s at least 3 times it, not 0.5 and 1"),
])
def test_an_unusable_value_is_refused_naming_it(tmp_path: Path, line: str, message: str) -> None:
    key = line.split(" = ")[0]
    text = "\n".join(l for l in GOOD.splitlines() if not l.startswith(key + " ")) + "\n" + line + "\n"
    with pytest.raises(config.ConfigError, match=message.replace("(", r"\(")) as info:
        load(tmp_path, text)
    assert message in str(info.value)


def test_a_missing_required_setting_is_named(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError, match="ha.advertise is required"):
        load(tmp_path, "\n".join(l for l in GOOD.splitlines() if not l.startswith("advertise")))


def test_a_single_node_broker_loads_nothing_of_ha() -> None:
    # The command's module and the broker's wiring, as `gateway serve` loads them without [ha].
    code = ("import sys, gateway.__main__, gateway.app; "
            "print(sorted(m for m in sys.modules if m.startswith(('gateway.ha', 'kazoo'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_environment_names_the_node_over_the_file(tmp_path: Path) -> None:
    """One file for the whole group (a Kubernetes ConfigMap): each pod names
    itself through GATEWAY_HA_NODE_ID / GATEWAY_HA_ADVERTISE, set from its name."""
    shared = "\n".join(l for l in GOOD.splitlines() if not l.startswith(("node_id", "advertise")))
    path = tmp_path / "gateway.toml"
    path.write_text(shared)
    env = {"GATEWAY_HA_NODE_ID": "gateway-2", "GATEWAY_HA_ADVERTISE": "gateway-2.gateway-headless:7000"}
    ha = config.load(str(path), environ=env).ha
    assert ha is not None and (ha.node_id, ha.advertise) == ("gateway-2", "gateway-2.gateway-headless:7000")
    assert ha.zookeeper == "zk-0:2181,zk-1:2181/gateway"  # the shared keys stay the file's
    # The environment wins over the file; an empty variable counts as unset.
    path.write_text(GOOD)
    ha = config.load(str(path), environ={**env, "GATEWAY_HA_ADVERTISE": ""}).ha
    assert ha is not None and (ha.node_id, ha.advertise) == ("gateway-2", "gw-0.gw:7000")
    # Without them the file must name the node, and the error says both ways.
    path.write_text(shared)
    with pytest.raises(config.ConfigError, match=r"ha.node_id is required in \[ha\] \(or GATEWAY_HA_NODE_ID"):
        config.load(str(path), environ={})
    # Checked like the file's values.
    with pytest.raises(config.ConfigError, match="ha.advertise must be"):
        config.load(str(path), environ={**env, "GATEWAY_HA_ADVERTISE": "no-port"})


def test_without_an_ha_table_the_environment_changes_nothing(tmp_path: Path) -> None:
    # The same pod spec may run a single-node file (an overlay without [ha]).
    path = tmp_path / "gateway.toml"
    path.write_text("")
    assert config.load(str(path), environ={"GATEWAY_HA_NODE_ID": "gateway-0"}).ha is None


def test_the_command_reads_the_environment(tmp_path: Path) -> None:
    # `gateway serve` passes its environment: a missing node id in both places is named, exit 2.
    shared = "\n".join(l for l in GOOD.splitlines() if not l.startswith("node_id"))
    (tmp_path / "gateway.toml").write_text(shared)
    run = [sys.executable, "-m", "gateway", "serve", "--config", str(tmp_path / "gateway.toml")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_HA_")}
    out = subprocess.run(run, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2 and "GATEWAY_HA_NODE_ID" in out.stderr, out.stderr
    out = subprocess.run(run, capture_output=True, text=True, timeout=60,
                         env={**env, "GATEWAY_HA_NODE_ID": "bad/id"})
    assert out.returncode == 2 and "ha.node_id must be" in out.stderr and "bad/id" in out.stderr, out.stderr


def test_the_zookeeper_credentials_come_from_a_file_or_the_environment(tmp_path: Path) -> None:
    """[ha] zookeeper_auth_file (a mounted Secret, its trailing newline dropped)
    or GATEWAY_ZOOKEEPER_AUTH; never the configuration file itself, and never in a repr."""
    secret = tmp_path / "zk-auth"
    secret.write_text("gateway:s3cret:with-colon\n")
    path = tmp_path / "gateway.toml"
    path.write_text(GOOD + f'zookeeper_auth_file = "{secret}"\n')
    ha = config.load(str(path), environ={}).ha
    assert ha is not None and ha.zookeeper_auth == "gateway:s3cret:with-colon"
    assert "s3cret" not in repr(ha)
    path.write_text(GOOD)
    ha = config.load(str(path), environ={"GATEWAY_ZOOKEEPER_AUTH": "gw:pw"}).ha
    assert ha is not None and ha.zookeeper_auth == "gw:pw"
    assert config.load(str(path), environ={}).ha.zookeeper_auth == ""  # type: ignore[union-attr]  # open: the laptop trial
    # A mounted Secret named by the environment, as deploy/statefulset.yaml does.
    ha = config.load(str(path), environ={"GATEWAY_ZOOKEEPER_AUTH_FILE": str(secret)}).ha
    assert ha is not None and ha.zookeeper_auth == "gateway:s3cret:with-colon"
    path.write_text(GOOD + 'zookeeper_auth = "gw:pw"\n')
    with pytest.raises(config.ConfigError, match="credentials do not go into the configuration file"):
        config.load(str(path), environ={})


@pytest.mark.parametrize(("content", "message"), [
    (None, "does not exist"),
    ("\n", "is empty"),
    ("nocolon\n", 'must hold "user:password"'),
    (":password", 'must hold "user:password"'),
    ("user:", 'must hold "user:password"'),
    ("user:pass\nword", 'must hold "user:password"'),
    ("u:" + "p" * 2000, 'must hold "user:password"'),
])
def test_unusable_zookeeper_credentials_are_refused_at_start(tmp_path: Path, content: str | None, message: str) -> None:
    secret = tmp_path / "zk-auth"
    if content is not None:
        secret.write_text(content)
    path = tmp_path / "gateway.toml"
    path.write_text(GOOD + f'zookeeper_auth_file = "{secret}"\n')
    with pytest.raises(config.ConfigError, match=message) as info:
        config.load(str(path), environ={})
    assert "ha.zookeeper_auth_file" in str(info.value)
    assert "pass" not in str(info.value).replace("password", "")  # the secret is not repeated
    # Both ways at once is a mistake to name, not to guess at.
    secret.write_text("u:p")
    with pytest.raises(config.ConfigError, match="both set"):
        config.load(str(path), environ={"GATEWAY_ZOOKEEPER_AUTH": "u:p"})
