"""Broker-wide pools one client could drain (issue 29, item 6): shared
subscription groups, retained messages and delayed wills each have a share
per holder, a logged-in user or, for anonymous clients, a source address
(127.0.0.2 stands for a second client address), and a share group's name has
a length limit.  What is over is refused to that client with its reason code,
while another holder is still served."""

from __future__ import annotations

from gateway.mqtt.codec import packets as p
from gateway.mqtt.codec.reasons import ReasonCode as R
from tests.support.auth_helpers import ACL, USERS
from tests.support.helpers import unique, wait_for
from tests.support.mqtt5_helpers import Paho5, connect5
from tests.support.mqtt_helpers import Paho, RawMqtt

OTHER_ADDRESS = "127.0.0.2"  # loopback, so admitted as the first; another source address to the broker


def _closing(*clients):
    for client in clients:
        client.close()


# -- shared subscription groups ------------------------------------------------


def test_anonymous_clients_share_the_groups_of_their_source_address_and_another_address_is_served(broker_factory,
                                                                                                   raw_client):
    broker = broker_factory(broker={"max_shared_groups_per_user": 3})
    topic = unique("jobs")
    first = Paho5(broker.mqtt_port, unique("a"))
    second = Paho5(broker.mqtt_port, unique("b"))  # same address, another connection
    elsewhere = Paho5(broker.mqtt_port, unique("c"), bind_address=OTHER_ADDRESS)
    try:
        for i in range(3):
            assert first.subscribe(f"$share/g{i}/{topic}", 1) == [1]
        assert first.subscribe(f"$share/g3/{topic}", 1) == [R.QUOTA_EXCEEDED]
        assert second.subscribe(f"$share/g4/{topic}", 1) == [R.QUOTA_EXCEEDED]  # the address's share, not the connection's
        assert second.subscribe(f"$share/g0/{topic}", 1) == [1]  # joining a group someone made takes nothing
        assert elsewhere.subscribe(f"$share/g3/{topic}", 1) == [1]
        # A group that goes gives its maker's share back.
        assert first.unsubscribe(f"$share/g1/{topic}") == [R.SUCCESS]
        assert first.subscribe(f"$share/g5/{topic}", 1) == [1]
        assert first.client.is_connected() and second.client.is_connected()
        # STOMP's shared subscriptions draw on the same share, and are told so.
        stomp = raw_client(broker)
        stomp.connect("1.2")
        stomp.send_frame("SUBSCRIBE", {"destination": f"/topic/{topic}", "id": "1", "receipt": "r",
                                       "shared-subscription-name": "g6"})
        error = stomp.expect_error_and_close()
        assert (error.headers["receipt-id"], error.headers["message"]) == (
            "r", "too many shared subscription groups for anonymous clients from 127.0.0.1 (limit 3)")
    finally:
        _closing(first, second, elsewhere)


def test_a_user_who_may_only_read_plant_cannot_take_the_groups_of_another(broker_factory):
    broker = broker_factory(broker={"max_shared_groups_per_user": 2}, auth={"users": USERS, "acl": ACL})
    reader = Paho5(broker.mqtt_port, unique("r"), username="reader", password="reader-pw")
    late = Paho5(broker.mqtt_port, unique("l"), username="late", password="late-pw")
    try:
        assert [reader.subscribe(f"$share/g{i}/plant/{i}", 0)[0] for i in range(3)] == [0, 0, R.QUOTA_EXCEEDED]
        assert late.subscribe("$share/g9/plant/x", 0) == [0]
    finally:
        _closing(reader, late)


def test_a_share_group_name_past_the_limit_gets_topic_filter_invalid(broker_factory, raw_client):
    broker = broker_factory(broker={"max_shared_group_name_chars": 32})
    topic = unique("names")
    v5 = Paho5(broker.mqtt_port, unique("a"))
    v3 = Paho(broker.mqtt_port, unique("b"))
    try:
        assert v5.subscribe(f"$share/{'g' * 33}/{topic}", 1) == [R.TOPIC_FILTER_INVALID]
        assert v5.subscribe(f"$share/{'g' * 32}/{topic}", 1) == [1]
        assert v3.subscribe((f"$share/{'h' * 40}/{topic}", 1)) == [p.SUBACK_FAILURE]
        assert v5.client.is_connected() and v3.client.is_connected()
    finally:
        _closing(v5, v3)
    stomp = raw_client(broker)
    stomp.connect("1.2")
    stomp.send_frame("SUBSCRIBE", {"destination": f"/topic/{topic}", "id": "1", "receipt": "r",
                                   "shared-subscription-name": "s" * 33})
    error = stomp.expect_error_and_close()
    assert error.headers["receipt-id"] == "r"
    assert "max_shared_group_name_chars" in error.headers["message"]


# -- retained messages --------------------------------------------------------


def test_a_client_past_its_retained_share_is_refused_and_another_address_still_keeps_its_own(broker_factory):
    broker = broker_factory(broker={"max_retained_messages_per_user": 2})
    topic = unique("kept")
    watcher = Paho5(broker.mqtt_port, unique("w"))
    filler = Paho5(broker.mqtt_port, unique("f"))
    legacy = Paho(broker.mqtt_port, unique("l"))  # 3.1.1, same address
    other = Paho5(broker.mqtt_port, unique("o"), bind_address=OTHER_ADDRESS)
    late = None
    try:
        watcher.subscribe(f"{topic}/#", 1)
        assert filler.publish(f"{topic}/a", b"a1", 1, retain=True) == 0
        assert filler.publish(f"{topic}/b", b"b1", 2, retain=True) == 0
        assert filler.publish(f"{topic}/c", b"c1", 1, retain=True) == R.QUOTA_EXCEEDED  # refused whole
        assert filler.publish(f"{topic}/a", b"a2", 1, retain=True) == 0  # replacing its own takes nothing more
        legacy.publish(f"{topic}/d", b"d1", 1, retain=True)  # 3.1.1 cannot be told: routed, not kept
        assert other.publish(f"{topic}/e", b"e1", 1, retain=True) == 0
        watcher.wait(5)
        assert sorted(watcher.payloads) == [b"a1", b"a2", b"b1", b"d1", b"e1"]  # c1 went nowhere
        late = Paho5(broker.mqtt_port, unique("late"))
        late.subscribe(f"{topic}/#", 1)
        late.wait(3)
        assert sorted((m.topic, m.payload) for m in late.messages) == [
            (f"{topic}/a", b"a2"), (f"{topic}/b", b"b1"), (f"{topic}/e", b"e1")]
        # Clearing one gives the share back.
        assert filler.publish(f"{topic}/b", b"", 1, retain=True) == 0
        assert filler.publish(f"{topic}/c", b"c2", 1, retain=True) == 0
    finally:
        _closing(watcher, filler, legacy, other, *([late] if late is not None else []))


# -- delayed wills ------------------------------------------------------------


def _will_client(port: int, topic: str, payload: bytes = b"gone", *, source: str | None = None) -> tuple[RawMqtt, p.ConnAck]:
    raw = RawMqtt(port, source=source)
    will = p.Will(topic, payload, 1, False, p.Properties(will_delay_interval=60))
    ack = connect5(raw, unique("dev"), clean_session=True, will=will, properties=p.Properties(session_expiry_interval=300))
    return raw, ack


def test_delayed_wills_are_bounded_per_source_address_in_count_and_bytes(broker_factory):
    broker = broker_factory(mqtt={"max_delayed_wills_per_user": 2, "max_delayed_will_bytes_per_user": 4000})
    topic = unique("will")
    held = []
    for _ in range(2):
        raw, ack = _will_client(broker.mqtt_port, topic)
        assert ack.return_code == R.SUCCESS
        raw.sock.close()  # no DISCONNECT: the will waits its delay
        held.append(raw)
    wait_for(lambda: _refused(broker.mqtt_port, topic), what="the third delayed will refused once two wait")
    raw, ack = _will_client(broker.mqtt_port, topic, source=OTHER_ADDRESS)
    assert ack.return_code == R.SUCCESS  # another address has its own share
    raw.sock.close()
    big, ack = _will_client(broker.mqtt_port, topic, b"x" * 5000, source=OTHER_ADDRESS)
    assert ack.return_code == R.QUOTA_EXCEEDED  # past the bytes of the share whatever the count
    big.sock.close()


def _refused(port: int, topic: str) -> bool:
    """Whether a CONNECT with a delayed will is refused now; one let in
    leaves with a normal DISCONNECT, which discards its will [MQTT-3.14.4-3],
    so asking holds nothing."""
    raw, ack = _will_client(port, f"{topic}/probe")
    if ack.return_code == R.SUCCESS:
        raw.send(p.Disconnect())
        raw.wait_closed()
    raw.sock.close()
    assert ack.return_code in (R.SUCCESS, R.QUOTA_EXCEEDED), ack
    return ack.return_code == R.QUOTA_EXCEEDED


def test_a_delayed_will_past_the_share_when_its_connection_ends_is_published_at_once(broker_factory):
    broker = broker_factory(mqtt={"max_delayed_wills_per_user": 1})
    topic = unique("will")
    watcher = Paho5(broker.mqtt_port, unique("w"))
    try:
        watcher.subscribe(f"{topic}/#", 1)
        first, ack1 = _will_client(broker.mqtt_port, f"{topic}/first")
        second, ack2 = _will_client(broker.mqtt_port, f"{topic}/second")  # both found room at CONNECT
        assert (ack1.return_code, ack2.return_code) == (R.SUCCESS, R.SUCCESS)
        first.sock.close()
        wait_for(lambda: _refused(broker.mqtt_port, topic), what="the first will held")
        second.sock.close()  # the share is full now: said at once rather than held
        watcher.wait(1)
        assert [(m.topic, m.payload) for m in watcher.messages] == [(f"{topic}/second", b"gone")]
    finally:
        watcher.close()
