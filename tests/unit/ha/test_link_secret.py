"""The cluster secret's settings (gateway/config.py) and where the
replication listener binds without one (gateway/ha/primary_role.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway import config
from gateway.ha.primary_role import replication_bind, warn_open_links

GOOD = """
[ha]
node_id = "gw-0"
zookeeper = "zk-0:2181/gateway"
replication_listen = "0.0.0.0:7000"
advertise = "gw-0.gw:7000"
"""
SECRET = "3f6c1d0e9a8b7c6d5e4f3a2b1c0d9e8f"


def load(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> config.Config:
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    return config.load(str(path), environ=environ or {})


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))


def test_the_secret_comes_from_its_file_and_is_never_in_a_repr(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text(SECRET + "\n")  # a file written with echo
    ha = load(tmp_path, GOOD + f'cluster_secret_file = "{tmp_path / "secret"}"\n',
              {config.CLUSTER_SECRET_ENVIRONMENT: "the environment's, not used " * 2}).ha
    assert ha is not None and ha.cluster_secret == SECRET.encode()
    assert SECRET not in repr(ha) and SECRET not in str(ha)


def test_the_secret_comes_from_the_environment_without_a_file(tmp_path: Path) -> None:
    ha = load(tmp_path, GOOD, {config.CLUSTER_SECRET_ENVIRONMENT: SECRET}).ha
    assert ha is not None and ha.cluster_secret == SECRET.encode()


@pytest.mark.parametrize(("extra", "environ", "message"), [
    ('cluster_secret_file = "/nonexistent/secret"\n', {}, "ha.cluster_secret_file /nonexistent/secret"),
    ('cluster_secret = "inline"\n', {}, "not in the configuration"),
    ("", {config.CLUSTER_SECRET_ENVIRONMENT: "short"}, "at least 16 bytes"),
    ("open_links = 1\n", {}, "ha.open_links"),
])
def test_an_unusable_secret_is_refused_at_start(tmp_path: Path, extra: str, environ: dict[str, str],
                                                message: str) -> None:
    with pytest.raises(config.ConfigError, match=message):
        load(tmp_path, GOOD + extra, environ)


def test_an_empty_secret_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("\n")
    with pytest.raises(config.ConfigError, match="is empty"):
        load(tmp_path, GOOD + f'cluster_secret_file = "{tmp_path / "secret"}"\n')


def test_without_a_secret_the_listener_binds_loopback_and_says_so_once(tmp_path: Path) -> None:
    ha = load(tmp_path, GOOD).ha
    assert ha is not None and not ha.cluster_secret
    assert replication_bind(ha) == ("127.0.0.1", 7000)
    log = Log()
    warn_open_links(ha, log)
    assert [event for event, _ in log.lines] == ["replication_link_loopback_only"]
    assert "cluster_secret_file" in log.lines[0][1]["detail"] and log.lines[0][1]["listen"] == "127.0.0.1:7000"


def test_without_a_secret_an_ipv6_wildcard_binds_ipv6_loopback(tmp_path: Path) -> None:
    ha = load(tmp_path, GOOD.replace("0.0.0.0:7000", ":::7000")).ha
    assert ha is not None and replication_bind(ha) == ("::1", 7000)


def test_a_loopback_address_stays_as_configured(tmp_path: Path) -> None:
    ha = load(tmp_path, GOOD.replace("0.0.0.0:7000", "127.0.0.2:7000")).ha
    assert ha is not None and replication_bind(ha) == ("127.0.0.2", 7000)


def test_open_links_binds_as_configured_and_warns(tmp_path: Path) -> None:
    ha = load(tmp_path, GOOD + "open_links = true\n").ha
    assert ha is not None and replication_bind(ha) == ("0.0.0.0", 7000)
    log = Log()
    warn_open_links(ha, log)
    assert [event for event, _ in log.lines] == ["replication_link_open"]


def test_with_a_secret_it_binds_as_configured_and_says_nothing(tmp_path: Path) -> None:
    ha = load(tmp_path, GOOD, {config.CLUSTER_SECRET_ENVIRONMENT: SECRET}).ha
    assert ha is not None and replication_bind(ha) == ("0.0.0.0", 7000)
    log = Log()
    warn_open_links(ha, log)
    assert log.lines == []


def test_a_cluster_secret_file_others_can_read_is_warned_about(tmp_path: Path) -> None:
    from gateway.startup import check_secret_files

    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    secret.chmod(0o644)
    cfg = load(tmp_path, GOOD + f'cluster_secret_file = "{secret}"\n')
    log = Log()
    check_secret_files(cfg, {}, log)
    assert [(event, fields["what"]) for event, fields in log.lines] == [("secret_file_readable", "cluster secret file")]
    assert SECRET not in repr(log.lines)
    secret.chmod(0o600)
    quiet = Log()
    check_secret_files(cfg, {}, quiet)
    assert quiet.lines == []


def test_link_tls_needs_the_tls_certificate_key_and_ca(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError, match="ha.link_tls needs tls.cert, tls.key and tls.ca"):
        load(tmp_path, GOOD + "link_tls = true\n")
    with pytest.raises(config.ConfigError, match="cannot load the certificate"):
        load(tmp_path, GOOD + 'link_tls = true\n[tls]\ncert = "/nonexistent.pem"\nkey = "/nonexistent.pem"\n'
                              'ca = "/nonexistent-ca.pem"\nplain = true\n')
