"""What the MQTT 5 codec tests share: connections past a v5 opening, encode
and decode helpers, and Hypothesis strategies for properties (only those a
packet may carry, with valid values) and for the packets of each role."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import strategies as st

from gateway.mqtt.codec import packets as p
from gateway.mqtt.codec import MqttConnection, RemoteProtocolError, Role, State
from gateway.mqtt.codec.properties import BINARY, BYTE, MAX_VBI, PAIR, SPECS, STRING, U16, U32, VBI, WILL, Where
from gateway.mqtt.codec.reasons import DISCONNECT_CLIENT_ONLY, DISCONNECT_SERVER_ONLY, VALID
from gateway.mqtt.codec.wire import PT

CONNECT5_WIRE = b"\x10\x0e\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x01c"
CONNACK5_WIRE = b"\x20\x03\x00\x00\x00"


def connected5(role: Role, **kwargs: int) -> MqttConnection:
    """A v5 connection past its opening packet."""
    conn = MqttConnection(role, **kwargs)
    if role is Role.CLIENT:
        conn.send(p.Connect("c", protocol_level=5))
    conn.receive_data(CONNECT5_WIRE if role is Role.SERVER else CONNACK5_WIRE)
    assert len(list(conn.events())) == 1
    assert conn.state is State.CONNECTED and conn.protocol_level == 5
    return conn


def decode5(role: Role, chunks: list[bytes], **kwargs: int) -> list[p.Packet]:
    conn = connected5(role, **kwargs)
    out: list[p.Packet] = []
    for chunk in chunks:
        conn.receive_data(chunk)
        out.extend(conn.events())
    assert conn.buffered_bytes == 0
    return out


def encode5(role: Role, packets: list[p.Packet]) -> bytes:
    conn = MqttConnection(role)
    conn.protocol_level = 5
    return b"".join(conn.send(packet) for packet in packets)


def refused5(role: Role, wire: bytes) -> RemoteProtocolError:
    with pytest.raises(RemoteProtocolError) as caught:
        decode5(role, [wire])
    return caught.value


def frame(first: int, body: bytes) -> bytes:
    assert len(body) < 128
    return bytes((first, len(body))) + body


def block(*props: bytes) -> bytes:
    """A property block made by hand (its length first), to make bad ones too."""
    body = b"".join(props)
    assert len(body) < 128
    return bytes((len(body),)) + body


# -- strategies ------------------------------------------------------------------

CHARS = ["a", "/", " ", "\x01", "\u00e9", "\ufeff", "\U0001f600"]
texts = st.text(alphabet=CHARS, max_size=8)
topic_names = st.text(alphabet=CHARS, min_size=1, max_size=8)
packet_ids = st.integers(1, 65535)
_NUMBERS = {BYTE: 0xFF, U16: 0xFFFF, U32: 0xFFFF_FFFF, VBI: MAX_VBI}
_ONE_BIT = {"payload_format_indicator", "request_problem_information", "request_response_information",
            "maximum_qos", "retain_available", "wildcard_subscription_available",
            "subscription_identifier_available", "shared_subscription_available"}


def values(attr: str, kind: int) -> st.SearchStrategy[Any]:
    if attr in _ONE_BIT:
        return st.integers(0, 1)
    if kind in _NUMBERS:
        low = 1 if attr in {"receive_maximum", "maximum_packet_size", "topic_alias", "subscription_identifiers"} else 0
        return st.integers(low, _NUMBERS[kind])
    if attr == "response_topic":
        return topic_names  # a topic name [MQTT-3.3.2-14]
    if kind == STRING:
        return texts
    if kind == BINARY:
        return st.binary(max_size=10)
    assert kind == PAIR
    return st.tuples(texts, texts)


@st.composite
def properties_for(draw: st.DrawFn, where: Where, *, role: Role | None = None) -> p.Properties | None:
    """Properties a packet ``where`` may carry (None sometimes); ``role`` the sender."""
    if draw(st.booleans()):
        return None
    props = p.Properties()
    for spec in SPECS.values():
        if where not in spec.where or not draw(st.booleans()):
            continue
        if spec.attr == "subscription_identifiers":
            if role is Role.CLIENT and where == PT.PUBLISH:
                continue  # [MQTT-3.3.4-6]
            most = 1 if where == PT.SUBSCRIBE else 3
            setattr(props, spec.attr, tuple(draw(st.lists(values(spec.attr, VBI), min_size=1, max_size=most))))
        elif spec.attr == "user_properties":
            setattr(props, spec.attr, tuple(draw(st.lists(values(spec.attr, PAIR), max_size=3))))
        elif spec.attr == "session_expiry_interval" and where == PT.DISCONNECT and role is Role.SERVER:
            continue  # [MQTT-3.14.2-2]
        else:
            setattr(props, spec.attr, draw(values(spec.attr, spec.kind)))
    return None if props == p.Properties() else props  # an empty block decodes to None


def codes(kind: PT) -> st.SearchStrategy[int]:
    return st.sampled_from(sorted(VALID[kind]))


@st.composite
def publishes5(draw: st.DrawFn, role: Role) -> p.Publish:
    qos = draw(st.integers(0, 2))
    return p.Publish(draw(topic_names), draw(st.binary(max_size=200)), qos, draw(st.booleans()),
                     draw(st.booleans()) if qos else False, draw(packet_ids) if qos else None,
                     draw(properties_for(PT.PUBLISH, role=role)))


def acks5(role: Role) -> st.SearchStrategy[p.Packet]:
    return st.one_of(*(
        st.builds(cls, packet_ids, codes(kind), properties_for(kind))
        for cls, kind in ((p.PubAck, PT.PUBACK), (p.PubRec, PT.PUBREC), (p.PubRel, PT.PUBREL), (p.PubComp, PT.PUBCOMP))
    ))


def disconnects5(role: Role) -> st.SearchStrategy[p.Disconnect]:
    barred = DISCONNECT_SERVER_ONLY if role is Role.CLIENT else DISCONNECT_CLIENT_ONLY
    return st.builds(p.Disconnect, st.sampled_from(sorted(VALID[PT.DISCONNECT] - barred)),
                     properties_for(PT.DISCONNECT, role=role))


@st.composite
def auths(draw: st.DrawFn) -> p.Auth:
    code = draw(codes(PT.AUTH))
    props = draw(properties_for(PT.AUTH))
    if props is None and code == 0:
        return p.Auth()
    props = props or p.Properties()
    props.authentication_method = draw(texts)
    return p.Auth(code, props)


options_bytes = st.builds(p.options, st.integers(0, 2), st.booleans(), st.booleans(), st.integers(0, 2))
wills5 = st.builds(p.Will, topic_names, st.binary(max_size=20), st.integers(0, 2), st.booleans(),
                   properties_for(WILL))


@st.composite
def connects5(draw: st.DrawFn) -> p.Connect:
    props = draw(properties_for(PT.CONNECT))
    if props is not None and props.authentication_data is not None and props.authentication_method is None:
        props.authentication_data = None  # data needs a method (§3.1.2.11.10)
        if props == p.Properties():
            props = None
    return p.Connect(draw(texts), draw(st.booleans()), draw(st.integers(0, 65535)), draw(st.none() | texts),
                     draw(st.none() | st.binary(max_size=8)), draw(st.none() | wills5), "MQTT", 5, props)


SENDS5 = {
    Role.CLIENT: st.one_of(
        publishes5(Role.CLIENT), acks5(Role.CLIENT), disconnects5(Role.CLIENT), auths(), st.builds(p.PingReq),
        st.builds(p.Subscribe, packet_ids, st.lists(st.tuples(texts, options_bytes), min_size=1, max_size=4),
                  properties_for(PT.SUBSCRIBE)),
        st.builds(p.Unsubscribe, packet_ids, st.lists(texts, min_size=1, max_size=4), properties_for(PT.UNSUBSCRIBE)),
    ),
    Role.SERVER: st.one_of(
        publishes5(Role.SERVER), acks5(Role.SERVER), disconnects5(Role.SERVER), auths(), st.builds(p.PingResp),
        st.builds(p.SubAck, packet_ids, st.lists(codes(PT.SUBACK), min_size=1, max_size=4), properties_for(PT.SUBACK)),
        st.builds(p.UnsubAck, packet_ids, st.lists(codes(PT.UNSUBACK), min_size=1, max_size=4),
                  properties_for(PT.UNSUBACK)),
    ),
}
