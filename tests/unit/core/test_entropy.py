"""The core's randomness comes through a port (core.ports.Entropy), as its
time does: message ids and temporary names are the Entropy's, never the OS's
behind the caller's back."""

from __future__ import annotations

from core.broker import Broker
from core.subscriptions import AckMode
from tests.support.core_fakes import FakeClock, RecordingSink, address


def drawn(size: int, /) -> bytes:
    return bytes(range(0xA0, 0xA0 + size))


def test_message_ids_and_temporary_names_come_from_the_entropy_port() -> None:
    broker = Broker(FakeClock(), entropy=drawn)
    client = broker.open_client(RecordingSink())
    assert broker.message(address("/queue/q"), {}, b"x").id == "ID-a0a1a2a3-1"
    private = broker.temporaries.claim(address("/temp-queue/r"), client)
    assert private.text.endswith(f"-{drawn(3).hex()}")


def test_a_broker_given_no_entropy_is_the_same_every_run() -> None:
    ids = [Broker(FakeClock()).message(address("/queue/q"), {}, b"x").id for _ in range(2)]
    assert ids[0] == ids[1] == "ID-00000000-1"


def test_a_node_name_needs_no_entropy() -> None:
    def refuse(size: int, /) -> bytes:
        assert size == 3, "only the temporaries' tag is drawn when the node names the ids"
        return bytes(size)

    broker = Broker(FakeClock(), node="n1", entropy=refuse)
    client = broker.open_client(RecordingSink())
    client.subscribe("s", address("/queue/q"), AckMode.AUTO)
    assert broker.message(address("/queue/q"), {}, b"x").id == "ID-n1-1"
