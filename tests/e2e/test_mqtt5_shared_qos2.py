"""MQTT 5 §4.8.2: a QoS 2 message a shared subscription group sent to a member
that has not answered it with PUBREC is that member's alone.  Its connection
breaking does not hand the message to another member: the member gets it again,
DUP and under the same packet id, when it reconnects [MQTT-4.8.2-4], across a
broker restart too; if its session ends first, nobody gets it [MQTT-4.8.2-5].
A QoS 1 message it left unacknowledged goes on to another member, as before.

The leaving member is a raw v5 socket (it must be able not to answer); the
other member is paho v5.  "Not given to the other member" is shown by order,
not by waiting: a marker published after the member left reaches the other
member, and anything the group had handed back would have been ahead of it."""

from __future__ import annotations

from gateway.mqtt.codec import packets as p
from tests.support.helpers import unique
from tests.support.mqtt5_helpers import Paho5, connect5

KEPT = p.Properties(session_expiry_interval=300)


def hold_one_of_each(broker, raw_mqtt, topic: str, client_id: str, properties: p.Properties | None):
    """A member (raw v5) joins ``$share/w/{topic}`` at QoS 2 and is sent one
    QoS 2 and one QoS 1 message, answering neither.  Returns its socket and
    the QoS 2 PUBLISH."""
    leaving = raw_mqtt(broker)
    ack = connect5(leaving, client_id, clean_session=properties is None, properties=properties)
    assert ack.return_code == 0
    leaving.send(p.Subscribe(1, [(f"$share/w/{topic}", 2)]))
    assert isinstance(leaving.next(), p.SubAck)
    pub = Paho5(broker.mqtt_port, unique("p"))
    try:
        assert pub.publish(topic, b"exactly-once", 2) == 0
        assert pub.publish(topic, b"at-least-once", 1) == 0
    finally:
        pub.close()
    got = {packet.payload: packet for packet in (leaving.next(), leaving.next())}
    assert got[b"exactly-once"].qos == 2 and got[b"at-least-once"].qos == 1
    return leaving, got[b"exactly-once"]


def member(broker, topic: str) -> Paho5:
    staying = Paho5(broker.mqtt_port, unique("s"))
    assert staying.subscribe(f"$share/w/{topic}", 2) == [2]
    return staying


def up_to_a_marker(broker, staying: Paho5, topic: str) -> list[bytes]:
    """What ``staying`` has received once a marker published now reaches it."""
    publisher = Paho5(broker.mqtt_port, unique("p"))
    try:
        publisher.publish(topic, b"marker", 1)
    finally:
        publisher.close()
    staying.wait(2)
    return staying.payloads


def test_an_unanswered_qos2_message_waits_for_its_member_and_comes_again_with_its_packet_id(broker, raw_mqtt):
    topic = unique("jobs")
    client_id = unique("l")
    leaving, sent = hold_one_of_each(broker, raw_mqtt, topic, client_id, KEPT)
    staying = member(broker, topic)
    try:
        leaving.sock.close()  # no PUBREC, no PUBACK, no DISCONNECT
        assert up_to_a_marker(broker, staying, topic) == [b"at-least-once", b"marker"]
    finally:
        staying.close()

    back = raw_mqtt(broker)
    ack = connect5(back, client_id, clean_session=False, properties=KEPT)
    assert ack.return_code == 0 and ack.session_present
    again = back.next()
    assert isinstance(again, p.Publish) and again.payload == b"exactly-once"
    assert again.dup and again.qos == 2 and again.packet_id == sent.packet_id  # [MQTT-4.4.0-1]
    back.send(p.PubRec(again.packet_id))
    assert back.next() == p.PubRel(again.packet_id)
    back.send(p.PubComp(again.packet_id))
    back.send(p.Disconnect())


def test_an_unanswered_qos2_message_goes_to_nobody_when_its_members_session_ends(broker, raw_mqtt):
    topic = unique("jobs")
    client_id = unique("l")
    leaving, _ = hold_one_of_each(broker, raw_mqtt, topic, client_id, None)  # Clean Start, expiry 0
    staying = member(broker, topic)
    try:
        leaving.sock.close()
        assert up_to_a_marker(broker, staying, topic) == [b"at-least-once", b"marker"]
    finally:
        staying.close()


def test_a_reservation_holds_across_a_restart(broker_factory, raw_mqtt):
    broker = broker_factory()
    topic = unique("jobs")
    client_id = unique("l")
    leaving, _ = hold_one_of_each(broker, raw_mqtt, topic, client_id, KEPT)
    leaving.sock.close()
    broker.stop()

    broker = broker_factory()  # the same data folder
    staying = member(broker, topic)
    try:
        assert up_to_a_marker(broker, staying, topic) == [b"at-least-once", b"marker"]
    finally:
        staying.close()
    back = raw_mqtt(broker)
    assert connect5(back, client_id, clean_session=False, properties=KEPT).session_present
    again = back.next()
    assert isinstance(again, p.Publish) and again.payload == b"exactly-once" and again.dup and again.qos == 2
    back.send(p.PubRec(again.packet_id))
    assert back.next() == p.PubRel(again.packet_id)
