"""Persistent messages, durable subscriptions and transactions across a
restart of the broker on the same data folder, through stomp.py.

(Crashes with SIGKILL are in test_durability_*.py; here the broker stops
cleanly, and the proof is what a client gets afterwards.)"""

from __future__ import annotations

import pytest

from tests.support.helpers import unique

PERSISTENT = {"persistent": "true"}


def restart(broker_factory, running, **settings):
    running.stop()
    return broker_factory(**settings)


def test_persistent_queue_messages_survive_a_restart_and_transient_ones_do_not(broker_factory, stomp_client):
    broker = broker_factory()
    queue = f"/queue/{unique('keep')}"
    producer = stomp_client(broker)
    for i in range(5):
        producer.send(queue, f"p{i}".encode(), **PERSISTENT)
        producer.send(queue, f"t{i}".encode())
    broker = restart(broker_factory, broker)
    consumer = stomp_client(broker)
    consumer.subscribe(queue)
    consumer.wait_messages(5)
    consumer.barrier()
    assert consumer.bodies == [f"p{i}".encode() for i in range(5)]
    assert all(m.headers["persistent"] == "true" for m in consumer.messages)


def test_acknowledged_messages_do_not_come_back_and_unacknowledged_ones_do(broker_factory, stomp_client):
    broker = broker_factory()
    queue = f"/queue/{unique('acks')}"
    producer = stomp_client(broker)
    for i in range(4):
        producer.send(queue, str(i).encode(), **PERSISTENT)
    consumer = stomp_client(broker)
    consumer.subscribe(queue, "s", ack="client-individual")
    messages = consumer.wait_messages(4)
    for message in messages[:2]:
        rid = unique("ack-")
        consumer.conn.ack(message.headers["ack"], receipt=rid)
        consumer.wait_receipt(rid)
    broker = restart(broker_factory, broker)
    again = stomp_client(broker)
    again.subscribe(queue)
    again.wait_messages(2)
    again.barrier()
    assert again.bodies == [b"2", b"3"]
    assert all(m.headers["redelivered"] == "true" for m in again.messages)


def test_auto_acknowledged_messages_are_gone_after_a_restart(broker_factory, stomp_client):
    broker = broker_factory()
    queue = f"/queue/{unique('auto')}"
    consumer = stomp_client(broker)
    consumer.subscribe(queue)
    producer = stomp_client(broker)
    for i in range(3):
        producer.send(queue, str(i).encode(), **PERSISTENT)
    consumer.wait_messages(3)
    consumer.barrier()
    broker = restart(broker_factory, broker)
    late = stomp_client(broker)
    late.subscribe(queue)
    late.barrier()
    assert late.bodies == []


@pytest.mark.parametrize(
    "dialect",
    [
        {"activemq.subscriptionName": "prices"},
        {"durable-subscription-name": "prices"},
        {"durable": "true", "auto-delete": "false"},
        {"persistent": "true", "auto-delete": "false"},
    ],
    ids=["activemq", "artemis", "rabbitmq", "rabbitmq-persistent"],
)
def test_a_durable_subscriber_gets_what_was_published_while_away_even_across_a_restart(broker_factory, stomp_client, dialect):
    broker = broker_factory()
    topic = f"/topic/{unique('prices')}"
    client_id = unique("app")
    subscriber = stomp_client(broker, headers={"client-id": client_id})
    subscriber.subscribe(topic, "durable-1", ack="client-individual", **dialect)
    subscriber.close()
    producer = stomp_client(broker)
    for i in range(3):
        producer.send(topic, f"before-{i}".encode(), **PERSISTENT)
    broker = restart(broker_factory, broker)
    producer = stomp_client(broker)
    for i in range(2):
        producer.send(topic, f"after-{i}".encode(), **PERSISTENT)
    back = stomp_client(broker, headers={"client-id": client_id})
    back.subscribe(topic, "durable-1", ack="client-individual", **dialect)
    back.wait_messages(5)
    back.barrier()
    assert back.bodies == [b"before-0", b"before-1", b"before-2", b"after-0", b"after-1"]


def test_a_returning_durable_subscriber_gets_the_receipt_before_what_waited(broker, stomp_client, raw_client):
    topic = f"/topic/{unique('prices')}"
    client_id = unique("app")
    durable = {"activemq.subscriptionName": "prices"}
    subscriber = stomp_client(broker, headers={"client-id": client_id})
    subscriber.subscribe(topic, "d", **durable)
    subscriber.close()
    producer = stomp_client(broker)
    producer.send(topic, b"one", **PERSISTENT)
    producer.send(topic, b"two", **PERSISTENT)
    back = stomp_client(broker, headers={"client-id": client_id})
    back.subscribe(topic, "d", **durable)
    back.wait_messages(2)
    assert back.rec.order == [f"RECEIPT {back.rec.receipts[0]}", "MESSAGE", "MESSAGE"]
    # And on the wire, as a raw client sees it.
    back.close()
    producer.send(topic, b"three", **PERSISTENT)
    raw = raw_client(broker)
    raw.connect(**{"client-id": client_id})
    raw.send_frame("SUBSCRIBE", {"destination": topic, "id": "d", "receipt": "r", **durable})
    raw.receipt("r")
    assert raw.expect("MESSAGE").body == b"three"


def test_unsubscribe_with_the_subscription_name_removes_a_durable_subscription(broker_factory, stomp_client):
    broker = broker_factory()
    topic = f"/topic/{unique('gone')}"
    client_id = unique("app")
    subscriber = stomp_client(broker, headers={"client-id": client_id})
    subscriber.subscribe(topic, "d", ack="client-individual", **{"activemq.subscriptionName": "n"})
    subscriber.close()
    producer = stomp_client(broker)
    producer.send(topic, b"held", **PERSISTENT)
    # Remove it while it is offline: UNSUBSCRIBE naming it, from a new connection.
    remover = stomp_client(broker, headers={"client-id": client_id})
    rid = unique("unsub-")
    remover.conn.unsubscribe("d", headers={"activemq.subscriptionName": "n", "receipt": rid})
    remover.wait_receipt(rid)
    assert remover.rec.errors == []
    broker = restart(broker_factory, broker)
    back = stomp_client(broker, headers={"client-id": client_id})
    back.subscribe(topic, "d", ack="client-individual", **{"activemq.subscriptionName": "n"})
    back.barrier()
    assert back.bodies == []  # a fresh subscription: the old one's message went with it


def test_a_durable_subscription_without_client_id_is_refused(broker, stomp_client):
    client = stomp_client(broker)
    client.conn.subscribe(f"/topic/{unique('x')}", "1", headers={"activemq.subscriptionName": "n"})
    error = client.wait_error()
    assert "client-id" in error.headers["message"]


def test_a_durable_subscription_active_elsewhere_is_refused(broker, stomp_client):
    topic = f"/topic/{unique('busy')}"
    first = stomp_client(broker, headers={"client-id": "same"})
    first.subscribe(topic, "1", **{"activemq.subscriptionName": "n"})
    second = stomp_client(broker, headers={"client-id": "same"})
    second.conn.subscribe(topic, "1", headers={"activemq.subscriptionName": "n"})
    assert "already active" in second.wait_error().headers["message"]


def test_a_committed_transaction_survives_a_restart_and_an_aborted_one_leaves_nothing(broker_factory, stomp_client):
    broker = broker_factory()
    queue = f"/queue/{unique('tx')}"
    producer = stomp_client(broker)
    producer.conn.begin("kept")
    producer.conn.begin("dropped")
    for i in range(3):
        producer.conn.send(queue, f"kept-{i}".encode(), headers={"transaction": "kept", **PERSISTENT})
        producer.conn.send(queue, f"dropped-{i}".encode(), headers={"transaction": "dropped", **PERSISTENT})
    rid = unique("commit-")
    producer.conn.commit("kept", headers={"receipt": rid})
    producer.wait_receipt(rid)
    producer.conn.abort("dropped")
    producer.barrier()
    broker = restart(broker_factory, broker)
    consumer = stomp_client(broker)
    consumer.subscribe(queue)
    consumer.wait_messages(3)
    consumer.barrier()
    assert consumer.bodies == [b"kept-0", b"kept-1", b"kept-2"]


def test_a_backlog_beyond_the_memory_budget_comes_back_whole_and_in_order(broker_factory, stomp_client):
    settings = {"resident_messages": 10}
    broker = broker_factory(broker=settings)
    queue = f"/queue/{unique('deep')}"
    producer = stomp_client(broker)
    for i in range(60):
        producer.send(queue, f"m{i}".encode() * 50, receipt=(i % 20 == 19), **PERSISTENT, **{"x-seq": str(i)})

    def consume(client, first, count):
        for i in range(first, first + count):
            client.wait_messages(i - first + 1)
            message = client.messages[i - first]
            assert message.body == f"m{i}".encode() * 50 and message.headers["x-seq"] == str(i)
            rid = unique("ack-")
            client.conn.ack(message.headers["ack"], receipt=rid)
            client.wait_receipt(rid)

    live = stomp_client(broker)
    live.subscribe(queue, "s", ack="client-individual", **{"activemq.prefetchSize": "1"})
    consume(live, 0, 30)  # read back from disk while the broker runs
    live.close()
    broker = restart(broker_factory, broker, broker=settings)
    after = stomp_client(broker)
    after.subscribe(queue, "s", ack="client-individual", **{"activemq.prefetchSize": "7"})
    consume(after, 30, 30)  # recovered as stubs, read back on dispatch


def test_a_durable_subscription_keeps_its_selector_while_away_and_across_a_restart(broker_factory, stomp_client):
    broker = broker_factory()
    topic = f"/topic/{unique('prices')}"
    durable = {"activemq.subscriptionName": "eu-prices", "selector": "region = 'eu'"}
    subscriber = stomp_client(broker, headers={"client-id": "eu-desk"})
    subscriber.subscribe(topic, "d", ack="client-individual", **durable)
    subscriber.close()
    broker = restart(broker_factory, broker)
    producer = stomp_client(broker)
    for region in ("eu", "us", "eu", "apac"):
        producer.send(topic, f"{region} price".encode(), region=region, **PERSISTENT)
    broker = restart(broker_factory, broker)  # what was kept for it is kept again
    back = stomp_client(broker, headers={"client-id": "eu-desk"})
    back.subscribe(topic, "d", ack="client-individual", **durable)
    back.barrier()
    assert back.bodies == [b"eu price", b"eu price"]


def test_changing_a_durable_subscriptions_selector_makes_it_a_new_subscription(broker_factory, stomp_client):
    broker = broker_factory()
    topic = f"/topic/{unique('prices')}"
    subscriber = stomp_client(broker, headers={"client-id": "desk"})
    subscriber.subscribe(topic, "d", **{"activemq.subscriptionName": "s", "selector": "region = 'eu'"})
    subscriber.close()
    stomp_client(broker).send(topic, b"kept for the eu selector", region="eu", **PERSISTENT)
    back = stomp_client(broker, headers={"client-id": "desk"})
    # JMS 1.1 §6.11.1: another selector is deleting the old subscription and making a new one.
    back.subscribe(topic, "d", **{"activemq.subscriptionName": "s", "selector": "region = 'us'"})
    stomp_client(broker).send(topic, b"new us price", region="us", **PERSISTENT)
    back.wait_messages(1)
    back.barrier()
    assert back.bodies == [b"new us price"]
