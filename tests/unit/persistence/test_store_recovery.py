"""The store through its own door: what open() recovers after a crash and a
clean restart, and how references keep a message alive and let it go."""

from __future__ import annotations

import shutil
from pathlib import Path

from persistence import settings
from persistence.journal import segment_name
from tests.support.store_helpers import crash, message, opened, reopen, state, subscriptions, workload


def test_an_empty_folder_opens_empty(tmp_path: Path) -> None:
    s, r = opened(tmp_path / "store")
    assert state(r) == ({}, {}, {}) and not r.clean and r.replayed_records == 0
    s.close()
    s, r = opened(tmp_path / "store")
    assert r.clean
    s.close()


def test_everything_survives_a_crash_and_a_clean_restart(tmp_path: Path) -> None:
    s, _ = opened(tmp_path)
    workload(s)
    s2, r = reopen(tmp_path, s)
    subs, queues, kv = state(r)
    assert subs == {"durable:c:s": "/topic/t"}
    assert kv == {"retained": {"a/b": b"value"}}
    assert [m[0] for m in queues["/queue/a"]] == [f"q{i}" for i in range(60) if i % 3 and i != 1] + ["tx1"]
    assert [m[0] for m in queues["durable:c:s"]] == [f"t{i}" for i in range(60) if i != 1]
    assert [m[0] for m in queues["/queue/copy"]] == [f"t{i}" for i in range(60) if i % 4]
    assert [m[0] for m in queues["/queue/b"]] == ["tx2"]
    assert all(m.headers is None and m.body is None for q in r.queues.values() for m in q)  # metadata only
    assert not r.clean and r.corrupt_records == 0
    full = s2.read_message(r.queues["/queue/b"][0].location)
    assert (full.id, full.headers, full.body) == ("tx2", {"h": "tx2"}, b"body")
    s2.close()
    s3, again = opened(tmp_path)
    assert again.clean and state(again) == state(r) and again.replayed_records == 0
    s3.close()


def test_a_message_is_stored_once_and_dies_with_its_last_reference(tmp_path: Path) -> None:
    s, _ = opened(tmp_path)
    s.add_subscription("d1", "/topic/t")
    s.add_subscription("d2", "/topic/t")
    s.add_message(message("m", "/topic/t", body=b"UNIQUE-BODY"), ["d1", "d2", "/queue/q"])
    s.flush()
    assert (tmp_path / segment_name(1)).read_bytes().count(b"UNIQUE-BODY") == 1
    s.ack("d1", "m")
    s.ack("/queue/q", "m")
    s, r = reopen(tmp_path, s)
    assert {k: [m.id for m in q] for k, q in r.queues.items()} == {"d2": ["m"]}
    assert r.queues["d2"][0] is not None and s.stats()["live_messages"] == 1
    s.ack("d2", "m")
    s, r = reopen(tmp_path, s)
    assert r.queues == {} and s.stats()["live_messages"] == 0
    s.close()


def test_removing_a_subscription_frees_its_messages(tmp_path: Path) -> None:
    s, _ = opened(tmp_path)
    s.add_subscription("d1", "/topic/t")
    for i in range(5):
        s.add_message(message(f"m{i}", "/topic/t"), ["d1", "d2"] if i % 2 else ["d1"])
    s.remove_subscription("d1")
    assert s.stats()["live_messages"] == 2
    s, r = reopen(tmp_path, s)
    assert subscriptions(r) == {} and {k: [m.id for m in q] for k, q in r.queues.items()} == {"d2": ["m1", "m3"]}
    s.close()


def test_a_subscription_created_after_its_messages_still_frees_them(tmp_path: Path) -> None:
    s, _ = opened(tmp_path)
    s.add_message(message("early", "/topic/t"), ["d1"])
    s.add_subscription("d1", "/topic/t")
    s.remove_subscription("d1")
    assert s.stats()["live_messages"] == 0
    s, r = reopen(tmp_path, s)
    assert r.queues == {}
    s.close()


def test_copies_of_a_folder_recover_identically(tmp_path: Path) -> None:
    s, _ = opened(tmp_path / "a")
    workload(s)
    crash(s)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    s1, r1 = opened(tmp_path / "a")
    s2, r2 = opened(tmp_path / "b")
    assert state(r1) == state(r2)
    s1.close()
    s2.close()
    assert settings.SYNC_POLICIES == ("always", "interval", "never")
