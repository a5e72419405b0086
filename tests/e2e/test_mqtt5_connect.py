"""MQTT 5 CONNECT through real clients: what the CONNACK announces, the
client id the broker makes up, Server Keep Alive, and the v5 refusal codes
(with a Reason String only for a client that asks for problem information)."""

from __future__ import annotations

from paho.mqtt.packettypes import PacketTypes

from gateway.mqtt.codec import packets as p
from gateway.mqtt.codec.reasons import ReasonCode as R
from tests.support.auth_helpers import ACL, USERS
from tests.support.helpers import unique
from tests.support.mqtt5_helpers import Paho5, connect5, props


def test_connack_announces_the_limits(broker_factory):
    broker = broker_factory(mqtt={"receive_maximum": 7, "topic_alias_maximum": 5, "max_packet_bytes": 100_000})
    client = Paho5(broker.mqtt_port, unique("c"))
    try:
        present, code, announced = client.connack
        assert (present, code) == (False, 0)
        assert announced.ReceiveMaximum == 7
        assert announced.MaximumPacketSize == 100_004  # the whole packet: 100,000 after its fixed header
        assert announced.TopicAliasMaximum == 5
        assert announced.RetainAvailable == 1
        assert announced.WildcardSubscriptionAvailable == 1
        assert announced.SubscriptionIdentifierAvailable == 1
        assert announced.SharedSubscriptionAvailable == 1
        assert not hasattr(announced, "AssignedClientIdentifier")
        assert not hasattr(announced, "ServerKeepAlive")
    finally:
        client.close()


def test_an_empty_client_id_is_given_one_with_clean_start_or_without(broker_factory, raw_mqtt):
    broker = broker_factory()
    seen = set()
    for clean in (True, False):
        ack = connect5(raw_mqtt(broker), "", clean_session=clean)
        assert ack.return_code == 0
        assert ack.properties is not None and ack.properties.assigned_client_identifier
        seen.add(ack.properties.assigned_client_identifier)
    assert len(seen) == 2
    # paho takes the assigned id too
    client = Paho5(broker.mqtt_port, "")
    try:
        assert client.connack[2].AssignedClientIdentifier.startswith("gw-")
        assert client.subscribe("t/assigned") == [1]
    finally:
        client.close()


def test_server_keep_alive_when_the_broker_caps_it(broker_factory, raw_mqtt):
    broker = broker_factory(mqtt={"max_keep_alive_s": 20})
    for asked, told in ((0, 20), (600, 20)):
        ack = connect5(raw_mqtt(broker), unique("k"), keep_alive=asked)
        assert ack.properties is not None and ack.properties.server_keep_alive == told
    ack = connect5(raw_mqtt(broker), unique("k"), keep_alive=10)
    assert ack.properties is not None and ack.properties.server_keep_alive is None  # as asked


def test_session_expiry_capped_is_announced(broker_factory, raw_mqtt):
    broker = broker_factory(mqtt={"max_session_expiry_s": 60})
    ack = connect5(raw_mqtt(broker), unique("s"), properties=p.Properties(session_expiry_interval=3600))
    assert ack.properties is not None and ack.properties.session_expiry_interval == 60


def test_refusals_carry_v5_codes(broker_factory, raw_mqtt):
    broker = broker_factory(auth={"users": USERS, "acl": ACL})
    ack = connect5(raw_mqtt(broker), unique("a"), username="app", password=b"wrong")
    assert ack.return_code == R.BAD_USER_NAME_OR_PASSWORD
    assert ack.properties is not None and ack.properties.reason_string  # asked by default
    ack = connect5(raw_mqtt(broker), unique("a"))  # no login on a secured broker
    assert ack.return_code == R.NOT_AUTHORIZED
    ack = connect5(raw_mqtt(broker), unique("a"), username="app", password=b"app-pw",
                   properties=p.Properties(authentication_method="SCRAM-SHA-1"))
    assert ack.return_code == R.BAD_AUTHENTICATION_METHOD


def test_refusal_without_reason_string_when_the_client_does_not_want_one(broker_factory, raw_mqtt):
    broker = broker_factory(auth={"users": USERS, "acl": ACL})
    client = raw_mqtt(broker)
    ack = connect5(client, unique("a"), username="app", password=b"wrong",
                   properties=p.Properties(request_problem_information=0))
    assert ack.return_code == R.BAD_USER_NAME_OR_PASSWORD
    assert ack.properties is None or ack.properties.reason_string is None
    client.wait_closed()
    assert not [packet for packet in client.packets if isinstance(packet, p.Disconnect)]  # [MQTT-3.2.2-7]


def test_quota_of_persistent_sessions_is_0x97(broker_factory, raw_mqtt):
    broker = broker_factory(mqtt={"max_persistent_sessions": 1})
    kept = p.Properties(session_expiry_interval=300)
    assert connect5(raw_mqtt(broker), unique("q"), properties=kept).return_code == 0
    assert connect5(raw_mqtt(broker), unique("q"), properties=kept).return_code == R.QUOTA_EXCEEDED
    assert connect5(raw_mqtt(broker), unique("q")).return_code == 0  # a session that ends with its connection


def test_paho_connect_with_properties_and_session_present(broker_factory):
    broker = broker_factory()
    client_id = unique("p")
    kept = props(PacketTypes.CONNECT, SessionExpiryInterval=300, ReceiveMaximum=10)
    first = Paho5(broker.mqtt_port, client_id, connect_properties=kept)
    first.subscribe("t/present")
    first.close()
    second = Paho5(broker.mqtt_port, client_id, clean_start=False, connect_properties=kept)
    try:
        assert second.connack[:2] == (True, 0)
    finally:
        second.close()
