"""Every RemoteProtocolError the STOMP parser raises, whole and at every split,
the size limits applied before the body or line end arrives, and a fuzz
property that arbitrary bytes raise nothing but RemoteProtocolError.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.stomp import codec, frames
from gateway.stomp.codec import LocalProtocolError, RemoteProtocolError, Role, State, StompConnection
from tests.support.helpers import splits
from tests.support.stomp_codec_helpers import VERSIONS, connection, decode


# -- errors ------------------------------------------------------------------

ERROR_CASES = [
    pytest.param(Role.SERVER, "1.2", {}, b"FOO\n\n\x00", "unknown command", id="unknown-command"),
    pytest.param(Role.SERVER, "1.2", {}, b"MESSAGE\n\n\x00", "unknown command", id="server-frame-to-server"),
    pytest.param(Role.CLIENT, "1.2", {}, b"SEND\n\n\x00", "unknown command", id="client-frame-to-client"),
    pytest.param(Role.SERVER, "1.2", {}, b"send\n\n\x00", "unknown command", id="lowercase-command"),
    pytest.param(Role.SERVER, "1.2", {}, b"SEND\n\n\x00\rSEND\n\n\x00", "carriage return", id="bare-cr"),
    pytest.param(Role.SERVER, "1.2", {}, b"SEND\nnocolon\n\n\x00", "colon", id="header-without-colon"),
    pytest.param(Role.SERVER, "1.2", {}, b"SEND\nk:\xff\xfe\n\n\x00", "UTF-8", id="invalid-utf8-value"),
    pytest.param(Role.SERVER, "1.2", {}, b"SEND\n\xc3:v\n\n\x00", "UTF-8", id="invalid-utf8-key"),
    pytest.param(Role.SERVER, "1.2", {}, b"SEND\nk:a\\tb\n\n\x00", "escape", id="undefined-escape-tab"),
    pytest.param(Role.SERVER, "1.2", {}, b"SEND\nk\\x:v\n\n\x00", "escape", id="undefined-escape-in-key"),
    pytest.param(Role.SERVER, "1.2", {}, b"SEND\nk:a\\\n\n\x00", "escape", id="trailing-backslash"),
    pytest.param(Role.SERVER, "1.1", {}, b"SEND\nk:a\\rb\n\n\x00", "escape", id="cr-escape-undefined-in-1.1"),
    pytest.param(Role.CLIENT, "1.2", {}, b"MESSAGE\nk:\\t\n\n\x00", "escape", id="undefined-escape-client-side"),
    pytest.param(Role.SERVER, "1.2", {}, b"SEND\ncontent-length:abc\n\n\x00", "content-length", id="cl-letters"),
    pytest.param(Role.SERVER, "1.2", {}, b"SEND\ncontent-length:-1\n\n\x00", "content-length", id="cl-negative"),
    pytest.param(Role.SERVER, "1.2", {}, b"SEND\ncontent-length:\n\n\x00", "content-length", id="cl-empty"),
    pytest.param(Role.SERVER, "1.2", {}, b"SEND\ncontent-length: 1\n\nx\x00", "content-length", id="cl-space"),
    pytest.param(
        Role.SERVER, "1.2", {}, "SEND\ncontent-length:\u0661\n\nx\x00".encode(), "content-length", id="cl-non-ascii-digit"
    ),
    pytest.param(
        Role.SERVER, "1.2", {}, b"SEND\ncontent-length:" + b"9" * 5000 + b"\n\n\x00", "", id="cl-5000-digits"
    ),
    pytest.param(Role.SERVER, "1.2", {}, b"SEND\ncontent-length:2\n\nabc\x00", "NUL", id="cl-body-not-nul-terminated"),
    pytest.param(
        Role.SERVER, "1.2", {"max_frame_bytes": 16}, b"SEND\n\n" + b"x" * 20 + b"\x00", "too large", id="too-large-by-nul"
    ),
    pytest.param(
        Role.SERVER,
        "1.2",
        {"max_frame_bytes": 16},
        b"SEND\n\n" + b"x" * 10 + b"\x00",
        "too large",
        id="too-large-by-one-byte",
    ),
    pytest.param(
        Role.SERVER,
        "1.2",
        {"max_frame_bytes": 32},
        b"SEND\ncontent-length:20\n\n" + b"x" * 20 + b"\x00",
        "too large",
        id="too-large-by-content-length",
    ),
    pytest.param(
        Role.SERVER,
        "1.2",
        {"max_frame_bytes": 16},
        b"SEND\nk:" + b"v" * 30 + b"\n\n\x00",
        "too large",
        id="too-large-head",
    ),
    pytest.param(
        Role.SERVER, "1.2", {"max_headers": 2}, b"SEND\na:1\nb:2\nc:3\n\n\x00", "too many headers", id="too-many-headers"
    ),
    pytest.param(
        Role.SERVER,
        "1.2",
        {"max_header_bytes": 8},
        b"SEND\nk:" + b"v" * 20 + b"\n\n\x00",
        "too long",
        id="header-line-too-long",
    ),
    pytest.param(
        Role.SERVER,
        "1.2",
        {},
        b"SUBSCRIBE\nid:0\ndestination:/queue/a\n\nxyz\x00",
        "must not have a body",
        id="body-on-subscribe",
    ),
    pytest.param(
        Role.SERVER, "1.2", {}, b"ACK\ncontent-length:1\n\nx\x00", "must not have a body", id="body-on-ack-by-length"
    ),
    pytest.param(
        Role.SERVER, "1.2", {}, b"CONNECT\n\n\n x\n\x00", "must not have a body", id="non-blank-body-on-connect"
    ),
    pytest.param(Role.SERVER, "1.2", {}, b"\x00\rSEND\n\n\x00", "carriage return", id="bare-cr-after-nul"),
    pytest.param(
        Role.CLIENT, "1.2", {}, b"RECEIPT\nreceipt-id:1\n\nx\x00", "must not have a body", id="body-on-receipt"
    ),
]


def assert_failed(conn: StompConnection, error: RemoteProtocolError, fragment: str) -> None:
    assert fragment in error.headers["message"]
    assert error.headers["message"] == error.message == str(error)
    assert conn.state is State.ERROR
    with pytest.raises(LocalProtocolError):
        list(conn.events())
    with pytest.raises(LocalProtocolError):
        conn.receive_data(b"SEND\n\n\x00")


@pytest.mark.parametrize(("role", "version", "limits", "wire", "fragment"), ERROR_CASES)
def test_protocol_errors(role: Role, version: str, limits: dict[str, int], wire: bytes, fragment: str) -> None:
    conn = connection(role, version, **limits)
    conn.receive_data(wire)
    with pytest.raises(RemoteProtocolError) as info:
        list(conn.events())
    assert_failed(conn, info.value, fragment)


@pytest.mark.parametrize(("role", "version", "limits", "wire", "fragment"), ERROR_CASES)
def test_protocol_errors_whatever_the_split(
    role: Role, version: str, limits: dict[str, int], wire: bytes, fragment: str
) -> None:
    for chunks in splits(wire):
        conn = connection(role, version, **limits)
        with pytest.raises(RemoteProtocolError) as info:
            for chunk in chunks:
                conn.receive_data(chunk)
                list(conn.events())
        assert conn.state is State.ERROR, chunks
        assert info.value.headers["message"]


def test_limit_errors_say_which_limit() -> None:
    conn = connection(Role.SERVER, max_frame_bytes=16)
    conn.receive_data(b"SEND\n\n" + b"x" * 20)
    with pytest.raises(RemoteProtocolError) as info:
        list(conn.events())
    assert info.value.headers == {"message": "frame too large", "max-frame-bytes": "16"}

    conn = connection(Role.SERVER, max_headers=1)
    conn.receive_data(b"SEND\na:1\nb:2\n\n\x00")
    with pytest.raises(RemoteProtocolError) as info:
        list(conn.events())
    assert info.value.headers == {"message": "too many headers", "max-headers": "1"}

    conn = connection(Role.SERVER, max_header_bytes=4)
    conn.receive_data(b"SEND\nk:12345\n\n\x00")
    with pytest.raises(RemoteProtocolError) as info:
        list(conn.events())
    assert info.value.headers == {"message": "header line too long", "max-header-bytes": "4"}


def test_limits_allow_frames_exactly_at_them() -> None:
    wire = b"SEND\nk:123\n\nxy\x00"  # 15 bytes, one header, a 5-character line
    assert decode([wire], max_frame_bytes=len(wire), max_headers=1, max_header_bytes=5) == [frames.Send({"k": "123"}, b"xy")]
    wire = b"SEND\ncontent-length:2\n\nxy\x00"
    assert decode([wire], max_frame_bytes=len(wire)) == [frames.Send({"content-length": "2"}, b"xy")]


def test_header_line_limit_counts_bytes_whether_whole_or_split() -> None:
    # max_header_bytes is in bytes: a line of 10 characters but 18 UTF-8 bytes
    # breaks a 10-byte limit, and must do so however the bytes arrive.
    wire = b"SEND\nk:" + "é".encode() * 8 + b"\n\n\x00"
    for chunks in splits(wire):
        conn = connection(Role.SERVER, max_header_bytes=10)
        with pytest.raises(RemoteProtocolError):
            for chunk in chunks:
                conn.receive_data(chunk)
                list(conn.events())


def feed_until_error(conn: StompConnection, pieces: list[bytes]) -> int:
    """Feed pieces until the connection raises; return how many bytes it took."""
    fed = 0
    with pytest.raises(RemoteProtocolError) as info:
        for piece in pieces:
            conn.receive_data(piece)
            fed += len(piece)
            list(conn.events())
    assert info.value.headers["message"]
    assert conn.state is State.ERROR
    return fed


def test_oversized_content_length_is_refused_before_the_body_arrives() -> None:
    conn = connection(Role.SERVER, max_frame_bytes=100)
    fed = feed_until_error(conn, [b"SEND\ncontent-length:1000\n", b"\n"])
    assert fed == len(b"SEND\ncontent-length:1000\n\n")


def test_oversized_body_without_content_length_is_refused_before_its_nul() -> None:
    conn = connection(Role.SERVER, max_frame_bytes=64)
    fed = feed_until_error(conn, [b"SEND\n\n"] + [b"x" * 10] * 1000)
    assert fed <= 64 + 10


def test_unterminated_head_is_refused_at_the_frame_limit() -> None:
    conn = connection(Role.SERVER, max_frame_bytes=32)
    fed = feed_until_error(conn, [b"SEND\n"] + [b"k:v\n"] * 1000)
    assert fed <= 32 + 4


def test_unterminated_head_is_refused_at_the_header_count_limit() -> None:
    # (max_headers + 1) lines of at most max_header_bytes (+ CRLF) bound the head.
    conn = connection(Role.SERVER, max_headers=2, max_header_bytes=8)
    fed = feed_until_error(conn, [b"SEND\n"] + [b"a:1\n"] * 1000)
    assert fed <= 3 * (8 + 2) + 2 + 4


def test_long_header_line_is_refused_before_its_end() -> None:
    conn = connection(Role.SERVER, max_header_bytes=8)
    fed = feed_until_error(conn, [b"SEND\nk:"] + [b"v"] * 1000)
    assert fed <= len(b"SEND\n") + 8 + 2


def test_long_command_line_is_refused_before_its_end() -> None:
    conn = connection(Role.SERVER, max_header_bytes=8)
    fed = feed_until_error(conn, [b"S"] * 1000)
    assert fed <= 8 + 2


def test_unknown_command_is_refused_at_its_line_end() -> None:
    conn = connection(Role.SERVER)
    assert feed_until_error(conn, [b"FOO\n", b"k:v\n" * 100]) == len(b"FOO\n")


def test_large_body_in_small_pieces() -> None:
    body = bytes(range(1, 256)) * 40
    wire = b"SEND\n\n" + body + b"\x00SEND\n\n\x00"
    chunks = [wire[i : i + 7] for i in range(0, len(wire), 7)]
    assert decode(chunks) == [frames.Send({}, body), frames.Send({}, b"")]


# -- fuzz --------------------------------------------------------------------

FRAGMENTS = [
    b"SEND", b"CONNECT", b"STOMP", b"SUBSCRIBE", b"ACK", b"MESSAGE", b"ERROR", b"RECEIPT", b"CONNECTED",
    b"\n", b"\r\n", b"\r", b"\n\n", b":", b"\\", b"\\c", b"\\n", b"\\t", b"\x00",
    b"content-length:", b"0", b"3", b"99999999999999999999", b"k:v", b"destination:/queue/a",
    b"\xff", b"\xc3", b"\xc3\xa9", b"\xf0\x9f\x98\x80",
]  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    pieces=st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.binary(max_size=6)), max_size=40),
    cuts=st.lists(st.integers(0, 400), max_size=8),
    role=st.sampled_from([Role.SERVER, Role.CLIENT]),
    version=st.sampled_from(VERSIONS),
    max_frame_bytes=st.sampled_from([8, 40, codec.MAX_FRAME_BYTES]),
    max_headers=st.sampled_from([0, 2, codec.MAX_HEADERS]),
    max_header_bytes=st.sampled_from([3, 12, codec.MAX_HEADER_BYTES]),
    eof=st.booleans(),
)
def test_fuzz_arbitrary_bytes_raise_only_remote_protocol_error(
    pieces: list[bytes],
    cuts: list[int],
    role: Role,
    version: str,
    max_frame_bytes: int,
    max_headers: int,
    max_header_bytes: int,
    eof: bool,
) -> None:
    wire = b"".join(pieces)
    cuts = sorted(c for c in cuts if c <= len(wire))
    chunks = [c for c in (wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)])) if c]
    if eof:
        chunks.append(b"")
    conn = connection(
        role, version, max_frame_bytes=max_frame_bytes, max_headers=max_headers, max_header_bytes=max_header_bytes
    )
    try:
        for chunk in chunks:
            conn.receive_data(chunk)
            for frame in conn.events():
                assert isinstance(frame, frames.Frame)
    except RemoteProtocolError as error:
        assert error.headers["message"]
        assert conn.state is State.ERROR
