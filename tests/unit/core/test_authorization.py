"""The authorization map and the login gate, without a network."""

from __future__ import annotations

import pytest

from core import names
from core.authorization import ANONYMOUS_PRINCIPAL, Authorizer, Principal, covers, parse_entries
from gateway import auth
from gateway.auth import AccessDenied, AuthSettings, Gatekeeper, Transport, VerificationPending, hash_password


def seg(text):
    return tuple(text.split("."))


@pytest.mark.parametrize(
    ("general", "specific", "expected"),
    [
        ("a.b", "a.b", True), ("a.b", "a.c", False), ("a.*", "a.b", True), ("a.*", "a.*", True),
        ("a.*", "a.b.c", False), ("a.>", "a.b.c", True), ("a.>", "a.*", True), ("a.>", "a.>", True),
        (">", "x.y", True), (">", ">", True), ("a.b", "a.*", False), ("a.*", "a.>", False),
        ("a.*.c", "a.*.c", True), ("a.*.c", "a.>", False), ("a.b.>", "a.>", False), ("a", "a.b", False),
    ],
)
def test_covers(general, specific, expected):
    assert covers(seg(general), seg(specific)) is expected


ENTRIES = parse_entries([
    {"destination": "/queue/orders.>", "write": ["producers"], "read": "clerk"},
    {"destination": "/topic/plant.>", "read": ["*"]},
    {"destination": "/topic/plant.secret", "read": ["ops"]},
])


@pytest.mark.parametrize(
    ("principal", "operation", "destination", "allowed"),
    [
        (Principal("app", frozenset({"producers"})), "write", "/queue/orders.eu", True),
        (Principal("app", frozenset({"producers"})), "read", "/queue/orders.eu", False),
        (Principal("clerk"), "read", "/queue/orders.eu", True),
        (Principal("clerk"), "read", "/topic/orders.eu", False),  # a queue grant is not a topic grant
        (ANONYMOUS_PRINCIPAL, "read", "/topic/plant.1.temp", True),  # "*" includes anonymous
        (ANONYMOUS_PRINCIPAL, "write", "/topic/plant.1.temp", False),
        (Principal("x"), "read", "/topic/plant.>", True),
        (Principal("x"), "read", "/topic/>", False),
        (Principal("x"), "admin", "/queue/orders.eu", False),  # nothing granted: denied
    ],
)
def test_grants_add_up_and_anything_else_is_denied(principal, operation, destination, allowed):
    address = names.parse(destination)
    assert Authorizer(ENTRIES).allows(principal, operation, address) is allowed


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"read": ["a"]}, "needs a destination pattern"),
        ({"destination": "orders"}, r"acl\[0\]\.destination: destination must start with"),
        ({"destination": "/temp-queue/x", "read": ["a"]}, "temporary destinations"),
        ({"destination": "/queue/a", "browse": ["a"]}, "unknown key 'browse'"),
        ({"destination": "/queue/a", "read": [1]}, "list of user or group names"),
    ],
)
def test_bad_entries_are_named(table, message):
    with pytest.raises(ValueError, match=message):
        parse_entries([table])


class Clock:
    now = 100.0

    def __call__(self):
        return self.now


def gate(clock, **settings):
    users = [{"name": "app", "password_hash": hash_password("pw", iterations=1000), "groups": ["g"]}]
    return Gatekeeper(AuthSettings(users=users, **settings), clock)


def test_the_gate_gives_the_principal_with_its_groups():
    assert gate(Clock()).admit("app", "pw", Transport(host="h")) == Principal("app", frozenset({"g"}))


def test_the_lockout_counts_per_host_and_ends_with_its_window():
    clock = Clock()
    keeper = gate(clock, max_failed_logins=2, failed_login_window_s=10)
    for _ in range(2):
        with pytest.raises(AccessDenied, match="authentication failed"):
            keeper.admit("app", "bad", Transport(host="h1"))
    with pytest.raises(AccessDenied, match="too many failed logins from h1; try again in 10 s") as denied:
        keeper.admit("app", "pw", Transport(host="h1"))
    assert denied.value.kind == "rate_limited"
    assert keeper.admit("app", "pw", Transport(host="h2")).name == "app"  # another address is unaffected
    clock.now += 10
    assert keeper.admit("app", "pw", Transport(host="h1")).name == "app"


def test_a_success_clears_the_count():
    keeper = gate(Clock(), max_failed_logins=2)
    with pytest.raises(AccessDenied):
        keeper.admit("app", "bad", Transport(host="h"))
    keeper.admit("app", "pw", Transport(host="h"))
    with pytest.raises(AccessDenied, match="authentication failed"):
        keeper.admit("app", "bad", Transport(host="h"))  # one failure again, not two


def test_the_table_of_failing_addresses_is_bounded(monkeypatch):
    monkeypatch.setattr(auth, "TRACKED_ADDRESSES", 50)
    keeper = gate(Clock())
    for i in range(200):
        with pytest.raises(AccessDenied):
            keeper.admit(None, None, Transport(host=f"10.0.0.{i}"))
    assert keeper.failing_addresses == 50


def test_a_certificate_user_needs_no_password_and_a_refused_transport_is_refused():
    keeper = gate(Clock())
    assert keeper.admit(None, None, Transport(certificate_user="app")).groups == frozenset({"g"})
    with pytest.raises(AccessDenied, match="limit 2") as denied:
        keeper.admit("app", "pw", Transport(refused="too many connections (limit 2)"))
    assert denied.value.kind == "unavailable"


def test_a_check_off_the_loop_answers_the_retried_admit_and_bounds_what_one_address_queues():
    keeper = gate(Clock())
    queued = []
    keeper.verifiers[auth.MESSAGING] = lambda passcode, stored, done: queued.append((passcode, stored, done)) or True
    woken = []
    with pytest.raises(VerificationPending) as pending:
        keeper.admit("app", "pw", Transport(host="h"))
    assert pending.value.start(lambda: woken.append(1))
    for _ in range(auth.PENDING_PER_ADDRESS - 1):
        with pytest.raises(VerificationPending) as more:
            keeper.admit("app", "other", Transport(host="h"))
        assert more.value.start(lambda: None)
    with pytest.raises(AccessDenied, match="too many logins in progress from h"):
        keeper.admit("app", "pw", Transport(host="h"))
    passcode, stored, done = queued[0]
    done(auth.verify_password(passcode, stored))
    assert woken == [1]
    assert keeper.admit("app", "pw", Transport(host="h")).name == "app"  # answered from the check, no new one
    assert len(queued) == auth.PENDING_PER_ADDRESS


def test_a_full_backlog_says_busy():
    keeper = gate(Clock())
    keeper.verifiers[auth.MESSAGING] = lambda passcode, stored, done: False
    with pytest.raises(VerificationPending) as pending:
        keeper.admit("app", "pw", Transport(host="h"))
    assert pending.value.start(lambda: None) is False


class Door:
    """A fake verifier with a bounded queue, as gateway/tasks.py gives each door."""

    def __init__(self, backlog):
        self.backlog = backlog
        self.queued = []

    def __call__(self, passcode, stored, done):
        if len(self.queued) >= self.backlog:
            return False
        self.queued.append((passcode, stored, done))
        return True

    def answer_all(self):
        queued, self.queued = self.queued, []
        for passcode, stored, done in queued:
            done(auth.verify_password(passcode, stored))


def admin_guess(keeper, host, password="guess"):
    """What gateway/admin/access.py asks of the gate for one Basic-auth request."""
    keeper.gate(auth.ADMIN, host)
    return keeper.password(auth.ADMIN, host, "ops", password, keeper.dummy)


def test_admin_guesses_fill_their_own_budget_and_a_client_login_still_gets_a_check():
    keeper = gate(Clock(), max_failed_logins=1_000_000)
    messaging, admin = Door(backlog=8), Door(backlog=8)
    keeper.verifiers.update({auth.MESSAGING: messaging, auth.ADMIN: admin})
    # Guesses from many addresses, each under its own bounds, until the admin door is full.
    refused = 0
    for i in range(40):
        for _ in range(auth.PENDING_PER_ADDRESS):
            try:
                admin_guess(keeper, f"10.0.0.{i}")
            except VerificationPending as pending:
                refused += not pending.start(lambda: None)
            except AccessDenied:
                pass
    assert len(admin.queued) == 8 and refused > 0  # the admin door says busy past its own backlog
    # A client login meanwhile is queued at once, in its own door, with nothing ahead of it.
    woken = []
    with pytest.raises(VerificationPending) as pending:
        keeper.admit("app", "pw", Transport(host="10.0.0.1"))  # even from an address that is guessing
    assert pending.value.start(lambda: woken.append(1))
    assert len(messaging.queued) == 1 and len(admin.queued) == 8
    messaging.answer_all()
    assert woken == [1] and keeper.admit("app", "pw", Transport(host="10.0.0.1")).name == "app"


def test_client_logins_fill_their_own_budget_and_an_admin_login_still_gets_a_check():
    keeper = gate(Clock())
    messaging, admin = Door(backlog=2), Door(backlog=2)
    keeper.verifiers.update({auth.MESSAGING: messaging, auth.ADMIN: admin})
    for i in range(2):
        with pytest.raises(VerificationPending) as pending:
            keeper.admit("app", f"guess{i}", Transport(host=f"10.0.1.{i}"))
        assert pending.value.start(lambda: None)
    with pytest.raises(VerificationPending) as pending:
        keeper.admit("app", "pw", Transport(host="10.0.1.9"))
    assert pending.value.start(lambda: None) is False  # the messaging door is full: "busy"
    with pytest.raises(VerificationPending) as pending:
        admin_guess(keeper, "10.0.1.0", "s3cret")  # an address whose client logins are in progress
    assert pending.value.start(lambda: None) and len(admin.queued) == 1


def test_checks_in_progress_are_bounded_per_address_and_door():
    keeper = gate(Clock())
    messaging, admin = Door(backlog=100), Door(backlog=100)
    keeper.verifiers.update({auth.MESSAGING: messaging, auth.ADMIN: admin})
    for i in range(auth.PENDING_PER_ADDRESS):
        with pytest.raises(VerificationPending) as pending:
            admin_guess(keeper, "h", f"guess{i}")
        assert pending.value.start(lambda: None)
    with pytest.raises(AccessDenied, match="too many logins in progress from h"):
        admin_guess(keeper, "h")
    # The same address's client login is not held by its admin guesses.
    with pytest.raises(VerificationPending) as pending:
        keeper.admit("app", "pw", Transport(host="h"))
    assert pending.value.start(lambda: None)
    admin.answer_all()
    with pytest.raises(VerificationPending):
        admin_guess(keeper, "h", "yet another")  # room again once answered


def test_a_user_named_like_a_group_does_not_get_the_groups_grants():
    entries = parse_entries(
        [{"destination": "/queue/orders", "write": ["producers", "user:auditor"], "read": ["group:auditor", "clerk"]}],
        groups={"producers", "auditor"},
    )
    orders = names.parse("/queue/orders")
    authorizer = Authorizer(entries)
    assert authorizer.allows(Principal("app", frozenset({"producers"})), "write", orders)
    assert not authorizer.allows(Principal("producers"), "write", orders)  # a user (or a certificate's CN)
    assert authorizer.allows(Principal("auditor"), "write", orders)  # user:auditor names the user ...
    assert not authorizer.allows(Principal("auditor"), "read", orders)  # ... and group:auditor the group
    assert authorizer.allows(Principal("x", frozenset({"auditor"})), "read", orders)
    assert authorizer.allows(Principal("clerk"), "read", orders)  # no group "clerk": the user
    assert not authorizer.allows(Principal("x", frozenset({"clerk"})), "read", orders)


def test_a_user_and_a_group_of_one_name_are_refused_at_start():
    from gateway.auth import AuthSettings

    users = [{"name": "producers", "password_hash": "x"}, {"name": "app", "password_hash": "x", "groups": ["producers"]}]
    with pytest.raises(ValueError, match="'producers' is both a user and a group"):
        AuthSettings(users=users)
    with pytest.raises(ValueError, match="'anonymous' is both a user and a group"):
        AuthSettings(users=[{"name": "anonymous", "password_hash": "x"}])
