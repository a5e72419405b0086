"""Users for STOMP and MQTT clients: anonymous access ends once a user is
defined (unless turned back on), wrong credentials are refused the way each
protocol refuses them."""

from __future__ import annotations

import pytest

from gateway.auth import hash_password
from gateway.mqtt.codec import packets as p
from tests.support.helpers import RawClient, encode_frame, wait_for

USERS = [{"name": "app", "password_hash": hash_password("s3cret", iterations=1000)}]


@pytest.fixture
def secured(broker_factory):
    return broker_factory(auth={"users": USERS})


def stomp_connect(broker, **headers):
    client = RawClient(broker.stomp_address)
    client.send_frame("CONNECT", {"accept-version": "1.2", "host": "h", **headers})
    frame = client.next_frame()
    client.close()
    return frame


@pytest.mark.parametrize(
    ("headers", "command"),
    [({}, "ERROR"), ({"login": "app", "passcode": "wrong"}, "ERROR"), ({"login": "nobody", "passcode": "s3cret"}, "ERROR"),
     ({"login": "app", "passcode": "s3cret"}, "CONNECTED")],
    ids=["anonymous", "wrong-password", "unknown-user", "right"],
)
def test_stomp_connect_needs_a_user_once_one_is_defined(secured, headers, command):
    frame = stomp_connect(secured, **headers)
    assert frame.command == command
    if command == "ERROR":
        assert "authentication failed" in frame.headers["message"]


@pytest.mark.parametrize(
    ("username", "password", "code"),
    [(None, None, p.NOT_AUTHORIZED), ("app", b"wrong", p.BAD_USERNAME_OR_PASSWORD), ("app", b"s3cret", p.ACCEPTED)],
    ids=["anonymous", "wrong-password", "right"],
)
def test_mqtt_connect_needs_a_user_once_one_is_defined(secured, raw_mqtt, username, password, code):
    raw = raw_mqtt(secured)
    raw.send(p.Connect("device", username=username, password=password))
    assert raw.next() == p.ConnAck(False, code)
    if code:
        raw.wait_closed()


def test_anonymous_access_can_be_turned_back_on_beside_users(broker_factory):
    broker = broker_factory(auth={"users": USERS, "anonymous": "true"})
    assert stomp_connect(broker).command == "CONNECTED"
    assert stomp_connect(broker, login="app", passcode="wrong").command == "ERROR"


def test_without_users_anyone_connects(broker):
    assert stomp_connect(broker).command == "CONNECTED"


SLOW = [{"name": "slow", "password_hash": hash_password("pw", iterations=3_000_000)}]  # a few hundred ms


def test_a_password_check_does_not_stall_other_clients(broker_factory, raw_client, stomp_client):
    broker = broker_factory(auth={"users": SLOW, "anonymous": "true"})
    other = stomp_client(broker)
    waiting = raw_client(broker)
    # CONNECT and, pipelined behind it in the same write, a SUBSCRIBE and a SEND:
    # they must wait for the login and then run in order.
    waiting.send(
        encode_frame("CONNECT", {"accept-version": "1.2", "host": "h", "login": "slow", "passcode": "pw"})
        + encode_frame("SUBSCRIBE", {"destination": "/queue/after-login", "id": "0"})
        + encode_frame("SEND", {"destination": "/queue/after-login"}, b"pipelined")
    )
    connections = broker.running.server.connections
    wait_for(lambda: broker.call(lambda: any(c.session.skeleton.deferred for c in connections.values())),
             what="the CONNECT waiting for its password check")
    other.send("/queue/meanwhile", b"x")  # a round trip while the hash is computed ...
    assert waiting.quiet_for(0.01) == []  # ... finished before the login was answered
    assert waiting.expect("CONNECTED", timeout=30).headers["version"] == "1.2"
    assert waiting.expect("MESSAGE").body == b"pipelined"


def test_a_wrong_password_checked_off_the_loop_is_still_refused_and_counted(broker_factory, raw_mqtt):
    broker = broker_factory(auth={"users": SLOW, "max_failed_logins": 1})
    assert stomp_connect(broker, login="slow", passcode="wrong").headers["message"] == "authentication failed"
    raw = raw_mqtt(broker)
    raw.send(p.Connect("device", username="slow", password=b"pw"))
    assert raw.next() == p.ConnAck(False, p.NOT_AUTHORIZED)  # locked out: even the right one, unchecked


# -- no user enumeration by timing: an unknown user costs the same hash -------------


@pytest.fixture
def pbkdf2_runs(monkeypatch):
    """Every PBKDF2 run in this process, as its iteration count (the broker runs in a thread here)."""
    import hashlib

    runs = []
    real = hashlib.pbkdf2_hmac

    def counted(name, password, salt, iterations, *args):
        runs.append(iterations)
        return real(name, password, salt, iterations, *args)

    monkeypatch.setattr(hashlib, "pbkdf2_hmac", counted)
    return runs


def test_an_unknown_user_is_refused_after_the_same_hash_as_a_known_one(broker_factory, raw_mqtt, pbkdf2_runs):
    import base64
    import http.client

    admins = [{"name": "ops", "password_hash": hash_password("ops-pw", iterations=1500), "role": "read"}]
    broker = broker_factory(auth={"users": USERS, "max_failed_logins": 100}, admin={"users": admins})
    per_door = {}
    for who in ("app", "nobody"):
        del pbkdf2_runs[:]
        assert "authentication failed" in stomp_connect(broker, login=who, passcode=f"{who}-guess").headers["message"]
        raw = raw_mqtt(broker)
        raw.send(p.Connect(f"d-{who}", username=who, password=b"guess"))
        assert raw.next().return_code != p.ACCEPTED
        connection = http.client.HTTPConnection("127.0.0.1", broker.admin_port, timeout=5)
        token = base64.b64encode(f"{who.replace('app', 'ops')}:guess".encode()).decode()
        connection.request("GET", "/metrics", headers={"Authorization": "Basic " + token})
        assert connection.getresponse().status == 401
        connection.close()
        per_door[who] = list(pbkdf2_runs)
    # Same number of runs with the same parameters: STOMP and MQTT at the users'
    # 1000 iterations, the admin API at its users' 1500.
    assert per_door["app"] == per_door["nobody"] == [1000, 1000, 1500]


# -- admin guessing and client logins: separate password budgets ---------------------


class AdminGuessFlood:
    """Wrong admin Basic-auth requests, a new password each (no answer is
    cached), from many source addresses (127.0.0.2 ...), each address keeping
    ``per_address`` requests in flight (under the per-address bounds), in a
    Trio loop of their own on a thread; answers by status."""

    def __init__(self, port: int, addresses: list[str], per_address: int) -> None:
        import itertools
        import threading

        import trio

        self.port, self.addresses, self.per_address = port, addresses, per_address
        self.guesses = itertools.count()
        self.sent = 0  # first requests sent, one per task
        self.answers: list[int | str] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True, name="admin-flood")

    def __enter__(self) -> AdminGuessFlood:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the flood did not stop"

    async def _main(self) -> None:
        import trio

        async with trio.open_nursery() as nursery:
            for address in self.addresses:
                for _ in range(self.per_address):
                    nursery.start_soon(self._guess, address)
            while not self.stopping.is_set():
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()

    async def _guess(self, address: str) -> None:
        import base64

        import trio

        first = True
        while True:
            token = base64.b64encode(f"ops:guess-{next(self.guesses)}".encode()).decode()
            request = (f"GET /api/v1/destinations HTTP/1.1\r\nHost: gateway\r\nAuthorization: Basic {token}\r\n"
                       "Connection: close\r\n\r\n").encode()
            answer: int | str = "refused"
            sock = trio.socket.socket()
            with sock:
                try:
                    await sock.bind((address, 0))
                    await sock.connect(("127.0.0.1", self.port))
                    await sock.send(request)
                    if first:
                        self.sent += 1
                        first = False
                    head = b""
                    while b"\r\n" not in head:
                        data = await sock.recv(4096)
                        if not data:
                            break
                        head += data
                    if head.startswith(b"HTTP/1.1 "):
                        answer = int(head.split(b" ", 2)[1])
                except OSError:
                    pass
            self.answers.append(answer)
            if answer != 401:  # "busy", locked out or refused: again soon, without spinning
                await trio.sleep(0.25)


def test_a_flood_of_wrong_admin_passwords_does_not_delay_a_client_login(broker_factory):
    # Costly admin hashes and a lockout too lenient to help: every guess costs a
    # PBKDF2 run, from 79 addresses, each under every per-address bound.
    admins = [{"name": "ops", "password_hash": hash_password("right", iterations=2_000_000), "role": "read"}]
    broker = broker_factory(auth={"users": USERS, "max_failed_logins": 1_000_000}, admin={"users": admins})
    addresses = [f"127.0.0.{i}" for i in range(2, 81)]
    with AdminGuessFlood(broker.admin_port, addresses, per_address=3) as flood:
        wait_for(lambda: flood.sent == len(addresses) * 3 and 401 in flood.answers, timeout=60,
                 what="every guessing connection's request sent, and guesses being checked (a first 401)")
        before = len(flood.answers)
        client = RawClient(broker.stomp_address, timeout=30)  # generous: the login's own hash takes milliseconds
        try:
            client.send_frame("CONNECT", {"accept-version": "1.2", "host": "h", "login": "app", "passcode": "s3cret"})
            reply = client.next_frame()
        finally:
            client.close()
        assert reply.command == "CONNECTED", reply.headers.get("message")
        wait_for(lambda: len(flood.answers) > before, timeout=60, what="the flood still being answered after the login")
    assert set(flood.answers) <= {401, 429, 503, "refused"}


@pytest.fixture
def held_checks(monkeypatch):
    """Password checks that finish only when the test says so (the broker runs
    in this process): a check stuck behind a loaded machine, without the load."""
    import threading

    from gateway import auth

    release = threading.Event()
    real = auth.verify_password

    def held(passcode, stored):
        release.wait(60)
        return real(passcode, stored)

    monkeypatch.setattr(auth, "verify_password", held)
    yield release
    release.set()


def _connect_waiting(broker):
    connections = broker.running.server.connections
    wait_for(lambda: broker.call(lambda: any(c.session.skeleton.deferred for c in connections.values())),
             what="the CONNECT waiting for its password check")


def test_a_stomp_connect_waiting_for_its_password_check_is_not_timed_out(broker_factory, raw_client, held_checks):
    import time

    broker = broker_factory(auth={"users": USERS}, stomp={"connect_timeout_s": 0.2})
    client = raw_client(broker)
    client.send_frame("CONNECT", {"accept-version": "1.2", "host": "h", "login": "app", "passcode": "s3cret"})
    _connect_waiting(broker)
    time.sleep(0.5)  # well past the connect timeout, the check still running
    assert client.quiet_for(0.01) == []
    held_checks.set()
    assert client.expect("CONNECTED", timeout=30).headers["version"] == "1.2"


def test_an_mqtt_connect_waiting_for_its_password_check_is_not_timed_out(broker_factory, raw_mqtt, held_checks):
    import time

    broker = broker_factory(auth={"users": USERS}, mqtt={"connect_timeout_s": 0.2})
    raw = raw_mqtt(broker)
    raw.send(p.Connect("device", username="app", password=b"s3cret"))
    _connect_waiting(broker)
    time.sleep(0.5)  # well past the connect timeout, the check still running
    held_checks.set()
    assert raw.next() == p.ConnAck(False, p.ACCEPTED)
