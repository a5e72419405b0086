"""STOMP and MQTT over WebSocket on the admin port (``/stomp``, ``/mqtt``),
from Python: a wsproto client speaking raw frames, paho-mqtt's own WebSocket
transport, and TCP clients (stomp.py, paho) on the other side of the same
broker."""

from __future__ import annotations

import base64
import http.client
import json

import pytest

from gateway.auth import hash_password
from gateway.mqtt.codec import packets
from gateway.stomp import frames
from tests.support.helpers import RawClient, encode_frame, unique, wait_for
from tests.support.mqtt_helpers import RawMqtt
from tests.support.tls_helpers import CERT_AUTH, client_context, tls_broker
from tests.support.ws_helpers import Refused, WebSocketSocket


@pytest.fixture
def ws(broker_factory):
    """WebSocket connections to a broker's admin port: ``ws(broker, "/stomp", ["v12.stomp"])``."""
    made: list[WebSocketSocket] = []

    def factory(broker, path, subprotocols=(), **kwargs):
        sock = WebSocketSocket(broker.admin_port, path, subprotocols, **kwargs)
        made.append(sock)
        return sock

    yield factory
    for sock in made:
        sock.close()


def stomp_over(sock: WebSocketSocket) -> RawClient:
    return RawClient(None, sock=sock)


def connections(broker):
    return broker.call(lambda: {c.protocol: c.peer for c in broker.running.server.connections.values()})


# -- the handshake ----------------------------------------------------------


@pytest.mark.parametrize(("offered", "chosen", "version"), [
    (["v10.stomp", "v11.stomp", "v12.stomp"], "v12.stomp", "1.2"),  # what stomp.js offers, in any order
    (["v11.stomp", "v10.stomp"], "v11.stomp", "1.1"),
    (["v10.stomp"], "v10.stomp", "1.0"),
    (["stomp"], "stomp", "1.2"),
    ([], None, "1.2"),  # a plain WebSocket client: no subprotocol, STOMP still spoken
])
def test_stomp_subprotocol_is_the_highest_offered(broker, ws, offered, chosen, version):
    sock = ws(broker, "/stomp", offered, text=True)
    assert sock.subprotocol == chosen
    client = stomp_over(sock)
    accept = {"1.0": "1.0", "1.1": "1.0,1.1", "1.2": "1.0,1.1,1.2"}[version]
    connected = client.connect(accept)
    assert connected.headers["version"] == version


@pytest.mark.parametrize(("offered", "chosen"), [(["mqtt"], "mqtt"), (["mqttv3.1"], "mqttv3.1"), ([], None)])
def test_mqtt_subprotocol(broker, ws, offered, chosen):
    sock = ws(broker, "/mqtt", offered)
    assert sock.subprotocol == chosen
    client = RawMqtt(0, sock=sock)
    client.send(packets.Connect(unique("ws-")))
    ack = client.next()
    assert isinstance(ack, packets.ConnAck) and ack.return_code == 0


@pytest.mark.parametrize(("path", "offered", "names"), [
    ("/stomp", ["mqtt"], "v12.stomp"),
    ("/mqtt", ["v12.stomp", "v11.stomp"], "mqtt"),
    ("/stomp", ["chat", "superchat"], "v12.stomp"),
])
def test_an_unspoken_subprotocol_is_refused_with_the_reason(broker, ws, path, offered, names):
    with pytest.raises(Refused) as refused:
        ws(broker, path, offered)
    assert refused.value.status == 400
    assert names in refused.value.reason and offered[0] in refused.value.reason


def raw_http(broker, method: str, target: str, headers: dict[str, str]) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", broker.admin_port, timeout=5)
    try:
        conn.request(method, target, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


UPGRADE = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
           "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Protocol": "v12.stomp"}


@pytest.mark.parametrize(("method", "target", "change", "status", "says"), [
    ("GET", "/other", {}, None, ""),  # only /stomp and /mqtt upgrade: elsewhere the API answers as usual
    ("GET", "/stomp", {"Connection": None, "Upgrade": None}, 426, "Upgrade: websocket"),  # a plain GET
    ("POST", "/stomp", {}, 405, "GET"),
    ("GET", "/mqtt", {"Sec-WebSocket-Key": None}, 400, "Sec-WebSocket-Key"),
    ("GET", "/stomp", {"Sec-WebSocket-Version": "8"}, 426, "Sec-WebSocket-Version"),
    ("GET", "/stomp", {"Connection": "keep-alive"}, 400, "Connection: Upgrade"),
    ("GET", "/stomp", {"Host": "xn--zz"}, 400, "handshake"),  # not IDNA: wsproto raises UnicodeError
    ("GET", "/mqtt", {"Host": "\xff"}, 400, "handshake"),
])
def test_bad_upgrades_get_an_http_error_with_a_reason(broker, method, target, change, status, says):
    headers = {name: value for name, value in {**UPGRADE, **change}.items() if value is not None}
    got, body = raw_http(broker, method, target, headers)
    if status is None:
        status = raw_http(broker, method, target, {})[0]
    assert got == status, body
    assert says.encode() in body
    assert connections(broker) == {}


def test_the_connection_is_named_and_keyed_by_the_http_client_address(broker_factory, ws):
    broker = broker_factory(admin={"users": [{"name": "ops", "password_hash": hash_password("pw", iterations=1000),
                                              "role": "read"}]})
    stomp_sock = ws(broker, "/stomp", ["v12.stomp"], text=True)
    stomp_over(stomp_sock).connect()
    mqtt_sock = ws(broker, "/mqtt", ["mqtt"])
    mqtt_client = RawMqtt(0, sock=mqtt_sock)
    mqtt_client.send(packets.Connect(unique("ws-")))
    mqtt_client.next()
    auth = {"Authorization": "Basic " + base64.b64encode(b"ops:pw").decode()}
    status, body = raw_http(broker, "GET", "/api/v1/connections", auth)
    assert status == 200, body
    listed = {c["protocol"]: c["peer"] for c in json.loads(body)}
    assert listed == {"stomp-ws": stomp_sock.local_address, "mqtt-ws": mqtt_sock.local_address}
    status, body = raw_http(broker, "GET", "/metrics", auth)
    assert status == 200, body
    assert b'gateway_connections{protocol="stomp-ws"} 1' in body
    assert b'gateway_connections_accepted_total{protocol="mqtt-ws"} 1' in body


def test_per_address_limits_count_websocket_clients_by_their_address(broker_factory, ws):
    broker = broker_factory(max_connections_per_address=1)
    first = stomp_over(ws(broker, "/stomp", ["v12.stomp"], text=True))
    first.connect()
    second = stomp_over(ws(broker, "/stomp", ["v12.stomp"], text=True))
    second.send_frame("CONNECT", {"accept-version": "1.2", "host": "h"})
    assert "too many connections from 127.0.0.1" in second.expect_error_and_close().headers["message"]


# -- STOMP over WebSocket --------------------------------------------------


def test_stomp_over_websocket_and_tcp_meet(broker, ws, stomp_client):
    topic, queue = f"/topic/{unique('ws')}", f"/queue/{unique('ws')}"
    browser = stomp_over(ws(broker, "/stomp", ["v12.stomp"], text=True))
    browser.connect()
    browser.send_frame("SUBSCRIBE", {"id": "1", "destination": topic, "receipt": "r1"})
    browser.receipt("r1")
    tcp = stomp_client(broker)
    tcp.send(topic, b"from tcp")
    message = browser.expect("MESSAGE")
    assert message.body == b"from tcp" and message.headers["destination"] == topic
    tcp.subscribe(queue)
    browser.send_frame("SEND", {"destination": queue, "receipt": "r2"}, "from websocket".encode())
    browser.receipt("r2")
    assert tcp.wait_messages(1)[0].body == b"from websocket"


def test_a_frame_split_across_messages_and_frames_sharing_one(broker, ws):
    queue = f"/queue/{unique('split')}"
    sock = ws(broker, "/stomp", ["v12.stomp"])
    client = stomp_over(sock)
    connect = encode_frame("CONNECT", {"accept-version": "1.2", "host": "localhost"})
    for i in range(len(connect)):  # one byte per WebSocket message
        sock.send_message(connect[i:i + 1])
    assert isinstance(client.next_frame(), frames.Connected)
    # One frame spread over the fragments of one message, as a streaming client sends it.
    send = encode_frame("SEND", {"destination": queue, "receipt": "a"}, b"fragmented")
    sock.send_message(send[:7], finished=False)
    sock.send_message(send[7:20], finished=False)
    sock.send_message(send[20:])
    client.receipt("a")
    # Three frames in one message.
    several = (encode_frame("SEND", {"destination": queue}, b"two")
               + encode_frame("SUBSCRIBE", {"id": "s", "destination": queue})
               + encode_frame("SEND", {"destination": queue, "receipt": "b"}, b"three"))
    sock.send_message(several)
    got = [client.next_frame() for _ in range(4)]
    bodies = [f.body for f in got if isinstance(f, frames.Message)]
    assert bodies == [b"fragmented", b"two", b"three"]
    assert [f.headers["receipt-id"] for f in got if isinstance(f, frames.Receipt)] == ["b"]


def test_binary_bodies_go_out_binary_and_text_as_text(broker, ws, stomp_client):
    queue = f"/queue/{unique('bin')}"
    sock = ws(broker, "/stomp", ["v12.stomp"], text=True)
    client = stomp_over(sock)
    client.connect()
    client.send_frame("SUBSCRIBE", {"id": "1", "destination": queue, "receipt": "s"})
    client.receipt("s")
    tcp = stomp_client(broker)
    tcp.send(queue, "hé".encode())
    assert client.expect("MESSAGE").body == "hé".encode()
    tcp.send(queue, b"\xff\xfe\x00\x01")
    assert client.expect("MESSAGE").body == b"\xff\xfe\x00\x01"
    assert sock.kinds[:3] == ["text", "text", "text"] and sock.kinds[-1] == "bytes"


def test_an_error_frame_arrives_before_the_close(broker, ws):
    client = stomp_over(ws(broker, "/stomp", ["v12.stomp"], text=True))
    client.connect()
    client.send_frame("NOT-A-COMMAND")
    client.expect_error_and_close()
    assert client.sock.close_code == 1000


def test_an_oversized_message_closes_that_connection_with_1009(broker_factory, ws, stomp_client):
    broker = broker_factory(stomp={"max_frame_bytes": 1024})
    queue = f"/queue/{unique('big')}"
    sock = ws(broker, "/stomp", ["v12.stomp"])
    client = stomp_over(sock)
    client.connect()
    # Each frame is within the STOMP limit; the message carrying them is not
    # (the limit is one maximal frame plus 64 KiB).
    frame = encode_frame("SEND", {"destination": queue}, b"x" * 900)
    sock.send_message(frame * (70 * 1024 // len(frame) + 1))
    assert sock.wait_closed() == 1009
    assert "over" in (sock.close_reason or "") and "bytes" in (sock.close_reason or "")
    wait_for(lambda: "stomp-ws" not in connections(broker), what="the connection to end")
    other = stomp_client(broker)  # nothing else suffered
    other.send(queue, b"after")


def test_pings_are_answered(broker, ws):
    sock = ws(broker, "/stomp", ["v12.stomp"], text=True)
    client = stomp_over(sock)
    client.connect()
    sock.ping(b"are you there")
    client.send_frame("SEND", {"destination": "/topic/nobody", "receipt": "x"})
    client.receipt("x")
    assert sock.pongs == [b"are you there"]


def test_an_abrupt_disconnect_leaves_the_broker_serving(broker, ws, stomp_client):
    queue = f"/queue/{unique('abrupt')}"
    sock = ws(broker, "/stomp", ["v12.stomp"])
    client = stomp_over(sock)
    client.connect()
    client.send_frame("SUBSCRIBE", {"id": "1", "destination": queue, "ack": "client", "receipt": "s"})
    client.receipt("s")
    producer = stomp_client(broker)
    producer.send(queue, b"unacked")
    client.expect("MESSAGE")
    sock.send_message(b"SEND\ndestination:/queue/x\n")  # half a frame, then the client crashes
    sock.abort()
    wait_for(lambda: "stomp-ws" not in connections(broker), what="the connection to end")
    consumer = stomp_client(broker)
    consumer.subscribe(queue)  # the unacknowledged message goes to the next consumer
    assert consumer.wait_messages(1)[0].body == b"unacked"


def test_a_stopping_broker_tells_websocket_clients_and_closes_them(broker, ws):
    client = stomp_over(ws(broker, "/stomp", ["v12.stomp"], text=True))
    client.connect()
    # The client reads nothing meanwhile: the broker stops anyway, within its
    # shutdown grace (BrokerHandle.stop fails if the broker thread lingers).
    broker.stop()
    error = client.next_frame()
    assert isinstance(error, frames.Error) and "shutting down" in error.headers["message"]
    assert client.sock.wait_closed() == 1000


# -- MQTT over WebSocket ---------------------------------------------------


def test_mqtt_qos1_over_websocket_with_paho(broker, paho):
    topic = f"plant/{unique()}/temp"
    device = paho(broker, unique("ws-device-"), websocket=True)
    service = paho(broker, unique("tcp-service-"))
    assert device.subscribe((topic, 1)) == [1]
    service.publish(topic, b"21.5", qos=1)
    (message,) = device.wait(1)
    assert (message.payload, message.qos) == (b"21.5", 1)
    assert service.subscribe((f"{topic}/ack", 1)) == [1]
    device.publish(f"{topic}/ack", b"\x00\xffbinary", qos=1)  # waits for the PUBACK
    (reply,) = service.wait(1)
    assert (reply.payload, reply.qos) == (b"\x00\xffbinary", 1)


def test_mqtt_over_websocket_reaches_stomp(broker, paho, stomp_client):
    name = unique("plant")
    stomp = stomp_client(broker)
    stomp.subscribe(f"/topic/{name}.temp")
    device = paho(broker, unique("ws-device-"), websocket=True)
    device.publish(f"{name}/temp", b"19.0", qos=1)
    assert stomp.wait_messages(1)[0].body == b"19.0"


def test_mqtt_refuses_text_messages(broker, ws):
    sock = ws(broker, "/mqtt", ["mqtt"])
    client = RawMqtt(0, sock=sock)
    client.send(packets.Connect(unique("ws-")))
    client.next()
    sock.send_message("\xc0\x00")  # PINGREQ, but as a text message [MQTT-6.0.0-1]
    assert sock.wait_closed() == 1003


def test_mqtt_oversized_message_closes_with_1009(broker_factory, ws, paho):
    broker = broker_factory(mqtt={"max_packet_bytes": 1024})
    sock = ws(broker, "/mqtt", ["mqtt"])
    client = RawMqtt(0, sock=sock)
    client.send(packets.Connect(unique("ws-")))
    client.next()
    publish = client.codec.send(packets.Publish("t/big", b"y" * 900))
    sock.send_message(publish * (70 * 1024 // len(publish) + 1))
    assert sock.wait_closed() == 1009
    other = paho(broker, unique("after-"))
    other.publish("t/big", b"fine", qos=1)


# -- over TLS (wss://, the admin-tls listener) ----------------------------


def test_stomp_over_wss_meets_stomp_over_tcp(broker_factory, pki, stomp_client):
    broker, context = tls_broker(broker_factory, pki), client_context(pki)
    queue = f"/queue/{unique('wss')}"
    sock = WebSocketSocket(broker.running.ports["admin-tls"], "/stomp", ["v12.stomp"], text=True, tls=context)
    try:
        assert sock.subprotocol == "v12.stomp"
        client = stomp_over(sock)
        client.connect()
        client.send_frame("SUBSCRIBE", {"id": "1", "destination": queue, "receipt": "s"})
        client.receipt("s")
        stomp_client(broker).send(queue, b"to the secure side")
        assert client.expect("MESSAGE").body == b"to the secure side"
        assert connections(broker)["stomp-ws"] == sock.local_address  # the TLS client's own address
    finally:
        sock.close()


def test_mqtt_over_wss_with_paho(broker_factory, pki, paho):
    broker, context = tls_broker(broker_factory, pki), client_context(pki)
    topic = f"secure/{unique()}"
    device = paho(broker, unique("wss-device-"), websocket=True, tls=context)
    assert device.subscribe((topic, 1)) == [1]
    paho(broker, unique("tcp-")).publish(topic, b"sealed", qos=1)
    (message,) = device.wait(1)
    assert (message.payload, message.qos) == (b"sealed", 1)


def test_a_client_certificate_over_wss_logs_in_as_its_user(broker_factory, pki):
    broker = tls_broker(broker_factory, pki, auth=CERT_AUTH, client_certs="optional", ca=pki["ca"],
                        cert_users=[{"subject": "CN=sensor-1", "user": "sensor"}])
    port = broker.running.ports["admin-tls"]
    with_certificate = WebSocketSocket(port, "/stomp", ["v12.stomp"], tls=client_context(pki, certificate=True))
    without = WebSocketSocket(port, "/stomp", ["v12.stomp"], tls=client_context(pki))
    try:
        stomp_over(with_certificate).connect()  # no login, no passcode: the certificate's user
        refused = stomp_over(without)
        refused.send_frame("CONNECT", {"accept-version": "1.2", "host": "h"})
        assert "authentication failed" in refused.expect_error_and_close().headers["message"]
    finally:
        with_certificate.close()
        without.close()


def test_websocket_origins_limit_which_pages_may_connect(broker_factory, ws):
    broker = broker_factory(admin={"websocket_origins": ["https://app.example.com"]})
    status, body = raw_http(broker, "GET", "/stomp", {**UPGRADE, "Origin": "https://evil.example.net"})
    assert status == 403 and b"origin https://evil.example.net may not" in body
    status, _ = raw_http(broker, "GET", "/stomp", {**UPGRADE, "Origin": "https://APP.example.com/"})
    assert status == 101  # the same origin, spelled as browsers may
    sock = ws(broker, "/stomp", ["v12.stomp"], text=True)  # no Origin at all: not a browser, not limited
    assert stomp_over(sock).connect().command == "CONNECTED"
