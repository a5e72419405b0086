"""The parser's fast path (a simple head with a content-length, or without one
and with an empty body, and a repeated head reused) against the general parser
it stands in for: the same frames, the same errors with the same ERROR headers,
the same bytes left buffered, for the cases that must fall back and for
whatever Hypothesis builds.

``StompConnection(fast_path=False)`` runs every frame through the general
parser, the reference here.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.stomp.codec import RemoteProtocolError, Role, StompConnection
from tests.support.helpers import splits

Outcome = list[tuple[Any, ...]]


def run(
    chunks: list[bytes],
    *,
    fast: bool,
    role: Role = Role.SERVER,
    version: str = "1.2",
    limits: dict[str, int] | None = None,
    later: dict[str, int] | None = None,
) -> Outcome:
    """Feed ``chunks``, recording every frame (headers in order), the first
    error, and what stays buffered after each chunk.  ``later``: limits set
    after the first frame, as a session does when CONNECT succeeds."""
    conn = StompConnection(role, fast_path=fast, **(limits or {}))
    conn.set_version(version)
    out: Outcome = []
    for chunk in chunks:
        conn.receive_data(chunk)
        try:
            for frame in conn.events():
                out.append((type(frame).__name__, list(frame.headers.items()), frame.body))
                for name, value in (later or {}).items():
                    setattr(conn, name, value)
        except RemoteProtocolError as exc:
            out.append(("error", exc.message, exc.headers, exc.body))
            return out
        out.append(("buffered", conn.buffered_bytes, conn.mid_frame))
    return out


def assert_same(chunks: list[bytes], **options: Any) -> Outcome:
    general = run(chunks, fast=False, **options)
    assert run(chunks, fast=True, **options) == general
    return general


SEND = b"SEND\ndestination:/queue/a\ncontent-length:5\n\nhello\x00"

CASES = [
    pytest.param(SEND * 3, {}, id="simple-repeated"),
    pytest.param(SEND + SEND.replace(b"/queue/a", b"/queue/b") + SEND, {}, id="head-changes-and-back"),
    pytest.param(b"\n\r\n\x00" + SEND + b"\x00\n" + SEND + b"\n\n", {}, id="heart-beats-and-stray-nuls"),
    pytest.param(b"\x00" + SEND + b"\x00\x00" + SEND, {}, id="stray-nul-first"),
    pytest.param(b"SEND\ndestination:/queue/a\n\nhello\x00" * 2, {}, id="no-content-length"),
    pytest.param(b"SEND\r\ndestination:/queue/a\r\ncontent-length:5\r\n\r\nhello\x00" * 2, {}, id="crlf-1.2"),
    pytest.param(
        b"SEND\ndestination:/queue/a\r\ncontent-length:5\n\nhello\x00", {"version": "1.1"}, id="cr-in-value-1.1"
    ),
    pytest.param(b"SEND\ndestination:/queue/a\r\ncontent-length:5\n\nhello\x00", {}, id="cr-at-line-end-1.2"),
    pytest.param(b"CONNECT\nhost:h\r\ncontent-length:0\n\n\x00", {"version": "1.0"}, id="cr-in-connect-1.0"),
    pytest.param(b"SEND\ndestination:/queue/a\\cb\ncontent-length:5\n\nhello\x00" * 2, {}, id="escape"),
    pytest.param(SEND.replace(b"/a", b"/a\\cb"), {"version": "1.0"}, id="backslash-1.0"),
    pytest.param(b"SEND\ndestination:/queue/a\\tb\ncontent-length:5\n\nhello\x00", {}, id="undefined-escape"),
    pytest.param("SEND\ndestination:/queue/\u00e9\ncontent-length:5\n\nhello\x00".encode() * 2, {}, id="non-ascii"),
    pytest.param(b"SEND\ndestination:\xff\ncontent-length:5\n\nhello\x00", {}, id="invalid-utf8"),
    pytest.param(SEND.replace(b"\n", b"\ndestination:/queue/b\n", 1), {}, id="dup-first-wins"),
    pytest.param(b"SEND\ncontent-length:5\ncontent-length:2\n\nhello\x00", {}, id="dup-content-length"),
    pytest.param(b"SEND\ncontent-length:2\ncontent-length:5\n\nhello\x00", {}, id="dup-content-length-short"),
    pytest.param(b"SEND\ndestination\ncontent-length:5\n\nhello\x00", {}, id="no-colon"),
    pytest.param(b"FOO\nreceipt:r1\ncontent-length:5\n\nhello\x00", {}, id="unknown-command-names-receipt"),
    pytest.param(b"SEND\ncontent-length:5\n\nhellox\x00", {}, id="no-nul-after-length"),
    pytest.param(b"SEND\ncontent-length:5\n\nhel", {}, id="incomplete-body"),
    pytest.param(b"SEND\ncontent-length:0\n\n\x00", {}, id="empty-body"),
    pytest.param(b"SEND\ncontent-length:x\n\nhello\x00", {}, id="content-length-not-digits"),
    pytest.param(b"SEND\ncontent-length:00000005\n\nhello\x00", {}, id="content-length-more-digits-than-limit"),
    pytest.param(b"SEND\ncontent-length:" + b"0" * 30 + b"5\n\nhello\x00", {}, id="content-length-30-digits"),
    pytest.param(b"send\ncontent-length:0\n\n\x00", {}, id="lowercase-command"),
    pytest.param(b"ACK\nid:1\ncontent-length:1\n\nx\x00", {}, id="body-on-ack"),
    pytest.param(b"ACK\nid:1\ncontent-length:1\n\n\n\x00", {}, id="blank-body-on-ack"),
    pytest.param(b"ACK\nid:1\ncontent-length:0\n\n\x00", {}, id="empty-ack"),
    pytest.param(b"ACK\nid:1\n\n\x00ACK\nid:2\n\n\x00ACK\nid:2\n\n\x00", {}, id="ack-without-length"),
    pytest.param(b"ACK\nid:1\n\nx\x00", {}, id="body-on-ack-without-length"),
    pytest.param(b"ACK\nid:1\n\n\n\x00", {}, id="blank-body-on-ack-without-length"),
    pytest.param(b"SEND\ndestination:/queue/a\n\n\x00" * 2, {}, id="empty-send-without-length"),
    pytest.param(b"SUBSCRIBE\nid:1\ndestination:/queue/a\nid:2\n\n\x00", {}, id="subscribe-dup-first-wins"),
    pytest.param(b"ACK\nid:1\n\n", {}, id="ack-waiting-for-nul"),
    pytest.param(b"ACK\nid:1\n\n\x00", {"limits": {"max_header_bytes": 3}}, id="ack-header-line-too-long"),
    pytest.param(SEND, {"limits": {"max_frame_bytes": 48}}, id="frame-too-large"),
    pytest.param(SEND, {"limits": {"max_frame_bytes": 49}}, id="frame-just-fits"),
    pytest.param(SEND, {"limits": {"max_headers": 1}}, id="too-many-headers"),
    pytest.param(SEND, {"limits": {"max_header_bytes": 19}}, id="header-line-too-long"),
    pytest.param(SEND, {"limits": {"max_header_bytes": 40}}, id="head-longer-than-line-limit"),
    pytest.param(SEND * 2, {"later": {"max_headers": 1}}, id="headers-limit-lowered-after-cached"),
    pytest.param(SEND * 2, {"later": {"max_header_bytes": 19}}, id="line-limit-lowered-after-cached"),
    pytest.param(SEND * 2, {"later": {"max_frame_bytes": 40}}, id="frame-limit-lowered-after-cached"),
    pytest.param(SEND * 2, {"later": {"max_frame_bytes": 9}}, id="frame-limit-below-length-digits"),
    pytest.param(
        b"MESSAGE\nsubscription:1\ncontent-length:2\n\nhi\x00" * 2, {"role": Role.CLIENT}, id="client-side"
    ),
    pytest.param(b"CONNECT\naccept-version:1.2\ncontent-length:0\n\n\x00", {"version": "1.0"}, id="connect"),
]


@pytest.mark.parametrize(("wire", "options"), CASES)
def test_fast_path_matches_the_general_parser(wire: bytes, options: dict[str, Any]) -> None:
    for chunks in splits(wire):
        assert_same(chunks, **options)


def test_the_reference_sees_what_the_cases_are_about() -> None:
    """The cases above are not vacuous: frames, errors and partial frames all occur."""
    outcomes = [run([wire], fast=False, **options) for wire, options in (case.values for case in CASES)]
    kinds = {entry[0] for outcome in outcomes for entry in outcome}
    assert {"Send", "Ack", "Message", "Connect", "error", "buffered"} <= kinds
    assert run([SEND * 2], fast=False, later={"max_frame_bytes": 40})[1][0] == "error"


# -- property: any mix of simple and awkward frames, split anywhere ----------

# A frame the fast path takes, or one change away from it (most of those
# changes must send it to the general parser, which then accepts or refuses).
PLAIN = st.text(alphabet="abz-/.09", max_size=6)
LINE = st.one_of(
    st.tuples(PLAIN, PLAIN).map(":".join), st.sampled_from(["destination:/queue/a", "a:b:c", "a:", ":b"])
)
RECEIVED = {Role.SERVER: ["SEND", "SEND", "ACK", "CONNECT"], Role.CLIENT: ["MESSAGE", "MESSAGE", "RECEIPT"]}
CHANGES = [
    None, None, None, None, "cr-at-line-end", "crlf", "no-colon", "escape", "bad-escape", "non-ascii", "no-length",
    "second-length", "bad-length", "padded-length", "lowercase", "unknown", "no-nul", "after-nul", "body", "blank-body",
]
BAD_LENGTHS = ["", "x", "-1", " 3", "0003", "\u0663", "9" * 20, "1"]


@st.composite
def wire_frames(draw: st.DrawFn, role: Role) -> bytes:
    change = draw(st.sampled_from(CHANGES))
    command = draw(st.sampled_from(RECEIVED[role]))
    lines = draw(st.lists(LINE, max_size=3))
    body = b"" if command in ("ACK", "CONNECT", "RECEIPT") else draw(st.binary(max_size=6))
    body = {"body": b"x", "blank-body": b"\n"}.get(change, body)
    lines.insert(draw(st.integers(0, len(lines))), f"content-length:{len(body)}")
    added = {
        "no-colon": "abc", "escape": "k:a\\cb", "bad-escape": "k:a\\tb", "non-ascii": "k:\u00e9",
        "second-length": f"content-length:{draw(st.sampled_from(BAD_LENGTHS))}",
    }.get(change)
    if added is not None:
        lines.insert(draw(st.integers(0, len(lines))), added)
    if change == "no-length":
        lines = [line for line in lines if not line.startswith("content-length:")]
    if change == "bad-length":
        bad = draw(st.sampled_from(BAD_LENGTHS))
        lines = [f"content-length:{bad}" if line.startswith("content-length:") else line for line in lines]
    if change == "padded-length":  # valid, unless longer than max_frame_bytes in digits
        lines = [f"content-length:000{len(body)}" if line.startswith("content-length:") else line for line in lines]
    if change == "cr-at-line-end":
        where = draw(st.integers(0, len(lines)))
        lines[where - 1] += "\r"
        command = (command + "\r") if where == 0 else command
    if change in ("lowercase", "unknown"):
        command = command.lower() if change == "lowercase" else "FOO"
    eol = "\r\n" if change == "crlf" else "\n"
    end = {"no-nul": b"", "after-nul": b"x\x00"}.get(change, b"\x00")
    between = draw(st.sampled_from([b"", b"", b"", b"\n", b"\r\n", b"\x00"]))
    return between + eol.join([command, *lines, "", ""]).encode() + body + end


LIMITS = st.fixed_dictionaries(
    {"max_frame_bytes": st.integers(1, 200)},
    optional={"max_headers": st.integers(0, 6), "max_header_bytes": st.integers(1, 30)},
)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    role=st.sampled_from([Role.SERVER, Role.SERVER, Role.CLIENT]),
    repeat=st.integers(1, 3),
    version=st.sampled_from(["1.0", "1.1", "1.2"]),
    limits=st.just({}) | LIMITS,
    later=st.just({}) | LIMITS,
    data=st.data(),
)
def test_property_fast_and_general_paths_agree(
    role: Role, repeat: int, version: str, limits: dict[str, int], later: dict[str, int], data: st.DataObject
) -> None:
    wire = b"".join(data.draw(st.lists(wire_frames(role), min_size=1, max_size=4))) * repeat
    # Anywhere, and around a NUL (the end of a frame, or of its body).
    nuls = [i + d for i, byte in enumerate(wire) if byte == 0 for d in (0, 1)]
    cut = st.integers(0, len(wire)) | st.sampled_from(nuls) if nuls else st.integers(0, len(wire))
    cuts = sorted(data.draw(st.lists(cut, max_size=4)))
    chunks = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)]) if b > a]
    assert_same(chunks, role=role, version=version, limits=limits, later=later)
