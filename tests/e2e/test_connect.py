"""Connecting: CONNECT and STOMP frames, version and heart-beat negotiation,
heart-beat deadlines with grace, the login timeout and frames before CONNECT.

The broker fixtures use fast settings (conftest.FAST_STOMP): the broker offers
heart-beats of 50 ms each way and a 2 s login timeout.
"""

from __future__ import annotations

import time

import pytest

from tests.support.helpers import unique, wait_for


@pytest.mark.parametrize("command", ["CONNECT", "STOMP"])
def test_connect_and_stomp_frames_both_open_a_session(broker, raw_client, command):
    raw = raw_client(broker)
    connected = raw.connect("1.2", command=command)
    assert connected.headers["version"] == "1.2"
    assert connected.headers["session"]
    assert connected.headers["server"].startswith("gateway/")
    # The session works: a receipted SEND is confirmed.
    raw.send_frame("SEND", {"destination": "/queue/c", "receipt": "r1"}, b"x")
    raw.receipt("r1")


def test_eols_stray_nuls_and_a_blank_connect_body_are_accepted(broker, raw_client):
    # What hand-written and older clients send, and RabbitMQ takes: EOLs and a
    # NUL between frames, and a CONNECT whose body is a lone newline.
    raw = raw_client(broker)
    queue = f"/queue/{unique('lenient')}"
    raw.send(b"\r\n\n\x00CONNECT\naccept-version:1.2\nhost:localhost\n\n\n\x00\x00\n")
    assert raw.expect("CONNECTED").headers["version"] == "1.2"
    raw.codec.set_version("1.2")
    raw.send(b"SUBSCRIBE\nid:1\ndestination:" + queue.encode() + b"\nreceipt:s\n\n\r\n\x00\x00\r\n\x00")
    raw.receipt("s")
    raw.send(b"SEND\ndestination:" + queue.encode() + b"\n\nhello\x00\x00\n\x00")
    assert raw.expect("MESSAGE").body == b"hello"
    assert raw.quiet_for(0.2) == [] and not raw.eof  # no ERROR, still open


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_stomp_py_each_version_gets_the_version_it_asked_for(broker, stomp_client, version):
    client = stomp_client(broker, version)
    assert client.rec.connected.headers["version"] == version
    queue = f"/queue/{unique('v')}"
    client.subscribe(queue, "s1")
    client.send(queue, b"hello " + version.encode())
    assert client.wait_messages(1)[0].body == b"hello " + version.encode()


def test_stomp_py_connect_command_instead_of_stomp(broker, stomp_client):
    client = stomp_client(broker, connect=False)
    client.conn.connect(wait=True, with_connect_command=True)
    assert client.rec.connected.headers["version"] == "1.2"


def test_no_accept_version_means_stomp_1_0(broker, raw_client):
    raw = raw_client(broker)
    connected = raw.connect(version=None)
    assert connected.headers["version"] == "1.0"
    # 1.0 has no header escaping: a colon in a value travels as is, and a
    # backslash is an ordinary character rather than an escape.
    raw.send_frame("SUBSCRIBE", {"destination": "/queue/v10", "receipt": "s"})  # no id: 1.0 allows it
    raw.receipt("s")
    raw.send_frame("SEND", [("destination", "/queue/v10"), ("x-note", "a:b\\tc")], b"body")
    message = raw.expect("MESSAGE")
    assert message.headers["x-note"] == "a:b\\tc"
    assert message.body == b"body"


@pytest.mark.parametrize(
    ("offered", "chosen"),
    [("1.0,1.1,1.2", "1.2"), ("1.1,2.0", "1.1"), ("1.0", "1.0"), ("2.1, 1.1 ,1.0", "1.1")],
)
def test_highest_common_version_is_chosen(broker, raw_client, offered, chosen):
    assert raw_client(broker).connect(offered).headers["version"] == chosen


def test_unsupported_versions_get_error_naming_supported_ones(broker, raw_client):
    raw = raw_client(broker)
    raw.send_frame("CONNECT", {"accept-version": "2.0,3.1", "host": "h", "receipt": "c1"})
    error = raw.expect_error_and_close()
    versions = error.headers["version"].split(",")
    assert sorted(versions) == ["1.0", "1.1", "1.2"]
    assert error.headers.get("receipt-id") == "c1"


def test_stomp_frame_with_unsupported_version_fails(broker, raw_client):
    raw = raw_client(broker)
    raw.send_frame("STOMP", {"accept-version": "1.3", "host": "h"})
    error = raw.expect_error_and_close()
    assert "1.2" in error.headers["version"]


# -- heart-beats -----------------------------------------------------------


def test_connected_reports_the_brokers_heartbeat_offer(broker, stomp_client):
    client = stomp_client(broker, heartbeats=(0, 0))
    # FAST_STOMP: the broker can send every 50 ms and wants to hear every 50 ms.
    assert client.rec.connected.headers["heart-beat"] == "50,50"


def test_connected_heartbeat_follows_configuration(broker_factory, raw_client):
    broker = broker_factory(stomp={"heartbeat_send_ms": 0, "heartbeat_receive_ms": 750})
    raw = raw_client(broker)
    assert raw.connect(heart_beat="0,100").headers["heart-beat"] == "0,750"
    # The broker said it will not send heart-beats: none arrive although the client asked.
    assert raw.quiet_for(0.35) == []
    assert raw.heartbeats == []


def heartbeats(raw, n: int) -> list[float]:
    """Wait (until a deadline, not for a fixed window) for ``n`` heart-beats."""
    deadline = time.monotonic() + 5
    while len(raw.heartbeats) < n:
        assert time.monotonic() < deadline, f"only {len(raw.heartbeats)} of {n} heart-beats"
        assert raw.quiet_for(0.05) == []  # nothing but heart-beats
    return list(raw.heartbeats)


def never_faster_than(beats: list[float], start: float, interval: float) -> None:
    """Beats sent at least ``interval`` apart, after ``start``, cannot number
    more than this however late any of them is received; a slow machine only
    makes fewer.  (The exact rate is proven on a mock clock in test_server.py.)"""
    assert len(beats) <= (beats[-1] - start) / (interval * 0.9) + 1, (beats, start)


def test_broker_sends_heartbeats_at_the_agreed_rate(broker, raw_client):
    raw = raw_client(broker)
    # The client wants one every 100 ms; the broker can do 50: agreed max(50, 100).
    start = time.monotonic()
    raw.connect(heart_beat="0,100")
    beats = heartbeats(raw, 5)
    never_faster_than(beats, start, 0.1)


def test_broker_does_not_beat_faster_than_it_offered(broker, raw_client):
    raw = raw_client(broker)
    # The client would like 10 ms; the broker only offers 50 ms.
    start = time.monotonic()
    raw.connect(heart_beat="0,10")
    never_faster_than(heartbeats(raw, 6), start, 0.05)


def test_no_heartbeats_when_the_client_wants_none(broker, raw_client):
    raw = raw_client(broker)
    raw.connect(heart_beat="0,0")
    # At the broker's 50 ms rate this window would hold several.
    assert raw.quiet_for(0.3) == []
    assert raw.heartbeats == []


def test_stomp_py_idle_heartbeating_client_stays_connected(broker, stomp_client):
    # Both sides beat every 100 ms; stomp.py drops the connection itself if
    # the broker's beats stop, and the broker drops stomp.py if its stop.
    client = stomp_client(broker, heartbeats=(100, 100))
    time.sleep(0.8)  # idle: only heart-beats cross the connection
    assert client.conn.is_connected()
    assert client.rec.errors == []
    assert not client.rec.disconnected.is_set()
    queue = f"/queue/{unique('hb')}"
    client.subscribe(queue)
    client.send(queue, b"still here")
    assert client.wait_messages(1)[0].body == b"still here"


def test_silent_client_is_dropped_after_interval_times_grace(broker, raw_client, stomp_client):
    raw = raw_client(broker)
    healthy = stomp_client(broker)
    # The client promises a beat every 100 ms (the broker wants 50: agreed 100),
    # so with the default grace of 2 it may be silent for 200 ms.
    sent_at = time.monotonic()
    raw.connect(heart_beat="100,0")
    error = raw.expect_error_and_close(timeout=3)
    elapsed = time.monotonic() - sent_at
    assert "heart-beat" in error.headers["message"]
    assert elapsed >= 0.19, elapsed  # not before interval x grace (exactly: test_server.py)
    # Other connections are untouched.
    healthy.barrier()


def test_broker_expects_beats_no_faster_than_it_asked(broker, raw_client):
    raw = raw_client(broker)
    # The client offers 20 ms but the broker only wants 50: agreed 50, grace 2.
    sent_at = time.monotonic()
    raw.connect(heart_beat="20,0")
    error = raw.expect_error_and_close(timeout=3)
    assert "heart-beat" in error.headers["message"]
    assert time.monotonic() - sent_at >= 0.095


def test_broker_that_wants_no_beats_keeps_a_silent_client(broker_factory, raw_client):
    broker = broker_factory(stomp={"heartbeat_receive_ms": 0})
    raw = raw_client(broker)
    assert raw.connect(heart_beat="100,0").headers["heart-beat"] == "50,0"
    assert raw.quiet_for(0.5) == []  # silent for 5 of the client's intervals
    raw.send_frame("SEND", {"destination": "/queue/quiet", "receipt": "r"}, b"x")
    raw.receipt("r")


@pytest.mark.parametrize("value", ["fast", "1,2,3", "-1,0", "10"])
def test_invalid_heartbeat_header_is_an_error(broker, raw_client, value):
    raw = raw_client(broker)
    raw.send_frame("CONNECT", {"accept-version": "1.2", "host": "h", "heart-beat": value})
    error = raw.expect_error_and_close()
    assert "heart-beat" in error.headers["message"]


def test_client_a_little_late_within_grace_is_kept(broker, raw_client):
    raw = raw_client(broker)
    # Agreed 200 ms; grace 2 allows 400 ms of silence.  Beat every 300 ms.
    raw.connect(heart_beat="200,0")
    for _ in range(4):
        assert raw.quiet_for(0.3) == []
        raw.send(b"\n")
    assert not raw.eof
    raw.send_frame("SEND", {"destination": "/queue/late", "receipt": "alive"}, b"x")
    raw.receipt("alive")


def test_strict_grace_drops_a_client_that_is_a_little_late(broker_factory, raw_client):
    broker = broker_factory(stomp={"heartbeat_grace": 1.0})
    raw = raw_client(broker)
    started = time.monotonic()
    raw.connect(heart_beat="200,0")
    # The same client as above, beating every 300 ms: with no grace the first
    # late beat is fatal.  (That it comes at 200 ms, not 400, is proven on a
    # mock clock in test_server.py; here, that it comes, and not too early.)
    error = raw.expect_error_and_close(timeout=3)
    assert "heart-beat" in error.headers["message"]
    assert time.monotonic() - started >= 0.19


def test_stomp_py_receives_heartbeats(broker, stomp_client):
    client = stomp_client(broker, heartbeats=(0, 100))
    beats = []
    client.rec.on_heartbeat = lambda: beats.append(time.monotonic())
    wait_for(lambda: len(beats) >= 3, timeout=2, what="three heart-beats")


# -- login timeout and frames before CONNECT ---------------------------------


def test_socket_that_never_connects_is_closed_after_login_timeout(broker_factory, raw_client):
    broker = broker_factory(stomp={"connect_timeout_s": 0.3})
    raw = raw_client(broker)
    started = time.monotonic()
    error = raw.expect_error_and_close(timeout=3)
    elapsed = time.monotonic() - started
    assert "CONNECT" in error.headers["message"]
    assert elapsed >= 0.29, elapsed  # not before the timeout (exactly: test_server.py)
    raw.close()
    wait_for(lambda: broker.call(lambda: len(broker.running.server.connections)) == 0, what="connection released")


def test_half_sent_connect_does_not_extend_the_login_timeout(broker_factory, raw_client):
    broker = broker_factory(stomp={"connect_timeout_s": 0.3})
    raw = raw_client(broker)
    raw.send(b"CONNECT\naccept-version:1.2\nhost:")
    # A slow client trickling a byte every 100 ms, well within the 300 ms
    # timeout: were each byte to restart it, the broker would never close.
    deadline = time.monotonic() + 5
    while not raw.eof:
        assert time.monotonic() < deadline, "trickled bytes kept extending the login timeout"
        try:
            raw.send(b"h")
        except OSError:  # closed between two reads
            break
        raw.pump(0.1)
    got = raw.wait_closed()
    assert got and got[0].command == "ERROR" and "CONNECT" in got[0].headers["message"], got


def test_connecting_in_time_is_not_affected_by_login_timeout(broker_factory, raw_client):
    broker = broker_factory(stomp={"connect_timeout_s": 0.3})
    raw = raw_client(broker)
    raw.connect(heart_beat="0,0")
    assert raw.quiet_for(0.5) == []
    raw.send_frame("SEND", {"destination": "/queue/x", "receipt": "r"})
    raw.receipt("r")


@pytest.mark.parametrize("command", ["SEND", "SUBSCRIBE", "BEGIN", "DISCONNECT"])
def test_frames_before_connect_get_error(broker, raw_client, command):
    raw = raw_client(broker)
    raw.send_frame(command, {"destination": "/queue/early", "transaction": "t", "id": "1", "receipt": "early"}, b"")
    error = raw.expect_error_and_close()
    assert "CONNECT" in error.headers["message"]
    assert error.headers.get("receipt-id") == "early"
    assert broker.call(lambda: broker.running.broker.queues) == {}


def test_second_connect_is_an_error(broker, raw_client):
    raw = raw_client(broker)
    raw.connect()
    raw.send_frame("CONNECT", {"accept-version": "1.2", "host": "h"})
    raw.expect_error_and_close()
