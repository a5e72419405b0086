"""The MQTT codec: bytes <-> packets for MQTT 3.1, 3.1.1 and 5.0, sans-IO.

Everything of MQTT that is wire format lives in this package, and nothing
else does (tests/test_layering.py holds the whole folder to the codec rule:
no Trio, no core, nothing of ours outside this package).  Split by what each
module owns, as h11 splits its own:

- ``connection``: :class:`MqttConnection`, buffering, the fixed header's parse,
  packet order (a state table), the protocol level fixed at CONNECT;
- ``wire``: errors, the fixed header's rules, the remaining length, the fields;
- ``packets``: the packet classes and 3.1.1's return codes;
- ``decoders`` / ``decoders_v5``: each packet's variable header and payload, in;
- ``encoders`` / ``encoders_v5``: the same, out;
- ``properties``: MQTT 5's property block; ``reasons``: its reason codes.

The public names are importable from here.
"""

from gateway.mqtt.codec.connection import MqttConnection, State
from gateway.mqtt.codec.encoders import EMPTY_TOPIC_FIELD, puback_bytes, publish_bytes, topic_field
from gateway.mqtt.codec.properties import EMPTY_PROPERTIES, encode_properties
from gateway.mqtt.codec.wire import (
    KNOWN_PROTOCOL_NAMES,
    MAX_PACKET_BYTES,
    MAX_REMAINING_LENGTH,
    SUPPORTED_PROTOCOLS,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    Role,
    validate_topic_filter,
    validate_topic_name,
)

__all__ = [
    "EMPTY_PROPERTIES",
    "EMPTY_TOPIC_FIELD",
    "KNOWN_PROTOCOL_NAMES",
    "MAX_PACKET_BYTES",
    "MAX_REMAINING_LENGTH",
    "SUPPORTED_PROTOCOLS",
    "LocalProtocolError",
    "MqttConnection",
    "ProtocolError",
    "RemoteProtocolError",
    "Role",
    "State",
    "encode_properties",
    "puback_bytes",
    "publish_bytes",
    "topic_field",
    "validate_topic_filter",
    "validate_topic_name",
]
