"""The stored-message record through the record codec, and the records a
store hands back when it opens (``core.storage``: the one shape from the
core's port to the bytes on disk)."""

from __future__ import annotations

import inspect
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from core.storage import MessageStore, NoStore, Recovered, Retained, StoredMessage, StoredSubscription
from persistence import records
from persistence.store import Store

texts = st.text(max_size=20)
messages = st.builds(
    StoredMessage,
    id=texts,
    destination=texts,
    headers=st.dictionaries(texts, texts, max_size=5),
    body=st.binary(max_size=64),
    priority=st.integers(0, 9),
    expires=st.integers(0, 2**62),
    timestamp=st.integers(0, 2**62),
    delivery_count=st.integers(0, 2**32 - 1),
    location=st.just(-1),
)


@given(messages, st.lists(texts, max_size=4), st.integers(-1, 2**50))
def test_a_stored_message_round_trips_through_the_codec(message: StoredMessage, keys: list[str], location: int) -> None:
    payload = records.encode_message(message, keys)
    assert records.decode_message(payload, location) == message._replace(location=location)
    meta, got_keys = records.decode_message_meta(memoryview(payload), location)
    assert meta == message._replace(headers=None, body=None, location=location) and got_keys == keys
    assert records.decode_message_id(payload) == message.id


def test_a_message_without_headers_or_body_reads_back_empty() -> None:
    payload = records.encode_message(StoredMessage("m", "/queue/a", None, None, 4, 0, 1, 0), ["/queue/a"])
    assert records.decode_message(payload) == StoredMessage("m", "/queue/a", {}, b"", 4, 0, 1, 0)


@given(messages, st.one_of(st.none(), st.integers(0, 2)))
def test_a_retained_message_round_trips_with_its_qos(message: StoredMessage, qos: int | None) -> None:
    assert records.decode_retained(records.encode_retained(Retained(message, qos))) == Retained(message, qos)


def test_a_subscription_description_round_trips_and_older_forms_still_read() -> None:
    for selector in (None, "x = 1"):
        for owner in (None, "", "bob"):
            text = records.encode_subscription("/topic/a", selector, owner)
            assert records.decode_subscription("k", text) == StoredSubscription("k", "/topic/a", selector, owner)
    assert records.decode_subscription("k", "/topic/a") == StoredSubscription("k", "/topic/a", None, None)


def test_opening_hands_back_named_records(tmp_path: Path) -> None:
    s = Store(tmp_path, sync="never")
    s.open()
    m = StoredMessage("m1", "/topic/t", {"h": "1"}, b"body", 7, 99, 1_000, 0)
    _, location = s.add_message(m, ["/queue/a", "durable:c:s"])
    s.add_subscription("durable:c:s", "/topic/t", "x = 1", "bob")
    s.retain("a.b", StoredMessage("r1", "/topic/a.b", {}, b"kept", 4, 0, 5, 0), 1)
    s.transaction([], [], commit_key="first")
    s.transaction([], [], commit_key="second")
    s.remember_redeliveries([("m1", 3)])
    s.close()
    s = Store(tmp_path, sync="never")
    r = s.open()
    assert isinstance(r, Recovered) and r.clean
    stub = StoredMessage("m1", "/topic/t", None, None, 7, 99, 1_000, 3, location)  # the noted count folded in
    assert r.queues == {"/queue/a": [stub], "durable:c:s": [stub]}
    assert r.subscriptions == [StoredSubscription("durable:c:s", "/topic/t", "x = 1", "bob")]
    assert r.retained == [Retained(StoredMessage("r1", "/topic/a.b", {}, b"kept", 4, 0, 5, 0), 1)]
    assert r.commit_keys == ["first", "second"]
    assert s.load(location, "/topic/t") == m._replace(location=location)
    s.forget_redeliveries()
    s.close()
    s = Store(tmp_path, sync="never")
    assert s.open().queues["/queue/a"][0].delivery_count == 0
    s.close()


def test_a_damaged_record_loads_as_none_and_is_reported_once(tmp_path: Path) -> None:
    events: list[str] = []
    s = Store(tmp_path, sync="never", log=lambda event, **fields: events.append(event))
    s.open()
    _, location = s.add_message(StoredMessage("m1", "/queue/a", {}, b"body", 4, 0, 1, 0), ["/queue/a"])
    s.flush()
    path = next(tmp_path.glob("*.log"))
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # the body's last byte: the checksum no longer holds
    path.write_bytes(bytes(data))
    assert s.load(location, "/queue/a") is None
    assert s.load(location, "/queue/a") is None
    assert events == ["record_corrupt"] and s.stats()["corrupt_records"] == 1
    s.close()


def test_the_store_and_the_null_store_take_every_port_call_as_the_port_names_it() -> None:
    # What mypy checks where app.py hands the store to the broker, kept here
    # too: the implementation satisfies the contract structurally.
    calls = {name: member for name, member in vars(MessageStore).items() if inspect.isfunction(member) and not name.startswith("_")}
    assert len(calls) == 10
    for implementation in (Store, NoStore):
        for name, member in calls.items():
            assert list(inspect.signature(getattr(implementation, name)).parameters) == list(inspect.signature(member).parameters), (implementation, name)
