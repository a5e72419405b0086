"""The pure parts of a gateway.spark write: its options, how a row is routed
and framed, and the idempotency keys of a partition's transactions."""

from __future__ import annotations

import pytest

from gateway.spark import options as opts
from gateway.spark.options import OptionError
from gateway.spark.writer import Router, RowEncoder, send_frame, transaction_key
from gateway.stomp import codec, frames

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


@pytest.mark.parametrize(
    "values",
    [
        {"body": b"x" * 128},
        {"body": "hé"},
        {"body": None},
        {"body": b"", "headers": {"k": "v"}},
        {"body": b"b", "headers": {"a:b": "c\nd", "back\\slash": "x"}, "priority": 3, "persistent": True},
        {"body": b"b", "priority": 0, "persistent": False},
    ],
)
def test_the_row_encoder_makes_the_bytes_the_codec_makes_of_the_rows_frame(values):
    client = codec.StompConnection(codec.Role.CLIENT)
    client.set_version("1.2")
    encoder = RowEncoder(client.escape, "t1")
    for destination in ("/queue/a", "/topic/plant.1:x"):  # twice each: the cached head too
        for _ in range(2):
            data = encoder.encode(destination, values)
            assert data == client.send(send_frame(destination, "t1", values))
    # And the broker's codec reads it back as that frame.
    server = codec.StompConnection(codec.Role.SERVER)
    server.receive_data(b"CONNECT\naccept-version:1.2\nhost:h\n\n\x00")
    assert isinstance(next(server.events()), frames.Connect)
    server.set_version("1.2")
    server.receive_data(data)
    (frame,) = list(server.events())
    expected = send_frame("/topic/plant.1:x", "t1", values)
    assert (frame.command, frame.headers, frame.body) == ("SEND", {**expected.headers, **({"content-length": str(len(expected.body))} if expected.body else {})}, expected.body)


def test_a_rows_bad_values_fail_it():
    encoder = RowEncoder(codec.StompConnection(codec.Role.CLIENT).escape, "t1")
    with pytest.raises(ValueError, match="priority must be 0 to 9"):
        encoder.encode("/queue/a", {"body": b"", "priority": 12})
    with pytest.raises(ValueError, match="may not set destination"):
        encoder.encode("/queue/a", {"body": b"", "headers": {"destination": "/queue/b"}})
