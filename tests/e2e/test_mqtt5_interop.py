"""MQTT 5 through the clients users have, against a real ``gateway serve``:
aiomqtt (asyncio, over paho) and Debian's mosquitto_pub / mosquitto_sub
with ``-V mqttv5``.  The 3.1.1 counterparts are tests/e2e/test_mqtt_interop.py."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import unique, wait_for
from tests.processes import free_port

needs_mosquitto = pytest.mark.skipif(
    shutil.which("mosquitto_pub") is None, reason="mosquitto-clients not installed (make test installs it when it can)"
)
CLIENT_TIMEOUT_S = 20  # a mosquitto client or an asyncio scenario on a loaded 2-core machine


@pytest.fixture
def serve(gateway) -> Iterator[int]:
    """A ``gateway serve`` child process; yields its MQTT port."""
    mqtt_port, stomp_port = free_port(), free_port()
    process = gateway("--mqtt-port", str(mqtt_port), "--stomp-port", str(stomp_port))
    process.wait_listening(mqtt_port)
    yield mqtt_port


# -- aiomqtt --------------------------------------------------------------------


def test_aiomqtt_v5_publishes_and_subscribes_with_properties_at_qos_1(serve):
    """aiomqtt (which speaks 3.1.1 unless told) with ``ProtocolVersion.V5``:
    a subscription with an identifier and No Local, QoS 1 publishes with
    User Properties (a repeated name among them), a Response Topic, binary
    Correlation Data, a content type, a payload format and an expiry, then
    two by a topic alias; the subscriber gets each with its properties (and
    its topic), and not its own publish."""
    aiomqtt = pytest.importorskip("aiomqtt")
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties
    from paho.mqtt.subscribeoptions import SubscribeOptions

    root = unique("aio5")
    request = Properties(PacketTypes.PUBLISH)
    request.UserProperty = [("unit", "C"), ("tag", "a"), ("tag", "b")]
    request.ResponseTopic = f"{root}/replies"
    request.CorrelationData = b"\x00\xffreq-1"
    request.ContentType = "text/plain"
    request.PayloadFormatIndicator = 1
    request.MessageExpiryInterval = 600

    def client(name: str, **kwargs: Any) -> Any:
        connect = Properties(PacketTypes.CONNECT)
        connect.ReceiveMaximum = 8  # no Topic Alias Maximum: paho (under aiomqtt) cannot resolve aliases it receives
        return aiomqtt.Client("127.0.0.1", serve, identifier=unique(name), protocol=aiomqtt.ProtocolVersion.V5,
                              properties=connect, timeout=CLIENT_TIMEOUT_S, **kwargs)

    async def scenario() -> tuple[list[Any], list[Any]]:
        async with client("aio-sub") as subscriber, client("aio-pub") as publisher:
            subscribe = Properties(PacketTypes.SUBSCRIBE)
            subscribe.SubscriptionIdentifier = 3
            granted = await subscriber.subscribe(f"{root}/#", options=SubscribeOptions(qos=1, noLocal=True),
                                                 properties=subscribe)
            await subscriber.publish(f"{root}/own", b"not for me", qos=1)  # No Local: never comes back
            await publisher.publish(f"{root}/1/temp", b"21.5", qos=1, properties=request)
            alias = Properties(PacketTypes.PUBLISH)
            alias.TopicAlias = 1
            await publisher.publish(f"{root}/1/temp", b"21.75", qos=1, properties=alias)  # sets alias 1
            await publisher.publish("", b"22.0", qos=1, properties=alias)  # by alias alone
            got = []
            async with asyncio.timeout(CLIENT_TIMEOUT_S):
                async for message in subscriber.messages:
                    got.append(message)
                    if len(got) == 3:
                        break
            return list(granted), got

    granted, (first, second, third) = asyncio.run(scenario())
    assert [code.value for code in granted] == [1]
    assert [(str(m.topic), m.payload, m.qos) for m in (first, second, third)] == [
        (f"{root}/1/temp", b"21.5", 1), (f"{root}/1/temp", b"21.75", 1), (f"{root}/1/temp", b"22.0", 1)]
    properties = first.properties
    assert properties.UserProperty == [("unit", "C"), ("tag", "a"), ("tag", "b")]  # order and repeats kept
    assert (properties.ResponseTopic, properties.CorrelationData) == (f"{root}/replies", b"\x00\xffreq-1")
    assert (properties.ContentType, properties.PayloadFormatIndicator) == ("text/plain", 1)
    assert 0 < properties.MessageExpiryInterval <= 600
    assert properties.SubscriptionIdentifier == [3]
    for plain in (second, third):  # nothing of the first's metadata, nor the publisher's alias
        assert plain.properties.SubscriptionIdentifier == [3]
        assert not any(hasattr(plain.properties, name) for name in ("UserProperty", "ResponseTopic", "TopicAlias"))
