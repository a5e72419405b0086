"""What the console asks of the admin API, through a real HTTP client and
real STOMP clients: its open page and files, who is logged in, the answer
that says how to make an admin user, unacked counts, topics with their
subscribers, the sampled history, and retrying dead letters."""

from __future__ import annotations

import json

import pytest

from tests.e2e.test_admin import READER, USERS, call, fill
from tests.support.helpers import unique, wait_for

HTML = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
CONSOLE = {"X-Requested-With": "gateway-console"}


@pytest.fixture
def console_broker(broker_factory):
    return broker_factory(
        admin={"users": USERS, "history_interval_s": 0.2},
        broker={"policies": [{"destination": "/queue/retry.>", "max_redeliveries": 0}]},
    )


def get(broker, path, **kwargs):
    status, body, _ = call(broker, "GET", path, **kwargs)
    assert status == 200, (status, body)
    return json.loads(body)


# -- the page, its files, logging in ------------------------------------------------------


def test_a_browser_gets_the_page_without_credentials_and_an_api_client_still_gets_401(console_broker):
    status, body, response = call(console_broker, "GET", "/", auth=None, headers=HTML)
    assert status == 200 and response.getheader("Content-Type").startswith("text/html")
    assert b'id="login-form"' in body
    policy = response.getheader("Content-Security-Policy")  # the page runs its own files only
    assert "script-src 'self'" in policy and "connect-src 'self'" in policy
    status, body, response = call(console_broker, "GET", "/", auth=None)  # curl, scripts: as before
    assert status == 401 and response.getheader("WWW-Authenticate", "").startswith("Basic")
    status, body, response = call(console_broker, "GET", "/api/v1/destinations", auth=None, headers=HTML)
    assert status == 401 and json.loads(body)["status"] == 401  # the data needs credentials, whoever asks


def test_the_consoles_own_requests_get_401_without_a_challenge(console_broker):
    """So the browser shows the console's login form, not its password dialog."""
    status, _, response = call(console_broker, "GET", "/api/v1/whoami", auth=("ops", "wrong"), headers=CONSOLE)
    assert status == 401 and response.getheader("WWW-Authenticate") is None


@pytest.mark.parametrize("name", ["console.js", "pages.js", "destination.js", "charts.js", "console.css"])
def test_the_consoles_files_are_served_from_the_package(console_broker, name):
    status, body, response = call(console_broker, "GET", f"/console/{name}", auth=None)
    assert status == 200 and len(body) > 500
    assert response.getheader("Content-Type").split(";")[0] in ("text/javascript", "text/css")


def test_the_console_needs_nothing_from_elsewhere(console_broker):
    """It works offline: no file names another origin (a CDN, a font)."""
    for name in ("/", "/console/console.js", "/console/pages.js", "/console/destination.js", "/console/charts.js",
                 "/console/console.css"):
        body = call(console_broker, "GET", name, auth=None, headers=HTML)[1].decode()
        elsewhere = [word for word in body.split() if ("http://" in word or "https://" in word)
                     and "http://www.w3.org/2000/svg" not in word]  # SVG's namespace name, never fetched
        assert not elsewhere, (name, elsewhere)


@pytest.mark.parametrize("path", ["/console/nothing.js", "/console/../api.py", "/console/%2e%2e%2fapi.py",
                                  "/console/static", "/console/"])
def test_nothing_else_is_served_as_a_console_file(console_broker, path):
    assert call(console_broker, "GET", path, auth=None)[0] == 404


def test_whoami_names_the_user_and_role(console_broker):
    assert get(console_broker, "/api/v1/whoami") == {"user": "ops", "role": "write"}
    assert get(console_broker, "/api/v1/whoami", auth=READER) == {"user": "viewer", "role": "read"}


def test_without_admin_users_the_answer_says_how_to_make_one(broker):
    status, body, _ = call(broker, "GET", "/api/v1/whoami", auth=None)
    answer = json.loads(body)
    assert status == 403 and answer["no_admin_users"] is True
    for needed in ("gateway passwd", "[admin] users", "GATEWAY_ADMIN_USER", "GATEWAY_ADMIN_PASSWORD"):
        assert needed in answer["reason"]
    status, page, _ = call(broker, "GET", "/", auth=None, headers=HTML)
    assert status == 200 and b"gateway passwd --name ops --role write" in page and b"GATEWAY_ADMIN_USER" in page


# -- unacked, topics, history -----------------------------------------------------------


def test_a_client_ack_consumer_holding_messages_shows_them_unacked(console_broker, stomp_client):
    queue = f"/queue/{unique('unacked')}"
    fill(stomp_client, console_broker, queue, 10)
    consumer = stomp_client(console_broker)
    consumer.subscribe(queue, ack="client", **{"activemq.prefetchSize": "7"})
    messages = consumer.wait_messages(7)
    (entry,) = [d for d in get(console_broker, "/api/v1/destinations") if d["name"] == queue]
    assert (entry["depth"], entry["unacked"]) == (3, 7)
    consumer.conn.ack(messages[3].headers["ack"])  # cumulative: 4
    wait_for(lambda: get(console_broker, "/api/v1/destinations" + queue)["unacked"] == 6, what="4 acked, 3 more sent")
    assert get(console_broker, "/api/v1/destinations" + queue)["depth"] == 0
    assert get(console_broker, "/api/v1/overview")["unacked"] >= 6


def test_topics_list_their_subscribers_with_pending_and_unacked(console_broker, stomp_client):
    topic = f"/topic/{unique('prices')}"
    live = stomp_client(console_broker)
    live_id = live.subscribe(topic, ack="client-individual", **{"activemq.prefetchSize": "2"})
    client_id = unique("keeper")
    durable = stomp_client(console_broker, headers={"client-id": client_id})
    durable.subscribe(topic, ack="client-individual", **{"activemq.subscriptionName": "audit",
                                                           "activemq.prefetchSize": "1"})
    producer = stomp_client(console_broker)
    for i in range(4):
        producer.send(topic, f"p{i}", persistent="true")
    live.wait_messages(2)
    durable.wait_messages(1)
    (listed,) = [t for t in get(console_broker, "/api/v1/topics") if t["topic"] == topic]
    by_kind = {s["kind"]: s for s in listed["subscribers"]}
    assert by_kind["non-durable"]["name"] == live_id and by_kind["non-durable"]["connection"]
    assert (by_kind["non-durable"]["pending"], by_kind["non-durable"]["unacked"]) == (2, 2)
    assert by_kind["durable"]["client_id"] == client_id and by_kind["durable"]["active"] is True
    assert (by_kind["durable"]["pending"], by_kind["durable"]["unacked"]) == (3, 1)
    assert (listed["pending"], listed["unacked"]) == (5, 3)
    # the durable subscription's own page: by the name the lists give
    name = by_kind["durable"]["name"]
    assert get(console_broker, f"/api/v1/destinations/{name}")["unacked"] == 1
    assert len(get(console_broker, f"/api/v1/destinations/{name}/messages")) == 3


def test_the_history_samples_rates_and_queued_messages(console_broker, stomp_client):
    queue = f"/queue/{unique('history')}"
    fill(stomp_client, console_broker, queue, 25)

    def sampled():
        history = get(console_broker, "/api/v1/history")
        ring = history["destinations"].get(queue, [])
        return history if any(s["in"] > 0 for s in history["samples"]) and ring and ring[-1][1] == 25 else None

    history = wait_for(sampled, what="a sample with the 25 messages")
    assert history["interval_s"] == 0.2
    last = history["samples"][-1]
    assert last["queued"] >= 25 and last["connections"] >= 1 and last["memory"] > 0
    times = [s["t"] for s in history["samples"]]
    assert times == sorted(times) and len(times) <= 180
    assert sum(s["in"] for s in history["samples"]) > 0


# -- dead letters -------------------------------------------------------------------------


def dead_letter(stomp_client, broker, queue, body):
    """A message sent to ``queue`` and NACKed into the DLQ (max_redeliveries 0)."""
    stomp_client(broker).send(queue, body, persistent="true")
    rejecting = stomp_client(broker)
    rejecting.subscribe(queue, ack="client-individual")
    (message,) = rejecting.wait_messages(1)
    rejecting.conn.nack(message.headers["ack"])
    rejecting.close()


def test_retry_moves_dead_letters_back_to_their_queues(console_broker, stomp_client):
    first, second = f"/queue/retry.{unique('a')}", f"/queue/retry.{unique('b')}"
    dead_letter(stomp_client, console_broker, first, "one")
    dead_letter(stomp_client, console_broker, second, "two")
    wait_for(lambda: len([m for m in get(console_broker, "/api/v1/destinations/queue/DLQ/messages?limit=1000")
                          if m["headers"].get("originalDestination") in (first, second)]) == 2)
    dead = {m["body"]: m for m in get(console_broker, "/api/v1/destinations/queue/DLQ/messages?limit=1000")}
    consumer = stomp_client(console_broker)
    consumer.subscribe(first)
    # one chosen message
    status, body, _ = call(console_broker, "POST", "/api/v1/destinations/queue%2FDLQ/retry",
                           {"message_ids": [dead["one"]["message_id"]]})
    assert (status, json.loads(body)) == (200, {"moved": 1, "skipped": 0})
    (received,) = consumer.wait_messages(1)
    assert received.body == b"one" and "originalDestination" not in received.headers
    # then everything left; the other goes back to its own queue
    status, body, _ = call(console_broker, "POST", "/api/v1/destinations/queue%2FDLQ/retry")
    assert status == 200 and json.loads(body)["moved"] >= 1
    other = stomp_client(console_broker)
    other.subscribe(second)
    assert other.wait_messages(1)[0].body == b"two"


def test_retry_refuses_bad_input_and_readers(console_broker):
    path = "/api/v1/destinations/queue%2FDLQ/retry"
    call(console_broker, "POST", "/api/v1/destinations/queue%2FDLQ/messages", {"body": "x"})
    assert call(console_broker, "POST", path, {"message_ids": "not a list"})[0] == 400
    assert call(console_broker, "POST", path, b"{", headers={"Content-Type": "application/json"})[0] == 400
    assert call(console_broker, "POST", path, auth=READER)[0] == 403
    status, body, _ = call(console_broker, "POST", path)  # sent to the DLQ directly: nowhere to go back to
    assert status == 200 and json.loads(body) == {"moved": 0, "skipped": 1}


def test_mqtt_subscribers_are_listed_under_their_topic(console_broker, paho):
    clean_id = unique("clean")
    clean = paho(console_broker, clean_id)
    clean.subscribe(("plant/+/temp", 1))
    kept_id = unique("kept")
    kept = paho(console_broker, kept_id, clean=False)
    kept.subscribe(("plant/+/temp", 1))
    listed = wait_for(lambda: next((t for t in get(console_broker, "/api/v1/topics")
                                    if t["topic"] == "/topic/plant.*.temp" and len(t["subscribers"]) == 2), None),
                      what="both MQTT subscribers listed")
    by_kind = {s["kind"]: s for s in listed["subscribers"]}
    assert (by_kind["non-durable"]["name"], by_kind["non-durable"]["client_id"]) == ("plant/+/temp", clean_id)
    assert by_kind["non-durable"]["connection"].startswith("mqtt")
    assert by_kind["durable"]["client_id"] == f"mqtt:{kept_id}" and by_kind["durable"]["active"] is True
