"""Which shard owns a key, and the map (gateway/workers/shards.py)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.workers import shards
from gateway.workers.shards import VIRTUAL_SHARDS, MapError, ShardMap


def test_a_tag_puts_destinations_together_and_only_a_non_empty_one_counts() -> None:
    assert shards.hashed_part("{orders}.in") == "orders"
    assert shards.hashed_part("a.{orders}.out.{x}") == "orders"  # the first tag
    assert shards.hashed_part("{}.in") == "{}.in"  # empty: the whole key
    assert shards.hashed_part("{orders.in") == "{orders.in"  # unclosed: the whole key
    key_in = shards.destination_key("/queue/{orders}.in")
    key_out = shards.destination_key("/topic/{orders}.out")
    assert shards.virtual_shard(key_in) == shards.virtual_shard(key_out) == shards.virtual_shard("orders")


def test_a_queue_and_a_topic_of_one_name_share_a_key_and_clients_and_groups_have_their_own() -> None:
    assert shards.destination_key("/queue/orders") == shards.destination_key("/topic/orders") == "orders"
    assert shards.destination_key("/temp-queue/x") == "x"
    assert shards.client_key("orders") != "orders" and shards.group_key("orders") != "orders"
    assert shards.client_key("dev-{orders}") != shards.group_key("{orders}")
    # A tag places a client id with its destinations on purpose.
    assert shards.virtual_shard(shards.client_key("dev-{orders}")) == shards.virtual_shard("orders")


def test_the_hash_is_the_same_in_every_process() -> None:
    # Python's hash() is salted per process: a map over it would disagree between workers.
    keys = ["orders", "client:sensor-17", "é€", "group:g"]
    here = [shards.virtual_shard(k) for k in keys]
    code = f"from gateway.workers import shards; print([shards.virtual_shard(k) for k in {keys!r}])"
    there = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={"PYTHONHASHSEED": str(seed)}).stdout.strip() for seed in (1, 2)]
    assert there == [str(here)] * 2


def test_the_initial_map_spreads_the_virtual_shards_evenly() -> None:
    for count in (1, 2, 3, 8, VIRTUAL_SHARDS):
        spread = ShardMap.initial(count).assignment
        per_shard = [spread.count(s) for s in range(count)]
        assert max(per_shard) - min(per_shard) <= 1


def test_keys_spread_over_two_shards() -> None:
    owners = [ShardMap.initial(2).owner(f"queue.{i}") for i in range(1000)]
    assert 400 <= owners.count(0) <= 600  # CRC-32 over 256 virtual shards, not all on one


def test_a_move_is_a_compare_and_set_on_the_version() -> None:
    first = ShardMap.initial(2)
    moved = first.moved(5, 0, expected_version=1)
    assert moved.version == 2 and moved.assignment[5] == 0 and first.assignment[5] == 1
    with pytest.raises(MapError, match="version 2, not 1"):
        moved.moved(6, 1, expected_version=1)  # a writer that read the old map loses


@given(st.integers(1, VIRTUAL_SHARDS))
def test_a_map_round_trips(count: int) -> None:
    assert ShardMap.from_json(ShardMap.initial(count).to_json()) == ShardMap.initial(count)


@pytest.mark.parametrize("data, reason", [
    (b"\xff", "not JSON"),
    (b"[]", "not an object"),
    (json.dumps({"version": 0, "shards": 2, "assignment": [0, 1] * 128}).encode(), "version"),
    (json.dumps({"version": 1, "shards": 2, "assignment": [0, 1] * 127}).encode(), "assigns 254"),
    (json.dumps({"version": 1, "shards": 2, "assignment": [0, 2] * 128}).encode(), r"in \[0, 2\)"),
    (json.dumps({"version": 1, "shards": 2, "assignment": [0] * 256}).encode(), "at least one"),
    (json.dumps({"version": True, "shards": 2, "assignment": [0, 1] * 128}).encode(), "version"),
    (b" " * (shards.MAX_MAP_BYTES + 1), "over"),
])
def test_a_map_that_does_not_hold_together_is_refused_with_the_reason(data: bytes, reason: str) -> None:
    with pytest.raises(MapError, match=reason):
        ShardMap.from_json(data)


def test_the_map_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        ShardMap.initial(2).version = 3  # type: ignore[misc]
