"""STOMP framing through the codec's own door: bytes in, frames out; frames in,
bytes out.

Round trips for every frame type and version, the same bytes fed whole, byte by
byte and split at every index (h11's ``tr()``), heart-beat EOLs between frames,
lazy parsing, buffering and EOF.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.stomp import frames
from gateway.stomp.codec import LocalProtocolError, RemoteProtocolError, Role, State
from tests.support.helpers import splits
from tests.support.stomp_codec_helpers import SENT_BY, VERSIONS, connection, decode, expected

OTHER = {Role.CLIENT: Role.SERVER, Role.SERVER: Role.CLIENT}

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- strategies --------------------------------------------------------------

# The characters the escaping rules care about, the letters of the escapes,
# and UTF-8 sequences of every length.  (A fixed alphabet: drawing from all of
# Unicode costs several times more per example and reaches no other branch.)
ALPHABET = ["\\", ":", "\n", "\r", "\x00", "\t", " ", "c", "n", "r", "a", "\x7f", "é", "\u2028", "\U0001f600"]


def text_st(exclude: str, *, min_size: int = 0) -> st.SearchStrategy[str]:
    return st.text(alphabet=[c for c in ALPHABET if c not in exclude], min_size=min_size, max_size=10)


def header_st(version: str, command: str) -> st.SearchStrategy[dict[str, str]]:
    if version == "1.0" or command in frames.UNESCAPED_COMMANDS:
        # Nothing is escaped: no EOLs anywhere, no colon in a key.
        keys = text_st("\n\r:", min_size=1)
        values = text_st("\n\r")
    elif version == "1.1":
        # 1.1 has no \r escape; a value ending in a raw CR is tested on its own
        # (test_v11_value_ending_in_carriage_return_round_trips).
        keys = text_st("", min_size=1)
        values = text_st("").filter(lambda v: not v.endswith("\r"))
    else:
        keys = text_st("", min_size=1)
        values = text_st("")
    return st.dictionaries(keys.filter(lambda k: k != "content-length"), values, max_size=4)


@st.composite
def frame_st(draw: st.DrawFn, role: Role, version: str) -> frames.Frame:
    cls = draw(st.sampled_from(SENT_BY[role]))
    headers = draw(header_st(version, cls.command))
    body = draw(st.binary(max_size=40)) if cls.command in frames.COMMANDS_WITH_BODY else b""
    return cls(headers, body)


EOL_RUNS = [b"", b"\n", b"\r\n", b"\n\n", b"\r\n\n\r\n"]


# -- round trips -------------------------------------------------------------


@FAST
@given(sender=st.sampled_from(Role), version=st.sampled_from(VERSIONS), data=st.data())
def test_round_trip_every_frame_type(sender: Role, version: str, data: st.DataObject) -> None:
    out = connection(sender, version)
    frame = data.draw(frame_st(sender, version))
    wire = out.send(frame)
    decoded = decode([wire], OTHER[sender], version)
    assert decoded == [expected(frame)]
    # And the decoded frame encodes to the same bytes (content-length now explicit).
    assert out.send(decoded[0]) == wire


@settings(FAST, max_examples=100)
@given(sender=st.sampled_from(Role), version=st.sampled_from(VERSIONS), data=st.data())
def test_many_frames_with_heartbeats_in_any_chunks(sender: Role, version: str, data: st.DataObject) -> None:
    out = connection(sender, version)
    batch = data.draw(st.lists(frame_st(sender, version), min_size=1, max_size=4))
    eols = data.draw(st.lists(st.sampled_from(EOL_RUNS), min_size=len(batch) + 1, max_size=len(batch) + 1))
    wire = eols[0] + b"".join(out.send(f) + eol for f, eol in zip(batch, eols[1:]))
    want = [expected(f) for f in batch]
    assert decode([wire], OTHER[sender], version) == want
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=10)))
    chunks = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)])]
    assert decode(chunks, OTHER[sender], version) == want


@FAST
@given(
    cls=st.sampled_from([frames.Send, frames.Message, frames.Error]),
    version=st.sampled_from(VERSIONS),
    body=st.binary(max_size=64).map(lambda b: b + b"\x00" + b),
)
def test_binary_bodies_with_nul_bytes_use_content_length(cls: type[frames.Frame], version: str, body: bytes) -> None:
    sender = Role.CLIENT if cls is frames.Send else Role.SERVER
    wire = connection(sender, version).send(cls({"k": "v"}, body))
    assert f"content-length:{len(body)}\n".encode() in wire
    assert decode([wire], OTHER[sender], version) == [cls({"k": "v", "content-length": str(len(body))}, body)]


# Interesting wires decoded identically whole, byte by byte and split anywhere.
SPLIT_CORPUS = [
    pytest.param(
        b"SEND\ndestination:/queue/a\n\nhello\x00",
        [frames.Send({"destination": "/queue/a"}, b"hello")],
        id="nul-terminated",
    ),
    pytest.param(
        b"SEND\ncontent-length:5\n\na\x00b\x00c\x00",
        [frames.Send({"content-length": "5"}, b"a\x00b\x00c")],
        id="content-length-with-nuls",
    ),
    pytest.param(
        b"\n\r\n\nSEND\n\n\x00\n\r\nBEGIN\ntransaction:t\n\n\x00\r\n\n",
        [frames.Send({}, b""), frames.Begin({"transaction": "t"}, b"")],
        id="heartbeats-between-frames",
    ),
    pytest.param(
        b"\x00\n\x00CONNECT\naccept-version:1.2\n\n\x00\x00\r\n\x00\x00SEND\n\n\x00\x00",
        [frames.Connect({"accept-version": "1.2"}, b""), frames.Send({}, b"")],
        id="stray-nuls-between-frames",
    ),
    pytest.param(
        b"CONNECT\naccept-version:1.2\n\n\n\x00STOMP\n\n\r\n \t\x00SUBSCRIBE\nid:0\n\n\n\x00",
        [frames.Connect({"accept-version": "1.2"}, b""), frames.Stomp({}, b""), frames.Subscribe({"id": "0"}, b"")],
        id="blank-body-on-bodyless-frames",
    ),
    pytest.param(
        b"SEND\r\ndestination:/queue/a\r\nk:v\r\n\r\nbody\x00",
        [frames.Send({"destination": "/queue/a", "k": "v"}, b"body")],
        id="crlf-headers",
    ),
    pytest.param(
        b"SEND\r\nk:v\n\r\nab\n\ncd\x00",
        [frames.Send({"k": "v"}, b"ab\n\ncd")],
        id="mixed-eols-and-blank-line-in-body",
    ),
    pytest.param(
        b"SEND\nk:a\\cb\\\\c\\nd\\re\n\n\x00",
        [frames.Send({"k": "a:b\\c\nd\re"}, b"")],
        id="escapes",
    ),
    pytest.param(
        "SEND\nclé:välue😀\n\n\x00".encode(),
        [frames.Send({"clé": "välue😀"}, b"")],
        id="utf8-headers",
    ),
]


@pytest.mark.parametrize(("wire", "want"), SPLIT_CORPUS)
def test_same_frames_whole_bytewise_and_split_at_every_index(wire: bytes, want: list[frames.Frame]) -> None:
    for chunks in splits(wire):
        assert decode(chunks) == want, chunks


def test_crlf_frame_whose_body_starts_with_a_line_feed() -> None:
    # STOMP 1.2 §Augmented BNF: EOL = [CR] LF, and the body is *OCTET.  The head
    # ends at the first blank line, "\r\n\r\n"; an LF opening the body is body.
    wire = b"SEND\r\ndestination:/queue/a\r\n\r\n\nhello\x00"
    for chunks in splits(wire):
        assert decode(chunks) == [frames.Send({"destination": "/queue/a"}, b"\nhello")], chunks


def test_crlf_frame_with_content_length_whose_body_starts_with_a_line_feed() -> None:
    wire = b"SEND\r\ncontent-length:3\r\n\r\n\n\x00x\x00"
    assert decode([wire]) == [frames.Send({"content-length": "3"}, b"\n\x00x")]


def test_v11_value_ending_in_carriage_return_round_trips() -> None:
    # STOMP 1.1 has no \r escape and only LF ends a line: header-value is
    # *<any OCTET except LF or ":">, so a trailing CR is part of the value.
    frame = frames.Send({"k": "v\r"}, b"")
    wire = connection(Role.CLIENT, "1.1").send(frame)
    assert wire == b"SEND\nk:v\r\n\n\x00"
    assert decode([wire], Role.SERVER, "1.1") == [frame]


def test_first_of_repeated_headers_wins() -> None:
    # STOMP 1.2 §Repeated Header Entries.
    wire = b"SEND\nfoo:World\nfoo:Hello\ncontent-length:1\ncontent-length:3\n\nx\x00"
    assert decode([wire]) == [frames.Send({"foo": "World", "content-length": "1"}, b"x")]


def test_events_are_lazy_and_the_rest_stays_buffered() -> None:
    conn = connection(Role.SERVER)
    one = b"SEND\n\na\x00"
    conn.receive_data(one * 3)
    events = conn.events()
    assert next(events) == frames.Send({}, b"a")
    assert conn.buffered_bytes == 2 * len(one)
    assert list(conn.events()) == [frames.Send({}, b"a")] * 2
    assert conn.buffered_bytes == 0


def test_partial_frame_and_lone_cr_wait_for_more() -> None:
    conn = connection(Role.SERVER)
    assert list(conn.events()) == []
    conn.receive_data(b"\r")
    assert list(conn.events()) == []
    assert conn.mid_frame and conn.buffered_bytes == 1
    conn.receive_data(b"\nSEND\n")
    assert list(conn.events()) == []
    assert conn.buffered_bytes == len(b"SEND\n")
    conn.receive_data(b"\nxy")
    assert list(conn.events()) == []
    conn.receive_data(b"z\x00")
    assert list(conn.events()) == [frames.Send({}, b"xyz")]
    assert not conn.mid_frame


def test_a_send_keeps_a_blank_body() -> None:
    # Only frames that take no body have a blank one dropped.
    assert decode([b"SEND\n\n\n\x00"]) == [frames.Send({}, b"\n")]


@pytest.mark.parametrize("filler", [b"\x00", b"\n", b"\r\n", b"\x00\r\n\n"])
def test_a_flood_between_frames_is_dropped_as_it_arrives(filler: bytes) -> None:
    # Bytes between frames are never buffered, so no amount of them grows
    # memory, and a frame after them is still held to the frame limit.
    conn = connection(Role.SERVER, max_frame_bytes=32)
    chunk = filler * (64 * 1024 // len(filler))
    for _ in range(16):  # 1 MiB, far beyond the frame limit
        conn.receive_data(chunk)
        assert list(conn.events()) == []
        assert conn.buffered_bytes == 0 and not conn.mid_frame
    conn.receive_data(b"SEND\n\nhi\x00" + filler)
    assert list(conn.events()) == [frames.Send({}, b"hi")]
    conn.receive_data(b"SEND\n\n" + b"x" * 40 + b"\x00")
    with pytest.raises(RemoteProtocolError, match="too large"):
        list(conn.events())


def test_eof_closes_but_buffered_frames_are_still_parsed() -> None:
    conn = connection(Role.SERVER)
    conn.receive_data(b"SEND\n\n\x00SEN")
    conn.receive_data(b"")
    assert conn.state is State.CLOSED
    assert list(conn.events()) == [frames.Send({}, b"")]
    assert conn.mid_frame  # the cut frame is still there, for the caller to report
    with pytest.raises(LocalProtocolError):
        conn.receive_data(b"D\n\n\x00")


@FAST
@given(version=st.sampled_from(VERSIONS), receipt_id=text_st(""))
def test_receipt_is_the_general_encoding_byte_for_byte(version: str, receipt_id: str) -> None:
    """The receipt shortcut a receipted SEND takes says what send() says."""
    conn = connection(Role.SERVER, version=version)
    assert conn.receipt(receipt_id) == conn.send(frames.Receipt({"receipt-id": receipt_id}))
    with pytest.raises(LocalProtocolError):
        connection(Role.CLIENT, version=version).receipt(receipt_id)
