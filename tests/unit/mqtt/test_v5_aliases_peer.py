"""MQTT 5 topic aliases both ways (gateway.mqtt.aliases) and what CONNECT
negotiates (gateway.mqtt.peer)."""

from __future__ import annotations

import dataclasses

from gateway.mqtt.aliases import InboundAliases, OutboundAliases
from gateway.mqtt.codec.packets import Properties
from gateway.mqtt.peer import NEVER, UNLIMITED, connack_properties, negotiate, whole_packet_limit
from gateway.mqtt.settings import MqttSettings

SETTINGS = MqttSettings()


def test_inbound_alias_set_then_used_then_replaced() -> None:
    aliases = InboundAliases(3)
    assert aliases.resolve("a/b", 1) == "a/b"  # set
    assert aliases.resolve("", 1) == "a/b"  # used
    assert aliases.resolve("c", 1) == "c"  # replaced
    assert aliases.resolve("", 1) == "c"


def test_inbound_alias_invalid() -> None:
    aliases = InboundAliases(2)
    assert aliases.resolve("a", 3) is None  # over the maximum
    assert aliases.resolve("a", 0) is None
    assert aliases.resolve("", 2) is None  # never set
    assert aliases.resolve("", None) is None  # neither a name nor an alias
    assert InboundAliases(0).resolve("a", 1) is None  # none allowed
    assert aliases.topics == {}


def test_outbound_aliases_assigned_up_to_the_maximum() -> None:
    aliases = OutboundAliases(2)
    assert aliases.alias("a") == (1, True)  # first use: name and alias
    assert aliases.alias("a") == (1, False)  # then the alias alone
    assert aliases.alias("b") == (2, True)
    assert aliases.alias("c") == (None, True)  # all given: by name
    assert aliases.alias("c") == (None, True)
    assert aliases.alias("b") == (2, False)


def test_outbound_forget_takes_back_only_the_last_alias_given() -> None:
    aliases = OutboundAliases(3)
    aliases.alias("a")
    aliases.alias("b")
    aliases.forget("a")  # not the last: the client may know it
    assert aliases.aliases == {"a": 1, "b": 2}
    aliases.forget("b")
    assert aliases.aliases == {"a": 1}
    assert aliases.alias("c") == (2, True)  # the alias is given again


def test_negotiate_defaults() -> None:
    peer = negotiate(None, 30, SETTINGS)
    assert peer.receive_maximum == 65535
    assert peer.maximum_packet_size == UNLIMITED
    assert peer.aliases_in.maximum == SETTINGS.topic_alias_maximum
    assert peer.aliases_out.maximum == 0
    assert peer.problem_information is True
    assert peer.session_expiry == 0
    assert peer.keep_alive == 30
    assert peer.oversize_dropped == 0


def test_negotiate_takes_the_clients_limits() -> None:
    props = Properties(receive_maximum=2, maximum_packet_size=1000, topic_alias_maximum=5,
                       request_problem_information=0, session_expiry_interval=60)
    peer = negotiate(props, 10, SETTINGS)
    assert (peer.receive_maximum, peer.maximum_packet_size, peer.aliases_out.maximum) == (2, 1000, 5)
    assert peer.problem_information is False
    assert peer.session_expiry == 60


def test_server_keep_alive_overrides_none_and_too_long() -> None:
    settings = dataclasses.replace(SETTINGS, max_keep_alive_s=20)
    assert negotiate(None, 0, settings).keep_alive == 20
    assert negotiate(None, 60, settings).keep_alive == 20
    assert negotiate(None, 10, settings).keep_alive == 10
    assert negotiate(None, 0, SETTINGS).keep_alive == 0  # no limit configured


def test_session_expiry_capped_by_the_setting() -> None:
    settings = dataclasses.replace(SETTINGS, max_session_expiry_s=100)
    assert negotiate(Properties(session_expiry_interval=NEVER), 0, settings).session_expiry == 100
    assert negotiate(Properties(session_expiry_interval=50), 0, settings).session_expiry == 50
    assert negotiate(Properties(session_expiry_interval=NEVER), 0, SETTINGS).session_expiry == NEVER


def test_connack_properties_announce_the_limits() -> None:
    peer = negotiate(None, 30, SETTINGS)
    props = connack_properties(peer, SETTINGS, requested_expiry=0, requested_keep_alive=30, assigned_client_id=None)
    assert props == Properties(
        receive_maximum=SETTINGS.receive_maximum, maximum_packet_size=whole_packet_limit(SETTINGS.max_packet_bytes),
        topic_alias_maximum=SETTINGS.topic_alias_maximum, retain_available=1, wildcard_subscription_available=1,
        subscription_identifier_available=1, shared_subscription_available=1)


def test_connack_properties_say_what_the_server_changed() -> None:
    settings = dataclasses.replace(SETTINGS, max_keep_alive_s=20, max_session_expiry_s=100)
    peer = negotiate(Properties(session_expiry_interval=500), 60, settings)
    props = connack_properties(peer, settings, requested_expiry=500, requested_keep_alive=60,
                               assigned_client_id="gw-1")
    assert props.session_expiry_interval == 100
    assert props.server_keep_alive == 20
    assert props.assigned_client_identifier == "gw-1"
