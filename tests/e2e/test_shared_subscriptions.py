"""Shared subscriptions and No Local over STOMP (stomp.py against a real
broker): SUBSCRIBE's ``shared-subscription-name`` joins a group whose members
share the topic's messages, each to one of them, durable with a durable
subscription's headers; ``activemq.noLocal`` leaves out the connection's own
messages."""

from __future__ import annotations

import json

from tests.support.helpers import unique, wait_for


def test_a_shared_group_gives_each_message_to_one_member_and_a_plain_subscriber_everything(broker, stomp_client):
    topic = f"/topic/{unique('jobs')}"
    members = [stomp_client(broker) for _ in range(3)]
    for member in members:
        member.subscribe(topic, **{"shared-subscription-name": "workers"})
    plain = stomp_client(broker)
    plain.subscribe(topic)
    producer = stomp_client(broker)
    sent = [str(i).encode() for i in range(12)]
    for body in sent:
        producer.send(topic, body)
    plain.wait_messages(12)
    wait_for(lambda: sum(len(m.bodies) for m in members) == 12, what="12 messages across the members")
    for member in members:
        member.barrier()
    got = [member.bodies for member in members]
    assert sorted(sum(got, [])) == sorted(sent)  # each to exactly one member
    assert all(got)  # spread over the members, not all to one
    assert plain.bodies == sent


def test_a_member_leaving_with_unacked_messages_hands_them_to_another(broker, stomp_client):
    topic = f"/topic/{unique('jobs')}"
    leaving = stomp_client(broker)
    leaving.subscribe(topic, "a", ack="client-individual",
                      **{"shared-subscription-name": "w", "activemq.prefetchSize": "5"})
    producer = stomp_client(broker)
    for i in range(3):
        producer.send(topic, f"m{i}".encode())
    leaving.wait_messages(3)
    staying = stomp_client(broker)
    staying.subscribe(topic, "b", ack="auto", **{"shared-subscription-name": "w"})
    leaving.close()  # never acked
    staying.wait_messages(3)
    assert sorted(staying.bodies) == [b"m0", b"m1", b"m2"]
    assert all(m.headers.get("redelivered") == "true" for m in staying.messages)


def test_a_durable_shared_group_keeps_messages_while_its_members_are_away_and_across_a_restart(broker_factory, stomp_client):
    broker = broker_factory()
    topic = f"/topic/{unique('jobs')}"
    durable = {"shared-subscription-name": "w", "durable-subscription-name": "jobs"}
    member = stomp_client(broker, headers={"client-id": "worker-1"})
    member.subscribe(topic, "s", ack="client-individual", **durable)
    member.close()
    producer = stomp_client(broker)
    for i in range(3):
        producer.send(topic, f"m{i}".encode(), persistent="true")
    producer.close()
    broker.stop()

    broker = broker_factory()  # the same data directory
    back = stomp_client(broker, headers={"client-id": "worker-1"})
    back.subscribe(topic, "s", ack="auto", **durable)
    back.wait_messages(3)
    assert sorted(back.bodies) == [b"m0", b"m1", b"m2"]


def test_no_local_leaves_out_the_connections_own_messages(broker, stomp_client):
    topic = f"/topic/{unique('chat')}"
    me = stomp_client(broker)
    me.subscribe(topic, "mine", **{"activemq.noLocal": "true"})
    other = stomp_client(broker)
    other.subscribe(topic, "theirs")
    me.send(topic, b"from me")
    other.send(topic, b"from other")
    other.wait_messages(2)
    me.wait_messages(1)
    me.barrier()
    assert me.bodies == [b"from other"]
    assert other.bodies == [b"from me", b"from other"]


def test_a_group_shows_in_the_admin_list_and_the_metrics(broker_factory, stomp_client):
    from tests.e2e.test_admin import USERS, call

    broker = broker_factory(admin={"users": USERS})
    topic = f"/topic/{unique('jobs')}"
    member = stomp_client(broker)
    member.subscribe(topic, "s", ack="client-individual",
                     **{"shared-subscription-name": "w", "activemq.prefetchSize": "1"})
    producer = stomp_client(broker)
    for i in range(3):
        producer.send(topic, f"m{i}".encode())
    member.wait_messages(1)
    status, body, _ = call(broker, "GET", "/api/v1/destinations")
    key = f"shared:1:w:{topic}"
    entries = [d for d in json.loads(body) if d["name"] == key]
    assert status == 200 and len(entries) == 1
    assert entries[0]["type"] == "shared-subscription" and entries[0]["depth"] == 2 and entries[0]["consumers"] == 1
    metrics = call(broker, "GET", "/metrics")[1].decode()
    assert f'gateway_destination_depth{{destination="{key}"}} 2\n' in metrics
