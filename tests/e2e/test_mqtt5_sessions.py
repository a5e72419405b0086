"""MQTT 5 session lifetime through paho-mqtt v5 clients against a real broker:
a session kept for its Session Expiry Interval and gone after it (also
across a restart on the same data folder), sessions that never expire, and
wills that wait out their Will Delay Interval (or the session's end).

Waits are bounded and generous (the machine is shared); a will's "not yet"
is checked well inside its delay and its arrival well after it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.support.helpers import unique, wait_for
from tests.support.processes import accepting, free_port

NEVER = 0xFFFFFFFF


class Paho5:
    """A connected paho-mqtt MQTT 5 client whose CONNACK and messages are recorded."""

    def __init__(self, port: int, client_id: str, *, clean_start: bool = True, expiry: int | None = None,
                 will: tuple[str, bytes, int] | None = None, v5: bool = True) -> None:
        protocol = mqtt.MQTTv5 if v5 else mqtt.MQTTv311
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol,
                                  clean_session=None if v5 else clean_start)
        self.messages: list[mqtt.MQTTMessage] = []
        self.connacks: list[tuple[bool, int]] = []
        self.subacks: dict[int, list[int]] = {}
        self.lock = threading.Lock()
        self.client.on_message = self._on_message
        self.client.on_connect = lambda c, u, flags, rc, props=None: self.connacks.append((flags.session_present, rc.value))
        self.client.on_subscribe = lambda c, u, mid, codes, props=None: self.subacks.__setitem__(mid, [x.value for x in codes])
        if will is not None:  # (topic, payload, Will Delay Interval)
            will_props = Properties(PacketTypes.WILLMESSAGE)
            will_props.WillDelayInterval = will[2]
            self.client.will_set(will[0], will[1], qos=1, properties=will_props)
        props = None
        if v5 and expiry is not None:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = expiry
        if v5:
            self.client.connect("127.0.0.1", port, clean_start=clean_start, properties=props)
        else:
            self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        wait_for(lambda: self.connacks, what="CONNACK")

    @property
    def present(self) -> bool:
        return self.connacks[0][0]

    def _on_message(self, client: Any, userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.messages.append(message)

    def subscribe(self, topic: str, qos: int = 1) -> None:
        _, mid = self.client.subscribe(topic, qos)
        wait_for(lambda: mid in self.subacks, what="SUBACK")
        assert self.subacks[mid] == [qos]

    def publish(self, topic: str, payload: bytes, qos: int = 1) -> None:
        info = self.client.publish(topic, payload, qos=qos)
        info.wait_for_publish(10)
        assert info.is_published()

    @property
    def payloads(self) -> list[bytes]:
        with self.lock:
            return [m.payload for m in self.messages]

    def close(self) -> None:
        """A normal DISCONNECT (0x00): the session is kept for its interval, no will."""
        self.client.disconnect()
        self.client.loop_stop()
        self.client._reset_sockets()  # paho's wake-up socket pair too, so nothing leaks between tests

    def drop(self) -> None:
        """End the connection without DISCONNECT, as a crashed device would."""
        self.client.loop_stop()
        self.client._reset_sockets()


@pytest.fixture
def paho5() -> Iterator[Any]:
    made: list[Paho5] = []

    def factory(broker: Any, client_id: str, **kwargs: Any) -> Paho5:
        client = Paho5(broker.mqtt_port, client_id, **kwargs)
        made.append(client)
        return client

    yield factory
    for client in made:
        try:
            client.drop()
        except Exception:  # closed by the test already
            pass


def probed(publisher: Paho5, watcher: Paho5, topic: str) -> list[bytes]:
    """What ``watcher`` got on ``topic`` up to a probe published now: what
    was due to it arrives before the probe (one subscription, in order)."""
    probe = unique("probe").encode()
    publisher.publish(topic, probe)
    wait_for(lambda: probe in watcher.payloads, 10, what="the probe")
    return watcher.payloads[: watcher.payloads.index(probe)]


# -- Session Expiry Interval ---------------------------------------------------


def test_a_session_is_resumed_within_its_expiry_and_gone_after_it(broker, paho5):
    topic, cid = unique("exp/t"), unique("exp")
    publisher = paho5(broker, unique("pub"))
    first = paho5(broker, cid, expiry=2)
    first.subscribe(topic)
    first.close()
    publisher.publish(topic, b"while away 1")
    time.sleep(1)
    second = paho5(broker, cid, clean_start=False, expiry=2)
    assert second.present
    wait_for(lambda: second.payloads == [b"while away 1"], 10, what="the backlog")
    second.close()
    publisher.publish(topic, b"while away 2")
    time.sleep(4)
    third = paho5(broker, cid, clean_start=False, expiry=2)
    assert not third.present
    third.subscribe(topic)  # a new subscription: what the old one held went with it
    assert probed(publisher, third, topic) == []


def test_sessions_that_never_expire_stay_across_time_and_a_restart(broker_factory, paho5):
    broker = broker_factory()
    topic = unique("never/t")
    sessions = ((unique("forever"), {"expiry": NEVER}), (unique("old"), {"v5": False}))  # 0xFFFFFFFF, 3.1.1's
    for cid, kwargs in sessions:
        client = paho5(broker, cid, clean_start=False, **kwargs)
        client.subscribe(topic)
        client.close()
    paho5(broker, unique("pub")).publish(topic, b"kept")
    broker.stop()
    broker = broker_factory()
    time.sleep(3)
    for cid, kwargs in sessions:
        client = paho5(broker, cid, clean_start=False, **kwargs)
        assert client.present
        wait_for(lambda: client.payloads == [b"kept"], 10, what="the backlog")
        client.close()


def test_expiry_holds_across_a_restart(broker_factory, paho5):
    broker = broker_factory()
    topic = unique("restart/t")
    short, long_ = unique("short"), unique("long")
    for cid, expiry in ((short, 2), (long_, 60)):
        client = paho5(broker, cid, expiry=expiry)
        client.subscribe(topic)
        client.close()
    closed = time.monotonic()
    paho5(broker, unique("pub")).publish(topic, b"kept")
    broker.stop()
    time.sleep(max(0.0, closed + 4 - time.monotonic()))  # the short one's end passes while the broker is down
    broker = broker_factory()
    gone = paho5(broker, short, clean_start=False, expiry=2)
    assert not gone.present
    kept = paho5(broker, long_, clean_start=False, expiry=60)
    assert kept.present
    wait_for(lambda: kept.payloads == [b"kept"], 10, what="the backlog")


def test_an_expiry_pending_at_a_restart_ends_after_it(broker_factory, paho5):
    broker = broker_factory()
    cid = unique("pending")
    client = paho5(broker, cid, expiry=5)
    client.subscribe(unique("pending/t"))
    client.close()
    closed = time.monotonic()
    broker.stop()
    broker = broker_factory()
    time.sleep(max(0.0, closed + 7 - time.monotonic()))
    assert not paho5(broker, cid, clean_start=False, expiry=5).present


def test_a_session_connected_at_a_crash_ends_its_interval_after_the_restart(broker_process, paho5):
    mqtt_port = free_port()
    process = broker_process("--mqtt-port", str(mqtt_port))
    broker = SimpleNamespace(mqtt_port=mqtt_port)
    process.start()
    wait_for(lambda: accepting(mqtt_port), 10, what="the MQTT port")
    short, long_ = unique("short"), unique("long")
    clients = [paho5(broker, cid, expiry=expiry) for cid, expiry in ((short, 3), (long_, 600))]
    for client in clients:
        client.subscribe(unique("crash/t"))  # acknowledged: on disk
    process.kill()  # SIGKILL: the connections never closed
    for client in clients:
        client.drop()  # before paho reconnects on its own (a second later at the soonest)
    process.start()
    wait_for(lambda: accepting(mqtt_port), 10, what="the MQTT port")
    time.sleep(5)
    assert not paho5(broker, short, clean_start=False, expiry=3).present
    assert paho5(broker, long_, clean_start=False, expiry=600).present


def test_a_kept_session_resumed_with_expiry_0_ends_even_if_the_broker_crashes(broker_process, paho5):
    # [MQTT-3.1.2-23]: resumed by a connection asking expiry 0, the session
    # ends with that connection, and a SIGKILL must not keep it alive.
    mqtt_port = free_port()
    process = broker_process("--mqtt-port", str(mqtt_port))
    broker = SimpleNamespace(mqtt_port=mqtt_port)
    process.start()
    wait_for(lambda: accepting(mqtt_port), 10, what="the MQTT port")
    cid = unique("zero")
    kept = paho5(broker, cid, expiry=600)
    kept.subscribe(unique("zero/t"))  # acknowledged: on disk
    kept.close()
    resumed = paho5(broker, cid, clean_start=False, expiry=0)
    assert resumed.present
    process.kill()  # SIGKILL while the session that should end is connected
    resumed.drop()
    process.start()
    wait_for(lambda: accepting(mqtt_port), 10, what="the MQTT port")
    assert not paho5(broker, cid, clean_start=False, expiry=600).present  # ended at start-up, before anyone connects


# -- Will Delay Interval -------------------------------------------------------


def test_a_will_arrives_after_its_delay(broker, paho5):
    topic = unique("will/t")
    watcher = paho5(broker, unique("watcher"))
    watcher.subscribe(topic)
    device = paho5(broker, unique("device"), expiry=30, will=(topic, b"gone", 2))
    device.drop()
    time.sleep(1)
    assert watcher.payloads == []
    wait_for(lambda: watcher.payloads == [b"gone"], 4, what="the delayed will")


def test_a_reconnect_within_the_delay_calls_the_will_off(broker, paho5):
    topic, cid = unique("will/t"), unique("device")
    watcher = paho5(broker, unique("watcher"))
    watcher.subscribe(topic)
    paho5(broker, cid, expiry=30, will=(topic, b"gone", 2)).drop()
    time.sleep(0.5)
    back = paho5(broker, cid, clean_start=False, expiry=30)
    assert back.present
    time.sleep(3)
    assert probed(back, watcher, topic) == []


def test_a_will_delay_beyond_the_session_fires_when_the_session_ends(broker, paho5):
    topic = unique("will/t")
    watcher = paho5(broker, unique("watcher"))
    watcher.subscribe(topic)
    device = paho5(broker, unique("device"), expiry=2, will=(topic, b"gone", 60))
    device.drop()
    wait_for(lambda: watcher.payloads == [b"gone"], 20, what="the will at the session's end")
