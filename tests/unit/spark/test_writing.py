"""The pure parts of a gateway.spark write: its options, how a row is routed
and framed, and the idempotency keys of a partition's transactions."""

from __future__ import annotations

import pytest

from gateway.spark import options as opts
from gateway.spark.options import OptionError
from gateway.spark.writer import Router, frame_bytes, send_frame, transaction_key

STOMP = {"stomp": "127.0.0.1:61613"}


def test_write_options_default_to_the_brokers_transaction_limits_and_no_write_id():
    given = opts.write_options({**STOMP, "destination": "/queue/out"})
    assert (given.transaction_rows, given.transaction_bytes, given.write_id) == (100_000, 32 * 1024 * 1024, None)
    given = opts.write_options({**STOMP, "destination": "/queue/out", "writeId": "nightly", "transactionRows": "10", "transactionBytes": "999"})
    assert (given.transaction_rows, given.transaction_bytes, given.write_id) == (10, 999, "nightly")
    assert opts.write_options(STOMP).destination is None  # then a column must route each row


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"writeId": ""}, "writeId must be 1 to 200 printable"),
        ({"writeId": "x" * 201}, "writeId must be 1 to 200 printable"),
        ({"writeId": "a\nb"}, "writeId must be 1 to 200 printable"),
        ({"transactionRows": "0"}, "transactionRows must be a positive integer"),
        ({"transactionBytes": "lots"}, "transactionBytes must be a positive integer"),
        ({"destination": "/queue/a.*"}, "is a pattern"),
    ],
)
def test_bad_write_options_say_which_and_why(extra, message):
    with pytest.raises(OptionError, match=message):
        opts.write_options({**STOMP, **extra})


def test_a_partitions_first_transaction_keeps_the_bare_key_and_the_next_ones_count_on():
    keys = [transaction_key("spark-write:job:3", n) for n in range(3)]
    assert keys == ["spark-write:job:3", "spark-write:job:3:1", "spark-write:job:3:2"]
    assert len(set(keys + [transaction_key("spark-write:job:31", 0)])) == 4


def test_a_row_goes_to_the_option_else_its_own_destination_or_topic():
    assert Router("/queue/fixed")({"destination": "/queue/other"}) == "/queue/fixed"
    assert Router(None)({"destination": "/queue/a"}) == "/queue/a"
    assert Router(None)({"topic": "plant/1/cmd"}) == "/topic/plant.1.cmd"
    assert Router(None)({"topic": "/topic/plant.2.cmd"}) == "/topic/plant.2.cmd"
    with pytest.raises(ValueError, match="is a pattern"):
        Router(None)({"destination": "/topic/a.>"})
    with pytest.raises(ValueError, match="names no single topic"):
        Router(None)({"topic": "plant/+/cmd"})
    with pytest.raises(ValueError, match="has no topic"):
        Router(None)({"topic": None})


def test_a_rows_frame_and_what_it_counts_against_the_transaction_bytes():
    frame = send_frame("/queue/a", "t1", {"body": "hé", "headers": {"k": "v"}, "priority": 3, "persistent": True})
    assert frame.headers == {"destination": "/queue/a", "transaction": "t1", "k": "v", "priority": "3", "persistent": "true"}
    assert frame.body == "hé".encode()
    assert frame_bytes(frame) == 3 + sum(len(k) + len(v) for k, v in frame.headers.items())
    with pytest.raises(ValueError, match="may not set destination"):
        send_frame("/queue/a", "t1", {"body": b"", "headers": {"destination": "/queue/b"}})
