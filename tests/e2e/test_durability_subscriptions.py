"""Crash tests for durable topic subscriptions: a durable subscriber gets
every receipted message in order across SIGKILLs of the real broker process,
removing a subscription by name is durable too, and the ActiveMQ, Artemis and
RabbitMQ dialects keep messages while their subscriber is away.

Black-box: raw STOMP 1.2 sockets against ``gateway serve --stomp-port P
--data-dir D`` on a free loopback port; the promises checked and
``DURABILITY_SEED`` are described in tests/support/durability_helpers.py.  Every loop
and wait is bounded.  ``-s`` shows each test's ledger summary.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from tests.support.durability_helpers import (
    ACTIVEMQ,
    Ledger,
    Peer,
    Producer,
    consume,
    join_all,
    publish,
    receive_until,
    seeded,
    wait_delivered,
)
from tests.support.helpers import unique, wait_for


# -- a durable topic subscriber across crashes -----------------------------

TOPIC_ROUNDS = 10


def test_durable_topic_subscriber_gets_everything_in_order_across_sigkills(broker_process):
    rng = seeded("durable topic crash")
    broker = broker_process()
    ledger = Ledger()
    topic = f"/topic/{unique('crash')}"
    client = {"client-id": unique("durable-app")}
    producers = ["t0", "t1"]
    seqs = dict.fromkeys(producers, 0)
    started = time.monotonic()

    broker.start()
    ledger.new_session()
    first = Peer(broker.port, **client)
    first.request("SUBSCRIBE", {"id": "d", "destination": topic, "ack": "client-individual", **ACTIVEMQ})
    first.disconnect()  # offline from here on
    for round_ in range(1, TOPIC_ROUNDS + 1):
        # Publish while the subscriber is away (or, some rounds, while it is
        # there and acking), then kill the broker mid-load.
        online = rng.random() < 0.4
        deadline = time.monotonic() + 30
        consumer = None
        if online:
            ledger.new_session()
            consumer = consume(broker.port, topic, ledger, random.Random(rng.random()), deadline, connect=client,
                               subscribe={"id": "d", **ACTIVEMQ})
        stop = threading.Event()
        threads = [Producer(name, broker.port, topic, ledger, seqs, rng.choice((1, 16)), stop, deadline)
                   for name in producers]
        for thread in threads:
            thread.start()
        time.sleep(rng.uniform(0.05, 0.6))
        broker.kill()
        join_all([*threads, *([consumer] if consumer else [])])
        ledger.check()
        # Back: the subscriber gets every receipted message it had not acked,
        # in order, acks some of them, and leaves again.
        required = ledger.required()
        broker.start()
        ledger.new_session()
        consumer = consume(broker.port, topic, ledger, random.Random(rng.random()), time.monotonic() + 30,
                           connect=client, subscribe={"id": "d", **ACTIVEMQ}, ack_p=0.5, receipt_p=1.0)
        wait_delivered(ledger, required, broker, 20.0, f"round {round_}")
        consumer.stop.set()
        join_all([consumer])
        drain_receipts(consumer.peer, ledger)
        consumer.peer.disconnect()
        ledger.check()
    assert broker.terminate() == 0
    print(f"{TOPIC_ROUNDS} kills in {time.monotonic() - started:.1f} s; {ledger.summary()}")
    assert len(ledger.receipted) >= 10 * TOPIC_ROUNDS, (
        f"only {len(ledger.receipted)} of {len(ledger.sent)} SENDs receipted: do receipts stall?")


def drain_receipts(peer: Peer, ledger: Ledger) -> None:
    """Wait (bounded) for the receipts of the ACKs a stopped Consumer sent."""
    for frame in peer.request("SEND", {"destination": f"/topic/{unique('barrier')}"}, keep=False):
        if frame.command == "RECEIPT" and frame.headers["receipt-id"].startswith("a:"):
            ledger.note_acked(frame.headers["receipt-id"].removeprefix("a:"))
        elif frame.command == "MESSAGE":
            ledger.delivered(frame.body.decode(), frame.headers.get("redelivered") == "true")


# -- removing a durable subscription is durable too -----------------------------


def test_unsubscribe_with_the_subscription_name_removes_it_for_good(broker_process):
    broker = broker_process()
    topic = f"/topic/{unique('gone')}"
    client = {"client-id": unique("app")}
    broker.start()
    for name in ("removed", "kept"):  # "kept" proves the test could see held messages
        peer = Peer(broker.port, **client)
        peer.request("SUBSCRIBE", {"id": name, "destination": topic, "ack": "client-individual",
                                   "activemq.subscriptionName": name})
        peer.disconnect()
    publish(broker.port, topic, [f"before-{i}" for i in range(5)])
    broker.kill()
    broker.start()
    remover = Peer(broker.port, **client)
    remover.request("UNSUBSCRIBE", {"id": "whatever", "activemq.subscriptionName": "removed"})
    remover.disconnect()
    publish(broker.port, topic, [f"after-{i}" for i in range(5)])
    broker.kill()
    broker.start()
    bodies = {}
    for name in ("removed", "kept"):
        peer = Peer(broker.port, **client)
        peer.request("SUBSCRIBE", {"id": name, "destination": topic, "ack": "client-individual",
                                   "activemq.subscriptionName": name})
        publish(broker.port, topic, [f"{name}-marker"])
        bodies[name] = receive_until(peer, f"{name}-marker")
        peer.disconnect()
    # ("kept" was away when the marker for the other one was published.)
    assert bodies["kept"] == [*(f"before-{i}" for i in range(5)), *(f"after-{i}" for i in range(5)),
                              "removed-marker", "kept-marker"]
    # A new subscription of that name: nothing from before it existed...
    assert bodies["removed"] == ["removed-marker"]
    assert broker.terminate() == 0


# -- the Artemis and RabbitMQ durable dialects -----------------------------------

DIALECTS = {
    "activemq": ({"client-id": "dialect-app"}, {"activemq.subscriptionName": "prices"}),
    "artemis": ({"client-id": "dialect-app"}, {"durable-subscription-name": "prices"}),
    "rabbitmq": ({}, {"durable": "true", "auto-delete": "false"}),
}


@pytest.mark.parametrize("away", ["disconnect", "abort", "sigkill"])
@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_durable_subscription_dialects_keep_messages_while_away(broker_process, dialect, away):
    connect, durable = DIALECTS[dialect]
    sub_id = unique("prices-")  # RabbitMQ names the subscription by its id
    broker = broker_process()
    topic = f"/topic/{unique('dialect')}"
    broker.start()
    peer = Peer(broker.port, **connect)
    peer.request("SUBSCRIBE", {"id": sub_id, "destination": topic, "ack": "client-individual", **durable})
    publish(broker.port, topic, ["live"])
    assert receive_until(peer, "live") == ["live"]
    if away == "disconnect":
        peer.disconnect()
    else:
        peer.raw.abort()  # a TCP reset, as if the client had crashed
        if away == "sigkill":
            broker.kill()
            broker.start()
    publish(broker.port, topic, [f"away-{i}" for i in range(5)])
    if away == "sigkill":
        broker.kill()
        broker.start()
    # An aborted connection is noticed by the broker soon, not at once.
    back = wait_for(lambda: resubscribe(broker.port, connect, sub_id, topic, durable), timeout=5, interval=0.05,
                    what="the durable subscription to be free again")
    publish(broker.port, topic, ["back"])
    assert receive_until(back, "back") == [f"away-{i}" for i in range(5)] + ["back"]
    back.request("UNSUBSCRIBE", {"id": sub_id, **durable})
    back.disconnect()
    assert broker.terminate() == 0


def resubscribe(port: int, connect: dict[str, str], sub_id: str, topic: str, durable: dict[str, str]) -> Peer | None:
    """A new connection with the durable subscription, or None while the
    broker still counts the old (aborted) connection's as active."""
    peer = Peer(port, **connect)
    try:
        peer.request("SUBSCRIBE", {"id": sub_id, "destination": topic, "ack": "client-individual", **durable})
    except AssertionError as exc:
        peer.close()
        if "already active" in str(exc):
            return None
        raise
    return peer
