"""A MESSAGE built in pieces (gateway.stomp.delivery) is byte for byte what
the codec writes for the same headers in the same order: per version, for
ids, names and headers that need escaping, temporary destinations, redelivered
and persistent messages, and names too long for the destination cache."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core import names
from core.messages import Message
from gateway.stomp import delivery, frames
from gateway.stomp.codec import Role, StompConnection

JOINED = delivery.JOINED_BODY_BYTES
OWN = {"subscription", "message-id", "destination", "timestamp", "expires", "priority", "persistent",
       "redelivered", "x-delivery-count", "content-length"}
TEXT = st.text(alphabet="ab:\\\n\r.\u00e9 ", min_size=1, max_size=6)
NAME = st.text(alphabet="ab:\\\u00e9-", min_size=1, max_size=8)
DESTINATIONS = st.one_of(
    st.tuples(st.sampled_from(["/queue/", "/topic/", "/temp-queue/", "/temp-topic/"]), NAME).map("".join),
    NAME.map(lambda name: f"/temp-queue/{name}.~17-a3f9c2"),  # a private name: its owner sees /temp-queue/name
    NAME.map(lambda name: "/queue/" + name + "x" * delivery.CACHED_CHARS),
)


def written(version: str, sub_id: str, message: Message, destination: str) -> bytes:
    """What StompConnection.send makes of the same MESSAGE."""
    headers = {"subscription": sub_id, "message-id": message.id, "destination": destination,
               "timestamp": str(message.timestamp), "expires": str(message.expires), "priority": str(message.priority)}
    if message.persistent:
        headers["persistent"] = "true"
    headers["redelivered"] = "true" if message.redeliveries else "false"
    if message.redeliveries:
        headers["x-delivery-count"] = str(message.redeliveries)
    headers.update(message.headers or {})
    headers["content-length"] = str(len(message.body or b""))
    conn = StompConnection(Role.SERVER)
    conn.set_version(version)
    return conn.send(frames.Message(headers, message.body or b""))


@settings(max_examples=300, deadline=None)
@given(
    version=st.sampled_from(["1.0", "1.1", "1.2"]),
    sub_id=TEXT,
    message_id=st.one_of(st.just("ID-ab12-7"), TEXT),
    destination=DESTINATIONS,
    headers=st.dictionaries(TEXT.filter(lambda key: key not in OWN), TEXT, max_size=3),
    body=st.binary(max_size=8) | st.sampled_from([b"x" * JOINED, b"y" * (JOINED + 1)]),
    persistent=st.booleans(),
    redeliveries=st.sampled_from([0, 0, 1, 5]),
    numbers=st.tuples(st.integers(0, 2**41), st.integers(0, 2**41), st.integers(0, 9)),
)
def test_pieces_are_what_the_codec_writes(
    version: str, sub_id: str, message_id: str, destination: str, headers: dict[str, str], body: bytes,
    persistent: bool, redeliveries: int, numbers: tuple[int, int, int],
) -> None:
    address = names.parse(destination)
    assert isinstance(address, names.Address), address
    timestamp, expires, priority = numbers
    message = Message(message_id, address, headers, body, persistent=persistent, priority=priority,
                      expires=expires, timestamp=timestamp, redeliveries=redeliveries)
    conn = StompConnection(Role.SERVER)
    conn.set_version(version)
    expected = written(version, sub_id, message, names.owner_name(address))
    # Twice: once filling the destination cache, once from it.
    for _ in range(2):
        tagged, shared, rest = delivery.shared(message, version, conn.escape)
        assert tagged == version
        assert (rest is None) == (len(body) <= JOINED)
        assert delivery.prefix(sub_id, conn.escape) + shared + (b"" if rest is None else rest + b"\x00") == expected


def test_one_name_escapes_per_version() -> None:
    """The cache keeps a line per version: 1.0 cannot escape a colon, 1.1 does."""
    address = names.parse("/queue/a:b")
    assert isinstance(address, names.Address)
    lines = {}
    for version in ("1.0", "1.1", "1.0"):
        conn = StompConnection(Role.SERVER)
        conn.set_version(version)
        message = Message("m1", address, {}, b"")
        lines[version] = delivery.shared(message, version, conn.escape)[1].split(b"\n")[1]
    assert lines == {"1.0": b"destination:/queue/a:b", "1.1": b"destination:/queue/a\\cb"}
