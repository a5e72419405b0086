"""Who may connect without a login is decided by the connection's source
address: a broker with no users admits anonymous clients from this machine
(loopback) and refuses them from elsewhere with a reason that says how to
allow them; ``anonymous = "true"`` admits them from anywhere; a user logs in
from anywhere.  The Gatekeeper is the one place every door (STOMP, MQTT,
their TLS and WebSocket listeners) asks."""

from __future__ import annotations

import pytest

from core.authorization import ANONYMOUS_PRINCIPAL
from gateway.auth import AccessDenied, AuthSettings, Gatekeeper, Transport, hash_password, is_loopback

USER = {"name": "app", "password_hash": hash_password("pw", iterations=1000)}
LOOPBACK = ["127.0.0.1", "127.0.0.2", "127.255.255.254", "::1", "::ffff:127.0.0.1", "::FFFF:127.3.2.1", "0:0:0:0:0:0:0:1"]
REMOTE = ["10.0.0.5", "192.168.1.2", "0.0.0.0", "::", "::ffff:10.0.0.1", "fe80::1%eth0", "2001:db8::1",
          "::127.0.0.1", "64:ff9b::7f00:1", "localhost", "unknown", "", "127.0.0.1.example"]


@pytest.mark.parametrize("host", LOOPBACK)
def test_loopback_sources_are_this_machine(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", REMOTE)
def test_every_other_source_is_remote(host: str) -> None:
    # A name (what a peer never is) or "unknown" (getpeername failed) is
    # remote too: the decision fails closed.
    assert not is_loopback(host)


def admit(settings: AuthSettings, host: str, login: str | None = None, passcode: str | None = None):
    return Gatekeeper(settings).admit(login, passcode, Transport(peer=f"{host}:40000", host=host))


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "::ffff:127.0.0.1"])
@pytest.mark.parametrize("login", [None, "guest"])  # many clients send a default login to an open broker
def test_with_no_users_this_machines_anonymous_clients_are_admitted(host: str, login: str | None) -> None:
    assert admit(AuthSettings(), host, login, "guest") == ANONYMOUS_PRINCIPAL


@pytest.mark.parametrize("host", ["10.0.0.5", "::ffff:10.0.0.5", "2001:db8::1"])
@pytest.mark.parametrize("login", [None, "guest"])
def test_with_no_users_remote_anonymous_clients_are_refused_with_how_to_allow_them(host: str, login: str | None) -> None:
    gatekeeper = Gatekeeper(AuthSettings())
    for _ in range(AuthSettings().max_failed_logins + 2):
        with pytest.raises(AccessDenied) as refused:
            gatekeeper.admit(login, "guest", Transport(peer=f"{host}:40000", host=host))
        # The same reason every time: no password was tried, so no lockout hides it.
        assert refused.value.kind == "remote_anonymous"
        assert "anonymous access from remote addresses is off" in refused.value.reason
        assert '[auth] anonymous = "true"' in refused.value.reason
    assert gatekeeper.refused == {"remote_anonymous": AuthSettings().max_failed_logins + 2}
    assert gatekeeper.failing_addresses == 0


def test_anonymous_true_admits_remote_clients() -> None:
    assert admit(AuthSettings(anonymous="true"), "10.0.0.5") == ANONYMOUS_PRINCIPAL
    assert admit(AuthSettings(anonymous="true", users=[USER]), "10.0.0.5") == ANONYMOUS_PRINCIPAL


def test_anonymous_false_refuses_this_machine_too() -> None:
    with pytest.raises(AccessDenied) as refused:
        admit(AuthSettings(anonymous="false"), "127.0.0.1")
    assert refused.value.kind == "credentials"


def test_a_user_logs_in_from_anywhere_and_anonymous_is_refused_everywhere() -> None:
    settings = AuthSettings(users=[USER])
    assert admit(settings, "10.0.0.5", "app", "pw").name == "app"
    for host in ("127.0.0.1", "10.0.0.5"):
        with pytest.raises(AccessDenied) as refused:
            admit(settings, host)
        assert refused.value.kind == "credentials"


def test_a_reload_that_opens_the_broker_takes_effect_for_the_next_login() -> None:
    gatekeeper = Gatekeeper(AuthSettings())
    remote = Transport(peer="10.0.0.5:40000", host="10.0.0.5")
    with pytest.raises(AccessDenied):
        gatekeeper.admit(None, None, remote)
    gatekeeper.reconfigure(AuthSettings(anonymous="true"))
    assert gatekeeper.admit(None, None, remote) == ANONYMOUS_PRINCIPAL



def test_a_reload_that_closes_the_broker_again_revokes_remote_anonymous_clients_only() -> None:
    """What a reload asks of each anonymous client already connected (the app's
    re-check): from ``anonymous = "true"`` back to "auto" without users, a remote
    one may no longer be connected, this machine's may."""
    gatekeeper = Gatekeeper(AuthSettings(anonymous="true"))
    assert gatekeeper.admits_anonymous("10.0.0.5") and gatekeeper.admits_anonymous("127.0.0.1")
    gatekeeper.reconfigure(AuthSettings())
    assert not gatekeeper.admits_anonymous("10.0.0.5")
    assert not gatekeeper.admits_anonymous("unknown")
    assert gatekeeper.admits_anonymous("127.0.0.1") and gatekeeper.admits_anonymous("::1")
    gatekeeper.reconfigure(AuthSettings(users=[USER]))
    assert not gatekeeper.admits_anonymous("127.0.0.1")

@pytest.mark.parametrize(("bind", "anonymous", "users", "said"), [
    ("127.0.0.1", "auto", [], []),  # make run: nothing to say
    ("::1", "auto", [], []),
    ("localhost", "auto", [], []),
    ("0.0.0.0", "auto", [], ["remote_anonymous_refused"]),
    ("::", "auto", [], ["remote_anonymous_refused"]),
    ("10.0.0.5", "auto", [], ["remote_anonymous_refused"]),
    ("0.0.0.0", "auto", [USER], []),  # users: anonymous is off, nothing open
    ("0.0.0.0", "true", [], ["broker_open_to_network"]),
    ("0.0.0.0", "true", [USER], ["broker_open_to_network"]),
    ("127.0.0.1", "true", [USER], ["anonymous_access_enabled"]),
    ("127.0.0.1", "true", [], []),
    ("0.0.0.0", "false", [], ["no_client_can_connect"]),
    ("127.0.0.1", "false", [USER], []),
])
def test_the_start_says_who_gets_in_without_a_login_in_one_line(bind, anonymous, users, said) -> None:
    from structlog import get_logger
    from structlog.testing import capture_logs

    from gateway import startup
    from gateway.config import Config

    with capture_logs() as logged:
        startup.announce_access(Config(bind=bind, auth=AuthSettings(users=users, anonymous=anonymous)), get_logger())
    assert [e["event"] for e in logged] == said
    assert all(e["log_level"] == "warning" for e in logged)
    for event in logged:
        if event["event"] == "remote_anonymous_refused":
            assert 'anonymous = "true"' in event["detail"] and "GATEWAY_USER" in event["detail"]
            assert "users_file" in event["detail"] and "gateway passwd" in event["detail"]
