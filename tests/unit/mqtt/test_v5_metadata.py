"""MQTT 5 metadata <-> core headers (gateway.mqtt.metadata): each row of the
mapping table both ways, User Properties kept exactly (order, repeats, names
the broker owns), binary correlation data, reply-to destinations MQTT cannot
publish to, and headers a STOMP client set that only look like ours."""

from __future__ import annotations

import json

from gateway.mqtt import metadata
from gateway.mqtt.codec.packets import Properties

NOW = 1_700_000_000_000


def round_trip(props: Properties) -> Properties:
    headers = metadata.to_headers(props)
    assert isinstance(headers, dict)
    back = metadata.to_properties(headers, 0, NOW)
    assert back is not None
    return back


def test_each_property_maps_to_its_header() -> None:
    props = Properties(response_topic="a/b", correlation_data=b"req-1", content_type="text/plain",
                       payload_format_indicator=1, user_properties=(("k", "v"), ("x", "y")))
    assert metadata.to_headers(props) == {
        "reply-to": "/topic/a.b", "correlation-id": "req-1", "content-type": "text/plain",
        "mqtt-payload-format": "utf-8", "k": "v", "x": "y",
    }


def test_each_header_maps_back_to_its_property() -> None:
    headers = {"reply-to": "/topic/a.b", "correlation-id": "req-1", "content-type": "text/plain",
               "mqtt-payload-format": "utf-8", "k": "v", "x": "y"}
    props = metadata.to_properties(headers, 0, NOW)
    assert props == Properties(response_topic="a/b", correlation_data=b"req-1", content_type="text/plain",
                               payload_format_indicator=1, user_properties=(("k", "v"), ("x", "y")))


def test_round_trip_keeps_every_mapped_property() -> None:
    props = Properties(response_topic="replies/c1", correlation_data="é".encode(), content_type="application/json",
                       payload_format_indicator=1, user_properties=(("a", "1"),))
    assert round_trip(props) == props


def test_format_indicator_zero_is_the_default_and_adds_nothing() -> None:
    assert metadata.to_headers(Properties(payload_format_indicator=0)) == {}


def test_repeated_user_properties_travel_exactly_in_json() -> None:
    pairs = (("a", "1"), ("b", "2"), ("a", "3"))
    headers = metadata.to_headers(Properties(user_properties=pairs))
    assert isinstance(headers, dict)
    assert headers["a"] == "1" and headers["b"] == "2"  # STOMP readers see the first of each
    assert json.loads(headers["mqtt-user-properties"]) == [list(pair) for pair in pairs]
    assert round_trip(Properties(user_properties=pairs)).user_properties == pairs


def test_user_property_with_an_owned_name_is_kept_only_in_json() -> None:
    pairs = (("destination", "/queue/evil"), ("message-id", "m"), ("z", "last"))
    headers = metadata.to_headers(Properties(user_properties=pairs))
    assert isinstance(headers, dict)
    assert "destination" not in headers and "message-id" not in headers
    assert headers["z"] == "last"
    assert round_trip(Properties(user_properties=pairs)).user_properties == pairs


def test_user_property_named_like_a_mapped_property_does_not_replace_it() -> None:
    props = Properties(content_type="text/plain", user_properties=(("content-type", "evil"),))
    headers = metadata.to_headers(props)
    assert isinstance(headers, dict)
    assert headers["content-type"] == "text/plain"
    assert round_trip(props) == props


def test_plain_user_properties_need_no_json() -> None:
    headers = metadata.to_headers(Properties(user_properties=(("a", "1"), ("b", "2"))))
    assert headers == {"a": "1", "b": "2"}


def test_binary_correlation_data_round_trips_through_base64() -> None:
    for data in (b"\xff\x00\x01", b"a\x00b", bytes(range(256))):
        headers = metadata.to_headers(Properties(correlation_data=data))
        assert isinstance(headers, dict)
        assert "correlation-id" not in headers and "mqtt-correlation-data" in headers
        assert round_trip(Properties(correlation_data=data)).correlation_data == data


def test_response_topic_that_is_not_a_topic_name_is_refused() -> None:
    for topic in ("a/+", "a/#"):
        assert isinstance(metadata.to_headers(Properties(response_topic=topic)), str)


def test_reply_to_a_queue_goes_as_a_user_property() -> None:
    for destination in ("/queue/replies", "/temp-queue/r1"):
        props = metadata.to_properties({"reply-to": destination}, 0, NOW)
        assert props is not None
        assert props.response_topic is None
        assert props.user_properties == (("reply-to", destination),)


def test_stomp_headers_become_user_properties_in_order() -> None:
    props = metadata.to_properties({"b": "2", "a": "1", "content-type": "text/x"}, 0, NOW)
    assert props is not None
    assert props.user_properties == (("b", "2"), ("a", "1")) and props.content_type == "text/x"


def test_bogus_user_properties_header_from_stomp_is_not_lost() -> None:
    for bogus in ("not json", '{"a": 1}', '[["a"]]', "[[1, 2]]"):
        props = metadata.to_properties({"mqtt-user-properties": bogus, "k": "v"}, 0, NOW)
        assert props is not None
        assert props.user_properties == (("k", "v"), ("mqtt-user-properties", bogus))


def test_bogus_correlation_data_header_from_stomp_is_a_user_property() -> None:
    props = metadata.to_properties({"mqtt-correlation-data": "*not base64*"}, 0, NOW)
    assert props is not None
    assert props.correlation_data is None
    assert props.user_properties == (("mqtt-correlation-data", "*not base64*"),)


def test_message_expiry_left_rounds_up_and_never_reaches_zero() -> None:
    for left_ms, seconds in ((10_000, 10), (9_001, 10), (1, 1), (-5_000, 1)):
        props = metadata.to_properties({}, NOW + left_ms, NOW)
        assert props is not None and props.message_expiry_interval == seconds


def test_no_headers_and_no_expiry_means_no_properties() -> None:
    assert metadata.to_properties({}, 0, NOW) is None
