"""What a reload decides, without a broker: which keys changed, which of
them apply live and which wait for a restart, and that a configuration that
does not load changes nothing."""

from __future__ import annotations

import dataclasses

from gateway import reload
from gateway.auth import AuthSettings
from gateway.config import Config, ConfigError
from tests.support.auth_helpers import user


class Log:
    """Records what the reloader logs (no structlog set-up shared with other tests)."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    def info(self, event: str, **fields: object) -> None:
        self.events.append({"event": event, "log_level": "info", **fields})

    def warning(self, event: str, **fields: object) -> None:
        self.events.append({"event": event, "log_level": "warning", **fields})


class Target:
    def __init__(self) -> None:
        self.applied: list[tuple[Config, dict]] = []

    def apply(self, config: Config, admins: dict) -> None:
        self.applied.append((config, admins))


def reloader(running: Config, new: Config | Exception) -> tuple[reload.Reloader, Target, Log]:
    def reread(previous: Config) -> Config:
        if isinstance(new, Exception):
            raise new
        return new

    target, log = Target(), Log()
    return reload.Reloader(running, {}, reread, target, log), target, log


def test_differences_name_nested_keys():
    old = Config()
    new = dataclasses.replace(old, stomp_port=1, auth=AuthSettings(anonymous="true"))
    assert reload.differences(old, new) == ["stomp_port", "auth.anonymous"]
    assert reload.differences(old, Config()) == []


def test_live_keys_are_logins_acl_admin_users_and_policies_only():
    assert all(reload.live(k) for k in ("auth.users", "auth.acl", "auth.anonymous", "admin.users",
                                        "admin.users_file", "broker.policies"))
    assert not any(reload.live(k) for k in ("stomp_port", "data_dir", "admin.max_connections", "broker.default_prefetch",
                                            "store.sync", "tls.cert"))


def test_a_new_user_is_applied_and_a_port_change_waits_for_a_restart():
    running = Config()
    new = dataclasses.replace(running, mqtt_port=1884, auth=AuthSettings(users=[user("bob", "pw")]))
    subject, target, log = reloader(running, new)
    outcome = subject.reload("test")
    assert outcome == reload.Outcome(("auth.users +bob",), ("mqtt_port",))
    assert [c.auth.users[0]["name"] for c, _ in target.applied] == ["bob"]
    assert subject.config.mqtt_port == running.mqtt_port  # the running value stays
    assert [e["event"] for e in log.events] == ["config_reloaded", "config_reload_needs_restart"]
    # Asked again, the port is still named: it has not taken effect.
    assert subject.reload("test").restart_needed == ("mqtt_port",)


def test_a_configuration_that_does_not_load_changes_nothing():
    running = Config()
    subject, target, log = reloader(running, ConfigError("unknown setting auth.'nope'"))
    outcome = subject.reload("SIGHUP")
    assert outcome.refused == "unknown setting auth.'nope'"
    assert not target.applied and subject.config is running
    assert log.events[0]["event"] == "config_reload_failed" and log.events[0]["log_level"] == "warning"


def test_without_a_way_to_read_again_a_reload_is_refused():
    target = Target()
    subject = reload.Reloader(Config(), {}, None, target, Log())
    assert "restart" in (subject.reload("api").refused or "")
    assert not target.applied
