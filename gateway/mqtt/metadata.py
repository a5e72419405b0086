"""An MQTT 5 message's metadata <-> the core message's headers, which are
STOMP's: one message model, whichever protocol published it and whichever
reads it.

    MQTT 5 property             core header (what a STOMP client sees)
    Response Topic a/b          reply-to: /topic/a.b
    Correlation Data            correlation-id (UTF-8 text), else
                                mqtt-correlation-data (base64)
    Content Type                content-type
    Payload Format Indicator 1  mqtt-payload-format: utf-8
    User Property (k, v)        k: v, in order
    Message Expiry Interval     expires (the message's expiry, ms since the epoch)

Back to MQTT 5 the same way; a STOMP header with no property of its own
becomes a User Property, and a reply-to that is not a topic (a queue, a
temporary queue) goes as a User Property ``reply-to``, since an MQTT client
can only publish to topics.  User Properties keep their order and repeats
[MQTT-3.3.2-17, -18]: when some name repeats or is one the broker owns, the
whole list also travels in ``mqtt-user-properties`` (JSON) and MQTT
subscribers get that list exactly.  Sans-IO and pure.
"""

from __future__ import annotations

import base64
import binascii
import json

from gateway.mqtt import topics
from gateway.mqtt.codec.packets import Properties

REPLY_TO = "reply-to"
CORRELATION_ID = "correlation-id"
CONTENT_TYPE = "content-type"
CORRELATION_DATA = "mqtt-correlation-data"
PAYLOAD_FORMAT = "mqtt-payload-format"
USER_PROPERTIES = "mqtt-user-properties"
MAPPED = frozenset({REPLY_TO, CORRELATION_ID, CONTENT_TYPE, CORRELATION_DATA, PAYLOAD_FORMAT, USER_PROPERTIES})
# The names the broker owns on a delivered message (STOMP's MESSAGE frame and
# what SEND takes for itself): a User Property by one of these names cannot
# be a plain header, so it travels only in the JSON list.
OWNED = MAPPED | frozenset({
    "destination", "message-id", "subscription", "ack", "content-length", "receipt", "transaction",
    "persistent", "priority", "expires", "expiration", "redelivered", "timestamp", "x-delivery-count",
})


def to_headers(properties: Properties) -> dict[str, str] | str:
    """The core headers of a v5 PUBLISH's (or will's) properties, or why
    they cannot be used (a Response Topic that is not a topic name)."""
    headers: dict[str, str] = {}
    response = properties.response_topic
    if response is not None:
        address = topics.to_address(response)
        if isinstance(address, str) or "+" in response or "#" in response:
            return f"response topic {response[:80]!r} is not a topic name"  # [MQTT-3.3.2-14]
        headers[REPLY_TO] = address.text
    data = properties.correlation_data
    if data is not None:
        text = _text(data)
        if text is not None:
            headers[CORRELATION_ID] = text
        else:
            headers[CORRELATION_DATA] = base64.b64encode(data).decode("ascii")
    if properties.content_type is not None:
        headers[CONTENT_TYPE] = properties.content_type
    if properties.payload_format_indicator == 1:
        headers[PAYLOAD_FORMAT] = "utf-8"
    pairs = properties.user_properties
    if pairs:
        exact = False
        for name, value in pairs:
            if name in OWNED or name in headers:
                exact = True  # a repeat, or a name the broker owns
            else:
                headers[name] = value
        if exact:
            headers[USER_PROPERTIES] = json.dumps(pairs, ensure_ascii=False, separators=(",", ":"))
    return headers


def to_properties(headers: dict[str, str], expires_ms: int, now_ms: int) -> Properties | None:
    """The v5 PUBLISH properties of a core message (None: it has none): its
    headers as the table above maps them, and the Message Expiry Interval
    left [MQTT-3.3.2-6]."""
    properties = None
    if expires_ms:
        properties = Properties(message_expiry_interval=max(1, -((now_ms - expires_ms) // 1000)))
    if not headers:
        return properties
    if properties is None:
        properties = Properties()
    user: list[tuple[str, str]] = []
    for name, value in headers.items():
        if name not in MAPPED:
            user.append((name, value))
    reply_to = headers.get(REPLY_TO)
    if reply_to is not None:
        topic = topics.topic_of(reply_to)
        if topic is not None:
            properties.response_topic = topic
        else:
            user.append((REPLY_TO, reply_to))
    data = headers.get(CORRELATION_DATA)
    if data is not None:
        try:
            properties.correlation_data = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            user.append((CORRELATION_DATA, data))
    elif CORRELATION_ID in headers:
        properties.correlation_data = headers[CORRELATION_ID].encode("utf-8", "surrogatepass")
    if CONTENT_TYPE in headers:
        properties.content_type = headers[CONTENT_TYPE]
    if headers.get(PAYLOAD_FORMAT) == "utf-8":
        properties.payload_format_indicator = 1
    exact = headers.get(USER_PROPERTIES)
    if exact is not None:
        pairs = _pairs(exact)
        if pairs is not None:
            user = pairs
        else:  # a STOMP client's header by that name, not our list: kept like any other
            user.append((USER_PROPERTIES, exact))
    properties.user_properties = tuple(user)
    return properties


def _text(data: bytes) -> str | None:
    """``data`` as a header value, if it is UTF-8 text a header can carry."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if "\x00" in text else text


def _pairs(text: str) -> list[tuple[str, str]] | None:
    """The exact User Property list a header kept, or None if it is not one
    (a STOMP client may set any header)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, list):
        return None
    pairs = []
    for item in value:
        if not (isinstance(item, list) and len(item) == 2 and all(isinstance(part, str) for part in item)):
            return None
        pairs.append((item[0], item[1]))
    return pairs
