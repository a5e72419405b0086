"""The STOMP codec through its own door: bytes in, frames out; frames in, bytes out.

Round trips for every frame type and version, the same bytes fed whole, byte by
byte and split at every index (h11's ``tr()``), golden vectors from the STOMP 1.2
specification, every RemoteProtocolError the parser raises, and a fuzz property
that arbitrary bytes raise nothing but RemoteProtocolError.
"""

from __future__ import annotations


import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.stomp import codec, frames
from gateway.stomp.codec import LocalProtocolError, RemoteProtocolError, Role, State, StompConnection
from tests.helpers import splits

VERSIONS = ("1.0", "1.1", "1.2")
OTHER = {Role.CLIENT: Role.SERVER, Role.SERVER: Role.CLIENT}
# Which frames each role sends.
SENT_BY = {Role.CLIENT: tuple(frames.CLIENT_FRAMES.values()), Role.SERVER: tuple(frames.SERVER_FRAMES.values())}

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def connection(role: Role, version: str = "1.2", **limits: int) -> StompConnection:
    conn = StompConnection(role, **limits)
    conn.set_version(version)
    return conn


def decode(chunks: list[bytes], role: Role = Role.SERVER, version: str = "1.2", **limits: int) -> list[frames.Frame]:
    """Feed ``chunks`` one by one, collecting frames after each; check nothing is left over."""
    conn = connection(role, version, **limits)
    out: list[frames.Frame] = []
    for chunk in chunks:
        if chunk:
            conn.receive_data(chunk)
            out.extend(conn.events())
    assert conn.buffered_bytes == 0
    assert not conn.mid_frame
    return out




def expected(frame: frames.Frame) -> frames.Frame:
    """What the peer decodes: ``send`` adds content-length to any frame with a body."""
    headers = dict(frame.headers)
    if frame.body:
        headers.setdefault("content-length", str(len(frame.body)))
    return type(frame)(headers, frame.body)


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
