"""The STOMP codec against the STOMP 1.2 specification's examples: golden
frames, header escaping per version, which frames each role may send,
heart-beats, and version negotiation.
"""

from __future__ import annotations

import pytest

from gateway.stomp import codec, frames
from gateway.stomp.codec import LocalProtocolError, Role, StompConnection
from tests.support.stomp_codec_helpers import SENT_BY, VERSIONS, connection, decode, expected


# -- golden vectors (STOMP 1.2 specification examples) -----------------------


def test_golden_connect() -> None:
    frame = frames.Connect({"accept-version": "1.2", "host": "stomp.github.org"})
    wire = b"CONNECT\naccept-version:1.2\nhost:stomp.github.org\n\n\x00"
    assert StompConnection(Role.CLIENT).send(frame) == wire
    assert decode([wire], Role.SERVER, "1.0") == [frame]


def test_golden_send_with_content_length() -> None:
    frame = frames.Send({"destination": "/queue/a", "content-type": "text/plain"}, b"hello queue a")
    wire = b"SEND\ndestination:/queue/a\ncontent-type:text/plain\ncontent-length:13\n\nhello queue a\x00"
    assert connection(Role.CLIENT).send(frame) == wire
    assert decode([wire]) == [expected(frame)]


def test_golden_send_without_content_length() -> None:
    wire = b"SEND\ndestination:/queue/a\ncontent-type:text/plain\n\nhello queue a\n\x00"
    assert decode([wire]) == [frames.Send({"destination": "/queue/a", "content-type": "text/plain"}, b"hello queue a\n")]


def test_golden_server_frames() -> None:
    server = connection(Role.SERVER)
    assert server.send(frames.Connected({"version": "1.2"})) == b"CONNECTED\nversion:1.2\n\n\x00"
    assert server.send(frames.Receipt({"receipt-id": "message-12345"})) == b"RECEIPT\nreceipt-id:message-12345\n\n\x00"
    message = frames.Message(
        {"subscription": "0", "message-id": "007", "destination": "/queue/a", "content-type": "text/plain"},
        b"hello queue a",
    )
    wire = (
        b"MESSAGE\nsubscription:0\nmessage-id:007\ndestination:/queue/a\ncontent-type:text/plain\n"
        b"content-length:13\n\nhello queue a\x00"
    )
    assert server.send(message) == wire
    assert decode([wire], Role.CLIENT) == [expected(message)]
    error = b"ERROR\nreceipt-id:message-12345\ncontent-type:text/plain\ncontent-length:3\nmessage:malformed frame received\n\nbad\x00"
    assert decode([error], Role.CLIENT) == [
        frames.Error(
            {
                "receipt-id": "message-12345",
                "content-type": "text/plain",
                "content-length": "3",
                "message": "malformed frame received",
            },
            b"bad",
        )
    ]


def test_explicit_content_length_is_not_repeated() -> None:
    wire = connection(Role.CLIENT).send(frames.Send({"content-length": "2"}, b"hi"))
    assert wire == b"SEND\ncontent-length:2\n\nhi\x00"


def test_empty_body_gets_no_content_length() -> None:
    assert connection(Role.CLIENT).send(frames.Send({"a": "b"})) == b"SEND\na:b\n\n\x00"


@pytest.mark.parametrize(
    ("version", "wire"),
    [
        ("1.2", b"SEND\na\\cb:c\\\\d\\ne\\rf\n\n\x00"),
        ("1.1", b"SEND\na\\cb:c\\\\d\\ne\rf\n\n\x00"),
    ],
)
def test_golden_escaping(version: str, wire: bytes) -> None:
    # STOMP 1.2 §Value Encoding: \r \n \c \\ ; 1.1 has all but \r.
    frame = frames.Send({"a:b": "c\\d\ne\rf"})
    assert connection(Role.CLIENT, version).send(frame) == wire
    assert decode([wire], Role.SERVER, version) == [frame]


def test_v10_neither_escapes_nor_unescapes() -> None:
    client = connection(Role.CLIENT, "1.0")
    assert client.send(frames.Send({"k": "a\\b:c"})) == b"SEND\nk:a\\b:c\n\n\x00"
    # 1.0 cannot carry an EOL in a header: it becomes a space rather than a new line.
    assert client.send(frames.Send({"k": "a\nb\rc"})) == b"SEND\nk:a b c\n\n\x00"
    assert decode([b"SEND\nk:a\\tb\\c\n\n\x00"], Role.SERVER, "1.0") == [frames.Send({"k": "a\\tb\\c"})]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("cls", [frames.Connect, frames.Stomp])
def test_connect_headers_are_not_unescaped(cls: type[frames.Frame], version: str) -> None:
    # STOMP 1.2 §Value Encoding: CONNECT and CONNECTED frames do not escape.
    wire = cls.command.encode() + b"\nlogin:a\\cb\\t\npasscode:x:y\n\n\x00"
    assert decode([wire], Role.SERVER, version) == [cls({"login": "a\\cb\\t", "passcode": "x:y"})]
    assert connection(Role.CLIENT, version).send(cls({"login": "a\\cb\\t", "passcode": "x:y"})) == wire


@pytest.mark.parametrize("version", VERSIONS)
def test_connected_headers_are_not_escaped(version: str) -> None:
    wire = connection(Role.SERVER, version).send(frames.Connected({"server": "gw\\1:2"}))
    assert wire == b"CONNECTED\nserver:gw\\1:2\n\n\x00"
    assert decode([wire], Role.CLIENT, version) == [frames.Connected({"server": "gw\\1:2"})]
    # A MESSAGE with the same header is escaped, for contrast.
    if version != "1.0":
        assert b"server:gw\\\\1\\c2\n" in connection(Role.SERVER, version).send(frames.Message({"server": "gw\\1:2"}))


@pytest.mark.parametrize("role", [Role.CLIENT, Role.SERVER])
@pytest.mark.parametrize("cls", [*frames.CLIENT_FRAMES.values(), *frames.SERVER_FRAMES.values()])
def test_each_role_sends_only_its_own_frames(role: Role, cls: type[frames.Frame]) -> None:
    conn = connection(role)
    if cls in SENT_BY[role]:
        assert conn.send(cls()).startswith(cls.command.encode() + b"\n")
    else:
        with pytest.raises(LocalProtocolError):
            conn.send(cls())


def test_heartbeat_is_one_line_feed() -> None:
    assert StompConnection.heartbeat() == b"\n"
    assert decode([StompConnection.heartbeat() * 3]) == []


def test_set_version_rejects_unknown_versions() -> None:
    conn = StompConnection()
    with pytest.raises(LocalProtocolError):
        conn.set_version("2.0")
    assert conn.version == "1.0"


@pytest.mark.parametrize(
    ("accept_version", "version"),
    [
        (None, "1.0"),
        ("1.0", "1.0"),
        ("1.1", "1.1"),
        ("1.0,1.1", "1.1"),
        ("1.2,1.0", "1.2"),
        ("1.0,1.1,1.2", "1.2"),
        (" 1.1 , 1.2 ", "1.2"),
        ("1.3,1.1", "1.1"),
        ("2.0", None),
        ("", None),
    ],
)
def test_negotiate_version(accept_version: str | None, version: str | None) -> None:
    assert codec.negotiate_version(accept_version) == version
