"""MQTT clients for the end-to-end tests: paho-mqtt, recorded, and a raw socket
speaking the project's own codec in the client role for misbehaving peers."""

from __future__ import annotations

import asyncio
import gc
import socket
import ssl
import threading
import warnings
import time
from typing import Any

import paho.mqtt.client as mqtt

from gateway.mqtt.codec import packets as p
from gateway.mqtt.codec import MqttConnection, Role
from tests.support.helpers import TIMEOUT, wait_for


class Paho:
    """A connected paho client whose messages and CONNACK are recorded."""

    def __init__(self, port: int, client_id: str = "", *, clean: bool = True, keepalive: int = 30,
                 will: tuple[str, bytes, int, bool] | None = None, username: str | None = None,
                 password: str = "secret", tls: ssl.SSLContext | None = None,
                 websocket_path: str | None = None) -> None:
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=clean,
                                  transport="websockets" if websocket_path else "tcp")
        if websocket_path:  # MQTT over WebSocket on the admin port
            self.client.ws_set_options(path=websocket_path)
        self.messages: list[mqtt.MQTTMessage] = []
        self.connacks: list[tuple[bool, int]] = []
        self.subacks: dict[int, list[int]] = {}
        self.lock = threading.Lock()
        self.client.on_message = self._on_message
        self.client.on_connect = lambda c, u, flags, rc, props=None: self.connacks.append((flags.session_present, rc.value))
        self.client.on_subscribe = lambda c, u, mid, codes, props=None: self.subacks.__setitem__(mid, [x.value for x in codes])
        if will is not None:
            self.client.will_set(*will)
        if username is not None:
            self.client.username_pw_set(username, password)
        if tls is not None:
            self.client.tls_set_context(tls)
        with warnings.catch_warnings():
            # paho's WebSocket handshake reads the response headers with
            # str(bytearray) (paho-mqtt 2.x client.py), a BytesWarning under
            # -bb that is paho's own and harmless: ignored for paho only.
            warnings.filterwarnings("ignore", category=BytesWarning, module=r"paho\.mqtt\.client")
            self.client.connect("127.0.0.1", port, keepalive=keepalive)
        self.client.loop_start()
        wait_for(lambda: self.connacks, what="CONNACK")

    def _on_message(self, client: Any, userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.messages.append(message)

    def subscribe(self, *filters: tuple[str, int]) -> list[int]:
        _, mid = self.client.subscribe(list(filters))
        wait_for(lambda: mid in self.subacks, what="SUBACK")
        return self.subacks[mid]

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> None:
        info = self.client.publish(topic, payload, qos=qos, retain=retain)
        info.wait_for_publish(TIMEOUT)
        assert info.is_published()

    def wait(self, n: int, timeout: float = TIMEOUT) -> list[mqtt.MQTTMessage]:
        wait_for(lambda: len(self.messages) >= n, timeout, what=f"{n} MQTT messages (have {len(self.messages)})")
        return list(self.messages)

    @property
    def payloads(self) -> list[bytes]:
        return [m.payload for m in self.messages]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
        self._release()

    def drop(self) -> None:
        """End the connection without DISCONNECT, as a crashed device would."""
        self.client.loop_stop()
        self._release()

    def _release(self) -> None:
        # paho keeps a wake-up socket pair open until garbage collection;
        # close it (and the connection) now, so nothing leaks between tests.
        self.client._reset_sockets()


class RawMqtt:
    """A socket speaking MQTT through the project's codec (client role)."""

    def __init__(self, port: int, *, sock: Any = None, source: str | None = None) -> None:
        # ``sock``: already connected, e.g. a WebSocket (tests/support/ws_helpers.py);
        # ``source``: the loopback address to connect from (127.0.0.2: another client address)
        self.sock = sock if sock is not None else socket.create_connection(
            ("127.0.0.1", port), timeout=TIMEOUT, source_address=(source, 0) if source else None)
        self.codec = MqttConnection(Role.CLIENT)
        self.packets: list[p.Packet] = []
        self.eof = False

    def send(self, packet: p.Packet) -> None:
        self.sock.sendall(self.codec.send(packet))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def next(self, timeout: float = TIMEOUT) -> p.Packet:
        deadline = time.monotonic() + timeout
        while not self.packets:
            if self.eof or time.monotonic() > deadline:
                raise AssertionError("no packet arrived")
            self.pump(deadline - time.monotonic())
        return self.packets.pop(0)

    def pump(self, timeout: float) -> None:
        """Read once (up to ``timeout``) and decode what arrived into ``packets``."""
        self.sock.settimeout(max(timeout, 0.001))
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            return
        self.codec.receive_data(data)
        self.packets.extend(self.codec.events())

    def wait_closed(self, timeout: float = TIMEOUT) -> float:
        """Seconds until the broker closed the connection."""
        start = time.monotonic()
        while not self.eof:
            if time.monotonic() - start > timeout:
                raise AssertionError("the broker did not close the connection")
            self.pump(0.05)
        return time.monotonic() - start

    def close(self) -> None:
        self.sock.close()


def run_amqtt(coroutine: Any) -> Any:
    """Run an amqtt client scenario, then collect what the client library
    leaves for the garbage collector (pending tasks, never-awaited
    coroutines) here, so its warnings cannot surface in a later, unrelated test."""
    try:
        return asyncio.run(coroutine)
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gc.collect()
