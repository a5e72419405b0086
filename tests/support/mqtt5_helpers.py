"""MQTT 5 clients for the end-to-end tests: paho-mqtt with ``protocol=MQTTv5``
recording what v5 adds (CONNACK and DISCONNECT reason codes and properties,
ack reason codes, message properties), and raw v5 sockets on the project's
codec for what clients do not let one send."""

from __future__ import annotations

import threading
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.subscribeoptions import SubscribeOptions

from gateway.mqtt.codec import packets as p
from tests.support.helpers import TIMEOUT, wait_for
from tests.support.mqtt_helpers import RawMqtt


def props(packet_type: int = PacketTypes.PUBLISH, **values: Any) -> PahoProperties:
    """paho properties: ``props(ContentType="t", UserProperty=[("k", "v")])``."""
    made = PahoProperties(packet_type)
    for name, value in values.items():
        setattr(made, name, value)
    return made


class Paho5:
    """A connected paho v5 client whose packets of interest are recorded."""

    def __init__(self, port: int, client_id: str = "", *, clean_start: bool = True, keepalive: int = 30,
                 connect_properties: PahoProperties | None = None, username: str | None = None,
                 password: str | None = None, wait: bool = True, bind_address: str = "") -> None:
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        self.messages: list[mqtt.MQTTMessage] = []
        self.connacks: list[tuple[bool, int, Any]] = []
        self.disconnects: list[tuple[int, Any]] = []
        self.subacks: dict[int, list[int]] = {}
        self.unsubacks: dict[int, list[int]] = {}
        self.acks: dict[int, int] = {}  # mid -> PUBACK/PUBREC reason code
        self.lock = threading.Lock()
        self.client.on_message = self._on_message
        self.client.on_connect = lambda c, u, flags, rc, pr: self.connacks.append((flags.session_present, rc.value, pr))
        self.client.on_disconnect = lambda c, u, flags, rc, pr: self.disconnects.append((rc.value, pr))
        self.client.on_subscribe = lambda c, u, mid, codes, pr: self.subacks.__setitem__(mid, [x.value for x in codes])
        self.client.on_unsubscribe = lambda c, u, mid, codes, pr: self.unsubacks.__setitem__(
            mid, [x.value for x in codes])
        self.client.on_publish = lambda c, u, mid, rc, pr: self.acks.__setitem__(mid, rc.value)
        if username is not None:
            self.client.username_pw_set(username, password)
        # ``bind_address``: another loopback source (127.0.0.2), another client address to the broker.
        self.client.connect("127.0.0.1", port, keepalive=keepalive, clean_start=clean_start,
                            properties=connect_properties, bind_address=bind_address)
        self.client.loop_start()
        if wait:
            wait_for(lambda: self.connacks, what="CONNACK")

    @property
    def connack(self) -> tuple[bool, int, Any]:
        return self.connacks[0]

    def _on_message(self, client: Any, userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.messages.append(message)

    def subscribe(self, topic_filter: str, qos: int = 1, *, no_local: bool = False, retain_as_published: bool = False,
                  retain_handling: int = 0, identifier: int | None = None) -> list[int]:
        options = SubscribeOptions(qos=qos, noLocal=no_local, retainAsPublished=retain_as_published,
                                   retainHandling=retain_handling)
        properties = props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=identifier) if identifier else None
        _, mid = self.client.subscribe(topic_filter, options=options, properties=properties)
        wait_for(lambda: mid in self.subacks, what="SUBACK")
        return self.subacks[mid]

    def unsubscribe(self, *filters: str) -> list[int]:
        _, mid = self.client.unsubscribe(list(filters))
        wait_for(lambda: mid in self.unsubacks, what="UNSUBACK")
        return self.unsubacks[mid]

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False,
                properties: PahoProperties | None = None) -> int:
        """The PUBACK/PUBREC reason code (QoS 0: 0 once written)."""
        info = self.client.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        info.wait_for_publish(TIMEOUT)
        if qos == 0:
            return 0
        wait_for(lambda: info.mid in self.acks, what="publish ack")
        return self.acks[info.mid]

    def wait(self, n: int, timeout: float = TIMEOUT) -> list[mqtt.MQTTMessage]:
        wait_for(lambda: len(self.messages) >= n, timeout, what=f"{n} MQTT messages (have {len(self.messages)})")
        return list(self.messages)

    def wait_disconnect(self, timeout: float = TIMEOUT) -> tuple[int, Any]:
        wait_for(lambda: self.disconnects, timeout, what="DISCONNECT")
        return self.disconnects[0]

    @property
    def payloads(self) -> list[bytes]:
        return [m.payload for m in self.messages]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
        self.client._reset_sockets()


def connect5(client: RawMqtt, client_id: str = "", **connect: Any) -> p.ConnAck:
    """CONNECT at level 5 over a raw socket; the CONNACK."""
    client.send(p.Connect(client_id, protocol_level=5, **connect))
    ack = client.next()
    assert isinstance(ack, p.ConnAck), ack
    return ack


def until_closed(client: RawMqtt) -> list[p.Packet]:
    """Every packet the broker sent until it closed the connection."""
    client.wait_closed()
    got, client.packets = client.packets, []
    return got


def disconnect_code(client: RawMqtt) -> int:
    """The reason code of the DISCONNECT the broker sent last before closing."""
    got = until_closed(client)
    assert got and isinstance(got[-1], p.Disconnect), got
    return got[-1].reason_code
