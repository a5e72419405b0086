"""JMS selectors on SUBSCRIBE, through stomp.py: on topics, on queues beside a
plain consumer, messages matching nobody staying, and invalid selectors."""

from __future__ import annotations

from tests.support.helpers import unique


def test_a_topic_subscriber_gets_only_what_its_selector_takes(broker, stomp_client):
    topic = f"/topic/{unique('sel')}"
    picky = stomp_client(broker)
    picky.subscribe(topic, selector="region = 'eu' AND \"x-price\" > 100")
    everyone = stomp_client(broker)
    everyone.subscribe(topic)
    producer = stomp_client(broker)
    for region, price in (("eu", "150"), ("us", "150"), ("eu", "99"), ("eu", "1e3")):
        producer.send(topic, f"{region}-{price}".encode(), region=region, **{"x-price": price})
    everyone.wait_messages(4)
    picky.barrier()
    assert picky.bodies == [b"eu-150", b"eu-1e3"]  # numbers held in string headers compare as numbers


def test_a_selector_consumer_beside_a_plain_one_on_a_queue(broker, stomp_client):
    queue = f"/queue/{unique('sel')}"
    urgent = stomp_client(broker)
    urgent.subscribe(queue, selector="JMSPriority >= 7")
    plain = stomp_client(broker)
    plain.subscribe(queue)
    producer = stomp_client(broker)
    for i in range(6):
        producer.send(queue, f"m{i}".encode(), priority="9" if i % 2 else "4")
    urgent.wait_messages(3)
    plain.wait_messages(1)
    urgent.barrier()
    plain.barrier()
    assert urgent.bodies == [b"m1", b"m3", b"m5"]
    assert all(m.headers["priority"] == "4" for m in plain.messages)  # plain ones never reach the selector
    assert sorted(urgent.bodies + plain.bodies) == sorted(f"m{i}".encode() for i in range(6))


def test_messages_matching_no_consumer_stay_for_a_later_one(broker, stomp_client):
    queue = f"/queue/{unique('sel')}"
    red = stomp_client(broker)
    red.subscribe(queue, selector="color = 'red'")
    producer = stomp_client(broker)
    for color in ("blue", "red", "blue"):
        producer.send(queue, color.encode(), color=color)
    red.wait_messages(1)
    red.barrier()
    assert red.bodies == [b"red"]
    blue = stomp_client(broker)
    blue.subscribe(queue, selector="color IN ('blue', 'green')")
    blue.wait_messages(2)
    assert blue.bodies == [b"blue", b"blue"]


def test_an_invalid_selector_gets_an_error_saying_where(broker, stomp_client):
    client = stomp_client(broker)
    client.conn.subscribe(f"/queue/{unique('bad')}", "1", headers={"selector": "color == 'red'"})
    error = client.wait_error()
    assert "invalid selector at character 7" in error.headers["message"]


# -- consumer priority and exclusive consumers (the other ways a queue picks) -------


def test_higher_priority_consumers_are_served_first_while_they_have_room(broker, stomp_client):
    queue = f"/queue/{unique('prio')}"
    high = stomp_client(broker)
    high.subscribe(queue, "h", ack="client-individual", **{"activemq.priority": "9", "activemq.prefetchSize": "2"})
    low = stomp_client(broker)
    low.subscribe(queue, "l", ack="client-individual", **{"x-priority": "1", "prefetch-count": "10"})
    producer = stomp_client(broker)
    for i in range(5):
        producer.send(queue, f"m{i}".encode())
    high.wait_messages(2)
    low.wait_messages(3)
    assert high.bodies == [b"m0", b"m1"]  # first, up to its prefetch
    assert low.bodies == [b"m2", b"m3", b"m4"]


def test_an_exclusive_consumer_gets_everything_and_the_next_takes_over(broker, stomp_client):
    queue = f"/queue/{unique('excl')}"
    first = stomp_client(broker)
    first.subscribe(queue, "a", **{"activemq.exclusive": "true"})
    second = stomp_client(broker)
    second.subscribe(queue, "b", **{"activemq.exclusive": "true"})
    producer = stomp_client(broker)
    for i in range(4):
        producer.send(queue, f"m{i}".encode())
    first.wait_messages(4)
    second.barrier()
    assert second.bodies == []
    first.close()
    producer.send(queue, b"after")
    assert second.wait_messages(1)[0].body == b"after"


def test_a_message_group_sticks_to_one_consumer_until_it_leaves(broker, stomp_client):
    queue = f"/queue/{unique('group')}"
    a = stomp_client(broker)
    a.subscribe(queue, "a")
    b = stomp_client(broker)
    b.subscribe(queue, "b")
    producer = stomp_client(broker)
    for i in range(8):
        producer.send(queue, f"{'xy'[i % 2]}{i}".encode(), JMSXGroupID="xy"[i % 2], JMSXGroupSeq=str(i // 2 + 1))
    a.wait_messages(4)
    b.wait_messages(4)
    groups_a = {m.headers["JMSXGroupID"] for m in a.messages}
    groups_b = {m.headers["JMSXGroupID"] for m in b.messages}
    assert len(groups_a) == 1 and len(groups_b) == 1 and groups_a != groups_b
    assert [m.headers["JMSXGroupSeq"] for m in a.messages] == ["1", "2", "3", "4"]
    (moving,) = groups_a
    a.close()
    producer.send(queue, b"later", JMSXGroupID=moving)
    assert b.wait_messages(5)[-1].body == b"later"  # the group moved to the consumer still there


def test_a_ten_thousand_message_backlog_of_mixed_priorities_drains_in_priority_order(broker_factory, raw_client):
    broker = broker_factory(broker={"resident_messages": 1000})  # most of it paged out to the store
    queue = f"/queue/{unique('prio')}"
    producer = raw_client(broker)
    producer.connect(heart_beat="0,0")
    frames = []
    for i in range(10_000):
        headers = {"destination": queue, "priority": str(i % 10), "persistent": "true", "seq": str(i)}
        if i == 9_999:
            headers["receipt"] = "last"
        frames.append(("SEND", headers, b"x"))
    from tests.support.helpers import encode_frame

    producer.send(b"".join(encode_frame(c, h, b) for c, h, b in frames))
    producer.receipt("last", timeout=30)
    consumer = raw_client(broker)
    consumer.connect(heart_beat="0,0")
    consumer.send_frame("SUBSCRIBE", {"destination": queue, "id": "1"})
    got = [consumer.expect("MESSAGE", timeout=30) for _ in range(10_000)]
    order = [(int(m.headers["priority"]), int(m.headers["seq"])) for m in got]
    assert order == sorted(order, key=lambda ps: (-ps[0], ps[1]))  # higher first, FIFO within


def test_a_selector_built_to_backtrack_neither_freezes_the_broker_nor_errs(broker_factory, stomp_client):
    # mallory has no grants at all: a temporary topic of her own is all she needs.
    from gateway.auth import hash_password

    users = [{"name": name, "password_hash": hash_password(f"{name}-pw", iterations=1000)} for name in ("alice", "mallory")]
    acl = [{"destination": "/queue/work", "read": ["alice"], "write": ["alice"], "admin": ["alice"]},
           {"destination": "/topic/barrier.>", "write": ["*"]}]
    broker = broker_factory(auth={"users": users, "acl": acl})
    mallory = stomp_client(broker, headers={"login": "mallory", "passcode": "mallory-pw"})
    mallory.subscribe("/temp-topic/x", selector="h LIKE '%a%a%a%a%a%a%a%a%a%a%b'")
    mallory.send("/temp-topic/x", b"no", h="a" * 32)  # a backtracking regex takes minutes here
    mallory.send("/temp-topic/x", b"yes", h="a" * 32 + "b")
    alice = stomp_client(broker, headers={"login": "alice", "passcode": "alice-pw"})
    alice.subscribe("/queue/work")
    alice.send("/queue/work", b"served")
    assert alice.wait_messages(1)[0].body == b"served"
    mallory.wait_messages(1)
    mallory.barrier()
    assert mallory.bodies == [b"yes"]


def test_a_selector_with_too_many_terms_is_refused_naming_the_limit(broker, stomp_client):
    from core.selectors import MAX_NODES

    client = stomp_client(broker)
    many = " OR ".join(f"n = {i}" for i in range(MAX_NODES // 3 + 1))
    client.conn.subscribe(f"/queue/{unique('big')}", "1", headers={"selector": many})
    assert f"at most {MAX_NODES} terms" in client.wait_error().headers["message"]
