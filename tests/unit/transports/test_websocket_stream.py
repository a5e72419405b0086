"""WebSocketStream over Trio memory streams, with a wsproto client on the other
end: what the broker's connection machinery reads and writes through it."""

from __future__ import annotations

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
import trio.testing
import wsproto
from wsproto import events as ws

from gateway.admin.api import Response
from gateway.transports.websocket import (
    MQTT_SUBPROTOCOLS, STOMP_SUBPROTOCOLS, Endpoint, WebSocketStream, choose_subprotocol,
)


def endpoint(text: bool = True, max_message_bytes: int = 1000) -> Endpoint:
    return Endpoint("stomp-ws" if text else "mqtt-ws", lambda *a: None, STOMP_SUBPROTOCOLS if text else MQTT_SUBPROTOCOLS,
                    max_message_bytes, text=text)


class Peer:
    """The client side: a wsproto client connection over the other memory stream."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.ws = wsproto.Connection(wsproto.ConnectionType.CLIENT)

    async def send(self, event: ws.Event) -> None:
        await self.stream.send_all(self.ws.send(event))

    async def next_event(self) -> ws.Event:
        while True:
            for event in self.ws.events():
                return event
            data = await self.stream.receive_some(65536)
            self.ws.receive_data(data or None)


def pair(**kwargs) -> tuple[WebSocketStream, Peer]:
    server_side, client_side = trio.testing.memory_stream_pair()
    stream = WebSocketStream(server_side, wsproto.Connection(wsproto.ConnectionType.SERVER), endpoint(**kwargs))
    return stream, Peer(client_side)


@pytest.mark.parametrize(("ep", "offered", "chosen"), [
    (endpoint(), ["v10.stomp", "v12.stomp", "v11.stomp"], "v12.stomp"),
    (endpoint(), [], None),
    (endpoint(text=False), ["mqttv3.1", "mqtt"], "mqtt"),
])
def test_the_preferred_offered_subprotocol_is_chosen(ep, offered, chosen):
    assert choose_subprotocol(ep, offered) == chosen


@pytest.mark.parametrize("offered", [["v12.stomp"], ["MQTT"], ["mqtt5"]])
def test_only_unspoken_subprotocols_get_a_400_naming_them(offered):
    refusal = choose_subprotocol(endpoint(text=False), offered)
    assert isinstance(refusal, Response) and refusal.status == 400
    assert offered[0].encode() in refusal.body and b"mqtt, mqttv3.1" in refusal.body


async def test_payloads_come_out_in_pieces_of_at_most_max_bytes():
    stream, peer = pair()
    await peer.send(ws.TextMessage(data="CONNECT\n\n\x00"))
    await peer.send(ws.BytesMessage(data=b"SEND\n\n", message_finished=False))
    await peer.send(ws.BytesMessage(data=b"body\x00"))
    got = bytearray()
    while len(got) < len(b"CONNECT\n\n\x00SEND\n\nbody\x00"):
        piece = await stream.receive_some(4)
        assert 0 < len(piece) <= 4
        got += piece
    assert got == b"CONNECT\n\n\x00SEND\n\nbody\x00"


async def test_pings_are_answered_with_their_payload():
    stream, peer = pair()
    await peer.send(ws.Ping(payload=b"p1"))
    await peer.send(ws.BytesMessage(data=b"x"))
    assert await stream.receive_some() == b"x"
    assert await peer.next_event() == ws.Pong(payload=b"p1")


@pytest.mark.parametrize(("text", "data", "kind"), [
    (True, "MESSAGE\n\nhé\x00".encode(), ws.TextMessage),
    (True, b"MESSAGE\n\n\xff\x00", ws.BytesMessage),  # not UTF-8: binary
    (False, b"\x30\x03\x00\x01t", ws.BytesMessage),  # MQTT: always binary
])
async def test_send_all_is_one_message_text_only_when_it_can_be(text, data, kind):
    stream, peer = pair(text=text)
    await stream.send_all(data)
    event = await peer.next_event()
    assert type(event) is kind and event.message_finished
    assert (event.data.encode() if kind is ws.TextMessage else event.data) == data


async def test_an_oversized_message_is_closed_with_1009_even_in_fragments():
    stream, peer = pair(max_message_bytes=10)
    await peer.send(ws.BytesMessage(data=b"123456", message_finished=False))
    await peer.send(ws.BytesMessage(data=b"789012"))
    assert await stream.receive_some() == b"123456"
    with pytest.raises(trio.BrokenResourceError, match="over 10 bytes"):
        await stream.receive_some()
    close = await peer.next_event()
    assert isinstance(close, ws.CloseConnection) and close.code == 1009


async def test_message_size_is_counted_per_message():
    stream, peer = pair(max_message_bytes=10)
    for _ in range(5):
        await peer.send(ws.BytesMessage(data=b"12345678"))
    got = bytearray()
    while len(got) < 40:
        got += await stream.receive_some()
    assert got == b"12345678" * 5


async def test_text_on_mqtt_is_closed_with_1003():
    stream, peer = pair(text=False)
    await peer.send(ws.TextMessage(data="\xc0\x00"))
    with pytest.raises(trio.BrokenResourceError):
        await stream.receive_some()
    close = await peer.next_event()
    assert isinstance(close, ws.CloseConnection) and close.code == 1003


async def test_the_peers_close_is_answered_and_is_eof():
    stream, peer = pair()
    await peer.send(ws.BytesMessage(data=b"last"))
    await peer.send(ws.CloseConnection(code=1000))
    assert await stream.receive_some() == b"last"
    assert await stream.receive_some() == b""
    assert await stream.receive_some() == b""
    reply = await peer.next_event()
    assert isinstance(reply, ws.CloseConnection) and reply.code == 1000
    with pytest.raises(trio.ClosedResourceError):
        await stream.send_all(b"too late")


async def test_a_lost_transport_is_eof():
    stream, peer = pair()
    await peer.stream.aclose()
    assert await stream.receive_some() == b""


async def test_send_eof_is_a_close_after_which_reading_goes_on_until_the_peers():
    stream, peer = pair()
    await stream.send_eof()
    await peer.send(ws.BytesMessage(data=b"in flight"))  # sent before the peer saw our close
    close = await peer.next_event()
    assert isinstance(close, ws.CloseConnection) and close.code == 1000
    await peer.send(close.response())
    assert await stream.receive_some() == b"in flight"
    assert await stream.receive_some() == b""


async def test_aclose_waits_for_the_peers_close_but_not_forever(autojump_clock):
    stream, peer = pair()
    started = trio.current_time()
    await stream.aclose()  # the peer never answers
    assert 0.9 <= trio.current_time() - started <= 1.1
    close = await peer.next_event()
    assert isinstance(close, ws.CloseConnection)
    assert await peer.stream.receive_some() == b""  # and the transport is closed


async def test_aclose_forcefully_still_closes_the_transport():
    stream, peer = pair()
    await trio.aclose_forcefully(stream)
    assert await peer.stream.receive_some() == b""


@settings(max_examples=300)
@given(chunks=st.lists(st.binary(max_size=64), max_size=8), text=st.booleans())
def test_arbitrary_bytes_from_the_peer_end_only_in_data_eof_or_a_broken_stream(chunks, text):
    """Fuzz: whatever a client sends, the stream yields payload bytes, EOF or
    BrokenResourceError (which the server handles), and closes cleanly."""

    async def main() -> None:
        server_side, client_side = trio.testing.memory_stream_pair()
        stream = WebSocketStream(server_side, wsproto.Connection(wsproto.ConnectionType.SERVER),
                                 endpoint(text=text, max_message_bytes=100))
        for chunk in chunks:
            await client_side.send_all(chunk)
        await client_side.send_eof()
        for _ in range(len(chunks) * 64 + 2):  # each call consumes input or ends the stream
            try:
                if not await stream.receive_some(16):
                    break
            except trio.BrokenResourceError:
                break
        else:
            raise AssertionError("the stream neither ended nor broke")
        await stream.aclose()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@st.composite
def client_frames(draw) -> bytes:
    """One masked client frame, legal or not: any FIN, opcode (continuations
    and unknown ones included), masking key and payload."""
    fin = draw(st.booleans())
    opcode = draw(st.sampled_from([0x0, 0x1, 0x2, 0x3, 0x8, 0x9, 0xA]))
    payload = draw(st.one_of(st.binary(max_size=40), st.text(max_size=20).map(str.encode)))
    key = draw(st.binary(min_size=4, max_size=4))
    masked = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    return bytes([fin << 7 | opcode, 0x80 | len(payload)]) + key + masked


@settings(max_examples=300)
@given(frames=st.lists(client_frames(), max_size=10), text=st.booleans(), close=st.booleans())
def test_any_sequence_of_client_frames_ends_only_in_data_eof_or_a_broken_stream(frames, text, close):
    async def main() -> None:
        server_side, client_side = trio.testing.memory_stream_pair()
        stream = WebSocketStream(server_side, wsproto.Connection(wsproto.ConnectionType.SERVER),
                                 endpoint(text=text, max_message_bytes=60))
        await client_side.send_all(b"".join(frames))
        if close:
            await client_side.send_eof()
        for _ in range(len(frames) * 64 + 2):
            try:
                with trio.move_on_after(1) as idle:
                    data = await stream.receive_some(16)
                if idle.cancelled_caught or not data:  # waiting for more, or ended
                    break
            except trio.BrokenResourceError:
                break
        else:
            raise AssertionError("the stream neither ended, broke nor waited")
        await stream.aclose()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


class RecordingServer:
    stopping = False

    def __init__(self) -> None:
        self.served: list[str] = []

    async def serve_stream(self, name, factory, stream, peer) -> None:
        self.served.append(name)


HEADER_NAMES = ("host", "connection", "upgrade", "sec-websocket-key", "sec-websocket-version",
                "sec-websocket-protocol", "sec-websocket-extensions", "origin")
GOOD = {"host": "127.0.0.1:8161", "connection": "Upgrade", "upgrade": "websocket",
        "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==", "sec-websocket-version": "13",
        "sec-websocket-protocol": "v12.stomp"}


@settings(max_examples=300)
@given(changes=st.dictionaries(st.sampled_from(HEADER_NAMES),
                               st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=30),
                               max_size=4),
       path=st.sampled_from(["/stomp", "/mqtt"]))
def test_any_upgrade_request_is_served_or_refused_with_a_4xx(changes, path):
    """Fuzz the handshake with h11-legal header values: never an exception."""
    from gateway.admin.api import Request
    from gateway.transports.websocket import Upgrades

    async def main() -> None:
        server = RecordingServer()
        upgrades = Upgrades(server, {"/stomp": endpoint(), "/mqtt": endpoint(text=False)})
        server_side, _client_side = trio.testing.memory_stream_pair()
        request = Request("GET", path, {**GOOD, **{k: v.strip() for k, v in changes.items()}})
        refused = await upgrades.serve(upgrades.route(request), request, b"", server_side, "127.0.0.1:1")
        assert (refused is None and server.served) or (400 <= refused.status < 500 and not server.served)

    trio.run(main)
