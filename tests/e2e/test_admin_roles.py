"""The admin roles over HTTP (issue 29, item 8): ``read`` sees metrics and
state and never a message's contents (what Prometheus is given), ``browse``
also reads message contents (a queue's messages, an archive's ranges),
``write`` also changes things."""

from __future__ import annotations

import base64
import http.client
import json

import pytest

from gateway.admin.api import AdminSettings, load_users
from gateway.auth import hash_password

SECRET = b"card 4111-1111-1111-1111"  # what a message carries and a metrics user must not see
ROLES = {"viewer": "read", "auditor": "browse", "ops": "write"}
USERS = [{"name": name, "password_hash": hash_password(f"{name}-pw", iterations=1000), "role": role}
         for name, role in ROLES.items()]


def get(broker, path, user, method="GET"):
    conn = http.client.HTTPConnection("127.0.0.1", broker.admin_port, timeout=10)
    token = base64.b64encode(f"{user}:{user}-pw".encode()).decode()
    conn.request(method, path, headers={"Authorization": "Basic " + token})
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, body


@pytest.fixture
def broker(broker_factory, stomp_client):
    broker = broker_factory(admin={"users": USERS},
                            broker={"policies": [{"destination": "/topic/plant.>", "archive": True}]})
    producer = stomp_client(broker)
    producer.send("/queue/payments", SECRET, receipt=True)
    producer.send("/topic/plant.1", SECRET, receipt=True)
    return broker


CONTENTS = ["/api/v1/destinations/queue%2Fpayments/messages", "/api/v1/archive/plant.1/messages?from=0&to=1"]
STATE = ["/metrics", "/api/v1/overview", "/api/v1/destinations", "/api/v1/destinations/queue%2Fpayments",
         "/api/v1/topics", "/api/v1/connections", "/api/v1/archive", "/api/v1/archive/plant.1", "/api/v1/whoami"]


def test_a_read_user_sees_metrics_and_state_but_no_message_contents(broker):
    for path in STATE:
        status, body = get(broker, path, "viewer")
        assert status == 200, path
        assert SECRET not in body, path
    for path in CONTENTS:
        status, body = get(broker, path, "viewer")
        assert status == 403, path
        assert json.loads(body)["reason"] == "reading message contents takes the browse or write role; viewer has read"
        assert SECRET not in body
    queue = json.loads(get(broker, "/api/v1/destinations/queue%2Fpayments", "viewer")[1])
    assert queue["depth"] == 1  # the figures are there, the message is not


@pytest.mark.parametrize("user", ["auditor", "ops"])
def test_a_browse_or_write_user_reads_message_contents(broker, user):
    status, body = get(broker, CONTENTS[0], user)
    assert status == 200 and [m["body"] for m in json.loads(body)] == [SECRET.decode()]
    status, body = get(broker, CONTENTS[1], user)
    assert status == 200 and SECRET in body  # the Arrow stream carries the body's bytes
    assert json.loads(get(broker, "/api/v1/whoami", user)[1]) == {"user": user, "role": ROLES[user]}


def test_browsing_is_no_right_to_change_anything(broker):
    status, body = get(broker, "/api/v1/destinations/queue%2Fpayments/purge", "auditor", method="POST")
    assert status == 403 and json.loads(body)["reason"] == "changing things takes the write role; auditor has browse"
    assert json.loads(get(broker, "/api/v1/destinations/queue%2Fpayments", "auditor")[1])["depth"] == 1


def test_an_unknown_role_is_refused_at_start():
    bad = AdminSettings(users=[{"name": "x", "password_hash": USERS[0]["password_hash"], "role": "monitoring"}])
    with pytest.raises(ValueError, match="read\\|browse\\|write"):
        load_users(bad)
