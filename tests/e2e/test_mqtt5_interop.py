"""MQTT 5 beside STOMP and MQTT 3.1.1 on one broker: a v5 request answered
by a STOMP client through reply-to and correlation-id, STOMP headers reaching
a v5 subscriber as properties, and v5 and 3.1.1 clients on one topic."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from gateway.mqtt.codec import packets as p
from tests.support.helpers import unique
from tests.support.mqtt5_helpers import Paho5, connect5, props
from tests.support.mqtt_helpers import Paho


def test_v5_request_answered_by_a_stomp_client(broker, stomp_client):
    service = unique("svc")
    replies = f"replies/{unique('c')}"
    server = stomp_client(broker)
    server.subscribe(f"/topic/{service}")
    requester = Paho5(broker.mqtt_port, unique("req"))
    try:
        requester.subscribe(replies, 1)
        requester.publish(service, b"ping", 1, properties=props(ResponseTopic=replies, CorrelationData=b"req-42",
                                                                  UserProperty=[("trace", "t1")]))
        request = server.wait_messages(1)[0]
        assert request.body == b"ping"
        assert request.headers["reply-to"] == f"/topic/{replies.replace('/', '.')}"
        assert request.headers["correlation-id"] == "req-42"
        assert request.headers["trace"] == "t1"
        server.send(request.headers["reply-to"], b"pong", **{"correlation-id": request.headers["correlation-id"]})
        reply = requester.wait(1)[0]
        assert reply.payload == b"pong" and reply.topic == replies
        assert reply.properties.CorrelationData == b"req-42"
    finally:
        requester.close()


def test_stomp_send_headers_arrive_as_v5_properties(broker, stomp_client):
    topic = unique("t")
    subscriber = Paho5(broker.mqtt_port, unique("s"))
    try:
        subscriber.subscribe(topic, 1)
        sender = stomp_client(broker)
        sender.send(f"/topic/{topic}", b"{}", content_type="application/json",
                    **{"order-id": "17", "region": "eu", "reply-to": "/queue/answers"})
        got = subscriber.wait(1)[0]
        assert got.payload == b"{}"
        assert got.properties.ContentType == "application/json"
        user = dict(got.properties.UserProperty)
        assert user["order-id"] == "17" and user["region"] == "eu"
        assert user["reply-to"] == "/queue/answers"  # not a topic: MQTT cannot answer there
        assert not hasattr(got.properties, "ResponseTopic")
        # what the broker sets on a STOMP message is not dressed up as user data
        assert not {"destination", "message-id", "subscription", "content-length"} & set(user)
    finally:
        subscriber.close()


def test_stomp_reply_to_a_topic_is_a_response_topic(broker, stomp_client):
    topic = unique("t")
    subscriber = Paho5(broker.mqtt_port, unique("s"))
    try:
        subscriber.subscribe(topic, 0)
        stomp_client(broker).send(f"/topic/{topic}", b"q", **{"reply-to": "/topic/answers.here"})
        assert subscriber.wait(1)[0].properties.ResponseTopic == "answers/here"
    finally:
        subscriber.close()


def test_v5_user_properties_reach_stomp_as_headers(broker, stomp_client):
    topic = unique("t")
    reader = stomp_client(broker)
    reader.subscribe(f"/topic/{topic}")
    publisher = Paho5(broker.mqtt_port, unique("p"))
    try:
        publisher.publish(topic, b"x", 1, properties=props(UserProperty=[("k", "v")], ContentType="text/plain"))
        got = reader.wait_messages(1)[0]
        assert got.headers["k"] == "v" and got.headers["content-type"] == "text/plain"
    finally:
        publisher.close()


def test_v5_and_3_1_1_clients_on_one_topic(broker):
    topic = unique("mix")
    old = Paho(broker.mqtt_port, unique("old"))
    new = Paho5(broker.mqtt_port, unique("new"))
    try:
        old.subscribe((topic, 1))
        new.subscribe(topic, 1)
        new.publish(topic, b"from v5", 1, properties=props(UserProperty=[("a", "b")], ContentType="text/plain",
                                                           MessageExpiryInterval=60))
        old.publish(topic, b"from 3.1.1", 1)
        assert sorted(old.wait(2) and old.payloads) == [b"from 3.1.1", b"from v5"]
        assert sorted(m.payload for m in new.wait(2)) == [b"from 3.1.1", b"from v5"]
        from_old = next(m for m in new.messages if m.payload == b"from 3.1.1")
        assert not hasattr(from_old.properties, "UserProperty")
    finally:
        old.close()
        new.close()


def test_3_1_1_subscriber_gets_a_v5_publish_with_aliases_and_properties(broker, raw_mqtt):
    topic = unique("mix")
    old = Paho(broker.mqtt_port, unique("old"))
    try:
        old.subscribe((topic, 1))
        pub = raw_mqtt(broker)
        assert connect5(pub, unique("p")).return_code == 0
        pub.send(p.Publish(topic, b"1", 1, packet_id=1, properties=p.Properties(
            topic_alias=1, user_properties=(("a", "1"), ("a", "2")), correlation_data=b"\xff")))
        pub.send(p.Publish("", b"2", 1, packet_id=2, properties=p.Properties(topic_alias=1)))
        assert [(m.topic, m.payload) for m in old.wait(2)] == [(topic, b"1"), (topic, b"2")]
    finally:
        old.close()


@pytest.mark.skipif(shutil.which("mosquitto_pub") is None or shutil.which("mosquitto_sub") is None,
                    reason="mosquitto-clients not installed")
def test_mosquitto_v5_properties_through_a_retained_message(broker):
    topic = unique("mosq5")
    common = ["-h", "127.0.0.1", "-p", str(broker.mqtt_port), "-V", "mqttv5"]
    subprocess.run(["mosquitto_pub", *common, "-q", "1", "-r", "-t", topic, "-m", "hello",
                    "-D", "publish", "user-property", "k", "v", "-D", "publish", "user-property", "k", "w",
                    "-D", "publish", "content-type", "text/x", "-D", "publish", "response-topic", "r/1"],
                   check=True, timeout=10)
    got = subprocess.run(["mosquitto_sub", *common, "-t", topic, "-C", "1", "-W", "10", "-F", "%t|%p|%P|%C|%R|%r"],
                         capture_output=True, check=True, timeout=15)
    assert got.stdout.decode().strip() == f"{topic}|hello|k:v k:w|text/x|r/1|1"
