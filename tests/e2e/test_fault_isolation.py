"""A bug met by one connection costs that connection only: the broker, its
other clients and the admin server go on (the bug is injected here, since the
suite knows of none)."""

from __future__ import annotations

import http.client

from core.transactions import Transaction
from gateway.admin.api import AdminApi
from gateway.session.skeleton import Skeleton
from tests.support.helpers import unique


def test_a_crashing_frame_handler_drops_only_its_connection(broker, stomp_client, raw_client, monkeypatch):
    def broken(self, id):
        raise RuntimeError("injected bug")

    # The core's side of a STOMP BEGIN opens a Transaction (a pure-Python class
    # even in the compiled build, whose own methods a patch would not reach).
    monkeypatch.setattr(Transaction, "__init__", broken)
    survivor = stomp_client(broker)
    queue = f"/queue/{unique()}"
    survivor.subscribe(queue)
    victim = raw_client(broker)
    victim.connect()
    victim.send_frame("BEGIN", {"transaction": "t1"})
    victim.wait_closed()
    survivor.send(queue, b"still here")
    assert survivor.wait_messages(1)[0].body == b"still here"


def test_a_bug_in_a_connections_writer_task_drops_only_that_connection(broker, stomp_client, raw_client, monkeypatch):
    # A closing session's last bytes are written by its writer task (which
    # runs in the server's handler nursery, not in a nursery of the
    # connection's own); the bug is met there, after the RECEIPT is sent.
    original = Skeleton.on_drained

    def broken(self):
        if self.closed:
            raise RuntimeError("injected bug")
        original(self)

    monkeypatch.setattr(Skeleton, "on_drained", broken)
    survivor = stomp_client(broker)
    queue = f"/queue/{unique()}"
    survivor.subscribe(queue)
    victim = raw_client(broker)
    victim.connect()
    victim.send_frame("DISCONNECT", {"receipt": "bye"})
    assert [frame.headers.get("receipt-id") for frame in victim.wait_closed()] == ["bye"]
    survivor.send(queue, b"still here")
    assert survivor.wait_messages(1)[0].body == b"still here"
    again = raw_client(broker)
    assert again.connect().command == "CONNECTED"


def test_a_crashing_admin_route_answers_500_and_the_next_request_works(broker, monkeypatch):
    original = AdminApi.handle

    def flaky(self, request):
        if request.target == "/healthz":
            raise RuntimeError("injected bug")
        return original(self, request)

    monkeypatch.setattr(AdminApi, "handle", flaky)
    connection = http.client.HTTPConnection("127.0.0.1", broker.admin_port, timeout=5)
    try:
        connection.request("GET", "/healthz")
        response = connection.getresponse()
        assert response.status == 500 and b"internal error" in response.read()
        connection.request("GET", "/readyz")  # same keep-alive connection
        assert connection.getresponse().status == 200
    finally:
        connection.close()
