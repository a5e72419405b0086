"""MQTT 5 subscription options (No Local, Retain As Published, Retain
Handling), Subscription Identifiers on delivery, and shared subscriptions
``$share/{group}/{filter}``, through paho v5 and raw v5 sockets."""

from __future__ import annotations

from gateway.mqtt.codec import packets as p
from gateway.mqtt.codec.reasons import ReasonCode as R
from tests.support.helpers import unique, wait_for
from tests.support.mqtt5_helpers import Paho5, connect5, disconnect_code
from tests.support.mqtt_helpers import Paho


def test_no_local(broker):
    topic = unique("nl")
    client = Paho5(broker.mqtt_port, unique("c"))
    other = Paho5(broker.mqtt_port, unique("o"))
    try:
        client.subscribe(topic, 1, no_local=True)
        client.publish(topic, b"mine", 1)
        other.publish(topic, b"theirs", 1)
        client.wait(1)
        client.publish(topic, b"mine again", 1)
        other.publish(topic, b"theirs again", 1)
        client.wait(2)
        assert client.payloads == [b"theirs", b"theirs again"]
    finally:
        client.close()
        other.close()


def test_retain_as_published(broker):
    topic = unique("rap")
    asis = Paho5(broker.mqtt_port, unique("a"))
    plain = Paho5(broker.mqtt_port, unique("b"))
    pub = Paho5(broker.mqtt_port, unique("p"))
    try:
        asis.subscribe(topic, 1, retain_as_published=True)
        plain.subscribe(topic, 1)
        pub.publish(topic, b"kept", 1, retain=True)
        pub.publish(topic, b"live", 1)
        assert [(m.payload, m.retain) for m in asis.wait(2)] == [(b"kept", True), (b"live", False)]
        assert [(m.payload, m.retain) for m in plain.wait(2)] == [(b"kept", False), (b"live", False)]
    finally:
        for client in (asis, plain, pub):
            client.close()


def test_retain_handling(broker):
    topic = unique("rh")
    pub = Paho5(broker.mqtt_port, unique("p"))
    pub.publish(topic, b"retained", 1, retain=True)
    pub.close()
    clients = {handling: Paho5(broker.mqtt_port, unique(f"h{handling}")) for handling in (0, 1, 2)}
    try:
        for handling, client in clients.items():
            client.subscribe(topic, 1, retain_handling=handling)
            client.subscribe(topic, 1, retain_handling=handling)  # again: no longer new
        barrier = Paho5(broker.mqtt_port, unique("b"))
        barrier.publish(topic, b"live", 1)
        barrier.close()
        for client in clients.values():
            client.wait(1)
            wait_for(lambda client=client: client.payloads[-1:] == [b"live"], what="the live message")
        assert clients[0].payloads == [b"retained", b"retained", b"live"]  # on every subscribe
        assert clients[1].payloads == [b"retained", b"live"]  # only when the subscription is new
        assert clients[2].payloads == [b"live"]  # never
        assert all(m.retain for m in clients[0].messages[:2])
    finally:
        for client in clients.values():
            client.close()


def test_subscription_identifiers_on_delivery(broker):
    base = unique("sid")
    client = Paho5(broker.mqtt_port, unique("c"))
    try:
        client.subscribe(f"{base}/+", 1, identifier=7)
        client.subscribe(f"{base}/a/#", 1, identifier=9)
        client.subscribe(f"{base}/b", 1)
        client.publish(f"{base}/x", b"1", 1)
        client.publish(f"{base}/a/y", b"2", 1)
        client.publish(f"{base}/b", b"3", 1)
        got = {m.payload: getattr(m.properties, "SubscriptionIdentifier", None) for m in client.wait(3)}
        assert got[b"1"] == [7]
        assert got[b"2"] == [9]
        assert client.wait(4) and sorted(m.payload for m in client.messages) == [b"1", b"2", b"3", b"3"]
        ids = sorted(str(getattr(m.properties, "SubscriptionIdentifier", None)) for m in client.messages
                     if m.payload == b"3")
        assert ids == ["None", "[7]"]  # by base/+ and by base/b (none)
    finally:
        client.close()


def test_shared_subscription_gives_each_message_to_one_member(broker):
    topic = unique("jobs")
    members = [Paho5(broker.mqtt_port, unique("m")) for _ in range(2)]
    plain = Paho5(broker.mqtt_port, unique("plain"))
    pub = Paho5(broker.mqtt_port, unique("p"))
    try:
        for member in members:
            assert member.subscribe(f"$share/workers/{topic}", 1) == [1]
        plain.subscribe(topic, 1)
        sent = [b"%d" % i for i in range(10)]
        for body in sent:
            pub.publish(topic, body, 1)
        plain.wait(10)
        wait_for(lambda: sum(len(m.messages) for m in members) == 10, what="10 across the members")
        assert sorted(sum((m.payloads for m in members), [])) == sorted(sent)
        assert all(m.payloads for m in members)
        assert all(m.topic == topic for member in members for m in member.messages)
    finally:
        for client in (*members, plain, pub):
            client.close()


def test_shared_member_leaving_with_unacked_messages_hands_them_on_to_a_3_1_1_member(broker, raw_mqtt):
    topic = unique("jobs")
    leaving = raw_mqtt(broker)
    assert connect5(leaving, unique("l"), properties=p.Properties(receive_maximum=50)).return_code == 0
    leaving.send(p.Subscribe(1, [(f"$share/w/{topic}", 1)]))
    assert isinstance(leaving.next(), p.SubAck)
    pub = Paho5(broker.mqtt_port, unique("p"))
    try:
        for i in range(3):
            pub.publish(topic, b"m%d" % i, 1)
    finally:
        pub.close()
    got = [leaving.next() for _ in range(3)]
    assert all(isinstance(packet, p.Publish) for packet in got)
    staying = Paho(broker.mqtt_port, unique("s"))  # a 3.1.1 member
    try:
        assert staying.subscribe((f"$share/w/{topic}", 1)) == [1]
        leaving.close()  # never acknowledged
        staying.wait(3)
        assert sorted(staying.payloads) == [b"m0", b"m1", b"m2"]
    finally:
        staying.close()


def test_shared_filter_refusals(broker, raw_mqtt):
    client = raw_mqtt(broker)
    assert connect5(client, unique("c")).return_code == 0
    client.send(p.Subscribe(1, [("$share//a", 1), ("$share/g", 1), ("$share/g/a", 1)]))
    ack = client.next()
    assert isinstance(ack, p.SubAck)
    assert ack.return_codes == [R.TOPIC_FILTER_INVALID, R.TOPIC_FILTER_INVALID, 1]
    client.send(p.Subscribe(2, [("$share/g/b", 1 | p.NO_LOCAL)]))
    assert disconnect_code(client) == R.PROTOCOL_ERROR  # [MQTT-3.8.3-4]


def test_shared_group_gets_no_retained_message(broker):
    topic = unique("jobs")
    pub = Paho5(broker.mqtt_port, unique("p"))
    member = Paho5(broker.mqtt_port, unique("m"))
    try:
        pub.publish(topic, b"retained", 1, retain=True)
        member.subscribe(f"$share/g/{topic}", 1)
        pub.publish(topic, b"live", 1)
        member.wait(1)
        wait_for(lambda: member.payloads[-1:] == [b"live"], what="the live message")
        assert member.payloads == [b"live"]
    finally:
        pub.close()
        member.close()


def test_a_kept_session_keeps_its_subscription_options_and_identifier(broker, raw_mqtt):
    topic = unique("kept")
    client_id = unique("c")
    kept = p.Properties(session_expiry_interval=300)
    first = raw_mqtt(broker)
    assert connect5(first, client_id, properties=kept).return_code == 0
    first.send(p.Subscribe(1, [(topic, 1 | p.NO_LOCAL)], properties=p.Properties(subscription_identifiers=(5,))))
    assert isinstance(first.next(), p.SubAck)
    first.send(p.Disconnect())
    first.wait_closed()
    pub = Paho5(broker.mqtt_port, unique("p"))
    try:
        pub.publish(topic, b"while away", 1)
    finally:
        pub.close()
    back = raw_mqtt(broker)
    assert connect5(back, client_id, clean_session=False, properties=kept).session_present
    got = back.next()
    assert isinstance(got, p.Publish) and got.payload == b"while away"
    assert got.properties is not None and got.properties.subscription_identifiers == (5,)
    back.send(p.PubAck(got.packet_id))  # type: ignore[arg-type]
    back.send(p.Publish(topic, b"own", 1, packet_id=9))  # No Local kept too
    assert back.next() == p.PubAck(9)
    back.pump(0.3)
    assert back.packets == []
