"""RECEIPTs, and bad input: every rejection is one ERROR frame with a
`message` header (and `receipt-id` when the offending frame asked for a
receipt), then the connection closes, while a healthy stomp.py connection next
to it keeps sending and receiving."""

from __future__ import annotations

import threading

import pytest

from tests.support.helpers import unique, wait_for


class Healthy:
    """A stomp.py producer and consumer on their own connections."""

    def __init__(self, broker, stomp_client) -> None:
        self.queue = f"/queue/{unique('healthy')}"
        self.producer = stomp_client(broker)
        self.consumer = stomp_client(broker)
        self.consumer.subscribe(self.queue)
        self.sent: list[bytes] = []

    def check(self) -> None:
        """One message through the broker, receipted and received."""
        body = unique("ok-").encode()
        self.sent.append(body)
        self.producer.send(self.queue, body)
        self.consumer.wait_messages(len(self.sent))
        assert self.consumer.bodies == self.sent
        assert self.producer.rec.errors == [] and self.consumer.rec.errors == []


@pytest.fixture
def healthy(broker, stomp_client) -> Healthy:
    h = Healthy(broker, stomp_client)
    h.check()
    return h


def connected(broker, raw_client, version: str | None = "1.2"):
    raw = raw_client(broker)
    raw.connect(version)
    return raw


# -- receipts ----------------------------------------------------------------


def queue_state(broker, queue: str) -> tuple[int, list[int]]:
    def look() -> tuple[int, list[int]]:
        for address, q in broker.running.broker.queues.items():
            if address.text == queue:
                return q.depth, [len(c.unacked) for c in q.consumers]
        return -1, []

    return broker.call(look)


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_receipts_come_once_the_effect_is_done(broker, raw_client, version):
    raw = connected(broker, raw_client, version)
    queue = f"/queue/{unique('r')}"

    raw.send_frame("SEND", {"destination": queue, "receipt": "send"}, b"one")
    raw.receipt("send")
    assert queue_state(broker, queue) == (1, [])

    raw.send_frame("SUBSCRIBE", {"destination": queue, "id": "s", "ack": "client-individual", "receipt": "sub"})
    # The receipt says the subscription is in place; the waiting message follows it.
    raw.receipt("sub")
    message = raw.expect("MESSAGE")
    assert queue_state(broker, queue) == (0, [1])

    ack_headers = {"id": message.headers["ack"]} if version == "1.2" else {"message-id": message.headers["message-id"], "subscription": "s"}
    raw.send_frame("NACK", {**ack_headers, "receipt": "nack"})
    again = raw.expect("MESSAGE")
    raw.receipt("nack")
    assert again.headers["redelivered"] == "true"
    ack_headers = {"id": again.headers["ack"]} if version == "1.2" else {"message-id": again.headers["message-id"], "subscription": "s"}

    raw.send_frame("BEGIN", {"transaction": "t", "receipt": "begin"})
    raw.receipt("begin")
    raw.send_frame("ACK", {**ack_headers, "transaction": "t", "receipt": "ack"})
    raw.receipt("ack")
    raw.send_frame("SEND", {"destination": queue, "transaction": "t", "receipt": "send-t"}, b"two")
    raw.receipt("send-t")
    raw.send_frame("COMMIT", {"transaction": "t", "receipt": "commit"})
    second = raw.expect("MESSAGE")  # the committed send reaches the subscriber
    raw.receipt("commit")
    assert second.body == b"two"
    assert queue_state(broker, queue) == (0, [1])

    raw.send_frame("BEGIN", {"transaction": "u", "receipt": "begin-u"})
    raw.receipt("begin-u")
    raw.send_frame("ABORT", {"transaction": "u", "receipt": "abort"})
    raw.receipt("abort")

    raw.send_frame("UNSUBSCRIBE", {"id": "s", "receipt": "unsub"})
    raw.receipt("unsub")
    assert queue_state(broker, queue) == (1, [])  # "two" was unacked: back in the queue

    raw.send_frame("DISCONNECT", {"receipt": "bye"})
    raw.receipt("bye")
    assert raw.wait_closed() == []


def test_stomp_py_disconnect_receipt(broker, stomp_client):
    client = stomp_client(broker)
    client.conn.disconnect(receipt="goodbye")
    client.wait_receipt("goodbye")
    assert client.rec.disconnected.wait(5)


def test_frames_without_receipt_get_none(broker, raw_client):
    raw = connected(broker, raw_client)
    raw.send_frame("SEND", {"destination": "/queue/nr"}, b"x")
    raw.send_frame("SEND", {"destination": "/queue/nr", "receipt": "only"}, b"x")
    # Frames are answered in order: had the first one got a receipt, it would come first.
    raw.receipt("only")


# -- bad input after CONNECT ---------------------------------------------------

BAD_FRAMES = {
    # name: (frame bytes, words expected in the message, receipt expected)
    "unknown command": (b"BOGUS\nreceipt:r\n\n\x00", "unknown command", True),
    "lower-case command": (b"send\ndestination:/queue/a\n\nx\x00", "unknown command", False),
    "SEND without destination": (b"SEND\nreceipt:r\n\nx\x00", "destination", True),
    "SUBSCRIBE without destination": (b"SUBSCRIBE\nid:1\nreceipt:r\n\n\x00", "destination", True),
    "SUBSCRIBE without id": (b"SUBSCRIBE\ndestination:/queue/a\nreceipt:r\n\n\x00", "id", True),
    "UNSUBSCRIBE without id": (b"UNSUBSCRIBE\nreceipt:r\n\n\x00", "id", True),
    "UNSUBSCRIBE of an unknown id": (b"UNSUBSCRIBE\nid:nope\nreceipt:r\n\n\x00", "nope", True),
    "ACK without id": (b"ACK\nreceipt:r\n\n\x00", "id", True),
    "NACK without id": (b"NACK\nreceipt:r\n\n\x00", "id", True),
    "COMMIT without transaction": (b"COMMIT\nreceipt:r\n\n\x00", "transaction", True),
    "ABORT without transaction": (b"ABORT\nreceipt:r\n\n\x00", "transaction", True),
    "unknown ack mode": (b"SUBSCRIBE\ndestination:/queue/a\nid:1\nack:sometimes\nreceipt:r\n\n\x00", "ack", True),
    "non-numeric prefetch": (b"SUBSCRIBE\ndestination:/queue/a\nid:1\nactivemq.prefetchSize:lots\nreceipt:r\n\n\x00", "prefetch", True),
    "a second CONNECT": (b"CONNECT\naccept-version:1.2\nreceipt:r\n\n\x00", "CONNECT", True),
    "invalid escape": (b"SEND\ndestination:/queue/a\nx-h:a\\tb\n\nx\x00", "escape", False),
    "escape at end of value": (b"SEND\ndestination:/queue/a\nx-h:a\\\n\nx\x00", "escape", False),
    "header line without colon": (b"SEND\ndestination:/queue/a\nno colon here\n\nx\x00", "colon", False),
    "content-length not a number": (b"SEND\ndestination:/queue/a\ncontent-length:five\n\nhello\x00", "content-length", False),
    "content-length too short": (b"SEND\ndestination:/queue/a\ncontent-length:2\n\nhello\x00", "NUL", False),
    "body on SUBSCRIBE": (b"SUBSCRIBE\ndestination:/queue/a\nid:1\n\nbody\x00", "body", False),
    "invalid UTF-8 in a header": (b"SEND\ndestination:/queue/a\nx-h:\xff\xfe\n\nx\x00", "UTF-8", False),
    "garbage bytes": (b"\x00\x01\x02\xff\xfe\xfd garbage \x80\x81\n\n\x00", "", False),
    "bare CR": (b"SEND\rdestination:/queue/a\n\nx\x00", "", False),
}


@pytest.mark.parametrize("name", list(BAD_FRAMES))
def test_bad_frame_gets_error_and_close(broker, raw_client, healthy, name):
    data, words, with_receipt = BAD_FRAMES[name]
    raw = connected(broker, raw_client)
    raw.send(data)
    error = raw.expect_error_and_close()
    assert words.lower() in error.headers["message"].lower(), error.headers
    if with_receipt:
        assert error.headers.get("receipt-id") == "r", error.headers
    healthy.check()


MALFORMED_DESTINATIONS = [
    "/queue/",
    "/topic/",
    "/bogus/a",
    "queue/a",
    "a",
    "/queue/a..b",
    "/queue/.a",
    "/queue/a.",
    "/queue/a*",
    "/topic/a.>.b",
    "/topic/a.b>",
    "/queue/a\tb",
    "/queue/" + "x" * 2000,
]


@pytest.mark.parametrize("destination", MALFORMED_DESTINATIONS)
def test_send_to_a_malformed_destination(broker, raw_client, healthy, destination):
    raw = connected(broker, raw_client)
    raw.send_frame("SEND", {"destination": destination, "receipt": "r"}, b"x")
    error = raw.expect_error_and_close()
    assert "destination" in error.headers["message"]
    assert error.headers["receipt-id"] == "r"
    healthy.check()


@pytest.mark.parametrize("destination", ["/queue/", "/bogus/a", "/queue/a..b"])
def test_subscribe_to_a_malformed_destination(broker, raw_client, healthy, destination):
    raw = connected(broker, raw_client)
    raw.send_frame("SUBSCRIBE", {"destination": destination, "id": "1", "receipt": "r"})
    error = raw.expect_error_and_close()
    assert error.headers["receipt-id"] == "r"
    healthy.check()


def test_duplicate_subscription_id(broker, raw_client, healthy):
    raw = connected(broker, raw_client)
    raw.send_frame("SUBSCRIBE", {"destination": "/queue/d1", "id": "same"})
    raw.send_frame("SUBSCRIBE", {"destination": "/queue/d2", "id": "same", "receipt": "r"})
    error = raw.expect_error_and_close()
    assert error.headers["receipt-id"] == "r"
    healthy.check()


def test_invalid_escape_in_stomp_1_1(broker, raw_client, healthy):
    raw = connected(broker, raw_client, "1.1")
    # \r is an escape in 1.2 only.
    raw.send(b"SEND\ndestination:/queue/a\nx-h:a\\rb\n\nx\x00")
    assert "escape" in raw.expect_error_and_close().headers["message"]
    healthy.check()


def test_connect_headers_are_not_unescaped(broker, raw_client):
    raw = raw_client(broker)
    # A backslash in a CONNECT header is literal (STOMP 1.2 §Value Encoding).
    raw.send(b"CONNECT\naccept-version:1.2\nhost:h\nlogin:dom\\tuser\npasscode:p\\a\\ss\n\n\x00")
    assert raw.expect("CONNECTED").headers["version"] == "1.2"


def test_garbage_without_a_line_end_is_rejected_promptly(broker, raw_client, healthy):
    raw = connected(broker, raw_client)
    # Binary junk with no LF and no NUL: it can never become a STOMP frame
    # (no command is longer than 11 bytes).
    raw.send(bytes(range(0x80, 0x80 + 64)) * 4)
    raw.expect_error_and_close(timeout=2)
    healthy.check()


def test_tls_client_hello_on_the_plain_port_is_rejected_promptly(broker_factory, raw_client, stomp_client):
    broker = broker_factory(stomp={"connect_timeout_s": 10.0})
    healthy = Healthy(broker, stomp_client)
    raw = raw_client(broker)
    # The start of a TLS 1.2 ClientHello, as a client configured for TLS sends.
    hello = bytes.fromhex("16030102000100" "01fc0303") + bytes(range(0x41, 0x61)) + b"\x00\x00\x3e" + bytes(range(0x20, 0x5e))
    assert b"\n" not in hello and b"\x00" in hello
    raw.send(hello)
    raw.expect_error_and_close(timeout=2)
    healthy.check()


# -- limits ----------------------------------------------------------------


def test_frame_over_the_size_limit(broker_factory, raw_client, stomp_client):
    broker = broker_factory(stomp={"max_frame_bytes": 2048})
    healthy = Healthy(broker, stomp_client)
    raw = connected(broker, raw_client)
    raw.send_frame("SEND", {"destination": "/queue/big", "receipt": "ok"}, b"x" * 1500)
    raw.receipt("ok")
    raw.send_frame("SEND", {"destination": "/queue/big", "receipt": "big"}, b"x" * 3000)
    error = raw.expect_error_and_close()
    assert "too large" in error.headers["message"]
    healthy.check()
    healthy.producer.send("/queue/big", b"y" * 1500)
    healthy.check()


def test_oversized_content_length_is_rejected_before_the_body_arrives(broker_factory, raw_client, stomp_client):
    broker = broker_factory(stomp={"max_frame_bytes": 2048})
    healthy = Healthy(broker, stomp_client)
    raw = connected(broker, raw_client)
    raw.send(b"SEND\ndestination:/queue/big\ncontent-length:1000000000\n\n" + b"x" * 100)
    error = raw.expect_error_and_close()
    assert "too large" in error.headers["message"]
    healthy.check()


def test_unterminated_body_over_the_limit_is_rejected_before_its_end(broker_factory, raw_client, stomp_client):
    broker = broker_factory(stomp={"max_frame_bytes": 2048})
    healthy = Healthy(broker, stomp_client)
    raw = connected(broker, raw_client)
    raw.send(b"SEND\ndestination:/queue/big\n\n" + b"x" * 4096)  # no NUL yet
    error = raw.expect_error_and_close()
    assert "too large" in error.headers["message"]
    healthy.check()


def test_default_frame_limit_is_4_mib(broker, raw_client, healthy):
    raw = connected(broker, raw_client)
    raw.send_frame("SEND", {"destination": "/queue/big", "receipt": "ok"}, b"x" * (4 * 1024 * 1024 - 1024))
    raw.receipt("ok")
    raw.send_frame("SEND", {"destination": "/queue/big", "receipt": "big"}, b"x" * (4 * 1024 * 1024 + 1))
    assert "too large" in raw.expect_error_and_close().headers["message"]
    healthy.check()


def test_up_to_100_headers_are_accepted_and_101_are_not(broker, raw_client, stomp_client, healthy):
    consumer = stomp_client(broker)
    queue = f"/queue/{unique('h')}"
    consumer.subscribe(queue)
    raw = connected(broker, raw_client)
    many = [("destination", queue), ("receipt", "ok")] + [(f"x-{i}", str(i)) for i in range(98)]
    assert len(many) == 100
    raw.send_frame("SEND", many, b"x")
    raw.receipt("ok")
    message = consumer.wait_messages(1)[0]
    assert all(message.headers[f"x-{i}"] == str(i) for i in range(98))
    raw.send_frame("SEND", [*many, ("x-one-more", "1")], b"x")
    error = raw.expect_error_and_close()
    assert "too many headers" in error.headers["message"]
    healthy.check()


def test_max_headers_is_configurable(broker_factory, raw_client, stomp_client):
    broker = broker_factory(stomp={"max_headers": 5})
    healthy = Healthy(broker, stomp_client)
    raw = connected(broker, raw_client)
    raw.send_frame("SEND", [("destination", "/queue/h")] + [(f"x-{i}", "v") for i in range(5)], b"x")
    assert "too many headers" in raw.expect_error_and_close().headers["message"]
    healthy.check()


def test_header_of_100_kib_is_the_limit(broker, raw_client, stomp_client, healthy):
    consumer = stomp_client(broker)
    queue = f"/queue/{unique('h')}"
    consumer.subscribe(queue)
    raw = connected(broker, raw_client)
    big = "v" * (60 * 1024)
    raw.send_frame("SEND", {"destination": queue, "x-big": big, "receipt": "ok"}, b"x")
    raw.receipt("ok")
    assert consumer.wait_messages(1)[0].headers["x-big"] == big
    raw.send_frame("SEND", {"destination": queue, "x-big": "v" * (100 * 1024 + 1)}, b"x")
    error = raw.expect_error_and_close()
    assert "header" in error.headers["message"] and "too long" in error.headers["message"]
    healthy.check()


def test_header_line_limit_is_configurable(broker_factory, raw_client, stomp_client):
    broker = broker_factory(stomp={"max_header_bytes": 256})
    healthy = Healthy(broker, stomp_client)
    raw = connected(broker, raw_client)
    raw.send_frame("SEND", {"destination": "/queue/h", "x-big": "v" * 300}, b"x")
    assert "too long" in raw.expect_error_and_close().headers["message"]
    healthy.check()


def test_header_line_over_the_limit_is_rejected_before_it_ends(broker_factory, raw_client, stomp_client):
    broker = broker_factory(stomp={"max_header_bytes": 256})
    healthy = Healthy(broker, stomp_client)
    raw = connected(broker, raw_client)
    raw.send(b"SEND\ndestination:/queue/h\nx-big:" + b"v" * 1024)  # the line never ends
    assert "too long" in raw.expect_error_and_close().headers["message"]
    healthy.check()


# -- before CONNECT the limits are tighter ------------------------------------


def test_preconnect_header_limit_is_tighter(broker, raw_client, stomp_client, healthy):
    ten_kib = "v" * (10 * 1024)
    raw = raw_client(broker)
    raw.send_frame("CONNECT", {"accept-version": "1.2", "host": "h", "x-big": ten_kib})
    assert "too long" in raw.expect_error_and_close().headers["message"]
    # The same header is fine once connected.
    consumer = stomp_client(broker)
    queue = f"/queue/{unique('h')}"
    consumer.subscribe(queue)
    ok = connected(broker, raw_client)
    ok.send_frame("SEND", {"destination": queue, "x-big": ten_kib, "receipt": "r"}, b"x")
    ok.receipt("r")
    assert consumer.wait_messages(1)[0].headers["x-big"] == ten_kib
    healthy.check()


def test_preconnect_header_count_is_tighter(broker, raw_client, healthy):
    extra = [(f"x-{i}", "v") for i in range(40)]
    raw = raw_client(broker)
    raw.send_frame("CONNECT", [("accept-version", "1.2"), ("host", "h"), *extra])
    assert "too many headers" in raw.expect_error_and_close().headers["message"]
    ok = connected(broker, raw_client)
    ok.send_frame("SEND", [("destination", "/queue/h"), ("receipt", "r"), *extra], b"x")
    ok.receipt("r")
    healthy.check()


def test_preconnect_frame_size_is_tighter(broker, raw_client, healthy):
    headers = [("accept-version", "1.2"), ("host", "h")] + [(f"x-{i}", "v" * 7000) for i in range(10)]
    raw = raw_client(broker)
    raw.send_frame("CONNECT", headers)
    assert "too large" in raw.expect_error_and_close().headers["message"]
    ok = connected(broker, raw_client)
    ok.send_frame("SEND", [("destination", "/queue/h"), ("receipt", "r")], b"x" * 100_000)
    ok.receipt("r")
    healthy.check()


# -- a misbehaving connection next to a flowing one ---------------------------


def test_misbehaving_connections_do_not_disturb_a_flowing_one(broker, raw_client, stomp_client):
    producer = stomp_client(broker)
    consumer = stomp_client(broker)
    queue = f"/queue/{unique('flow')}"
    consumer.subscribe(queue)
    stop = threading.Event()
    sent: list[bytes] = []
    failures: list[BaseException] = []

    def produce() -> None:
        try:
            i = 0
            while not stop.is_set():
                body = str(i).encode()
                producer.send(queue, body, receipt=(i % 20 == 0))
                sent.append(body)
                i += 1
        except BaseException as exc:  # reported by the test thread below
            failures.append(exc)

    thread = threading.Thread(target=produce, name="producer")
    thread.start()
    try:
        wait_for(lambda: len(consumer.messages) > 50, what="flow started")
        for data in [
            b"BOGUS\n\n\x00",
            b"SEND\ndestination:/nowhere\n\nx\x00",
            b"\xff\xfe\xfd\n\n\x00",
            b"SEND\ndestination:/queue/a\nx:a\\qb\n\nx\x00",
            b"SEND\ndestination:/queue/a\n" + b"".join(b"h%d:v\n" % i for i in range(200)) + b"\nx\x00",
        ]:
            raw = connected(broker, raw_client)
            raw.send(data)
            raw.expect_error_and_close()
            before = len(consumer.messages)
            wait_for(lambda: len(consumer.messages) > before + 20, what="flow continuing after a rejection")
    finally:
        stop.set()
        thread.join(10)
    assert failures == []
    producer.send(queue, b"last")
    sent.append(b"last")
    consumer.wait_messages(len(sent))
    consumer.barrier()
    assert consumer.bodies == sent, "messages lost or reordered on the healthy connection"
    assert consumer.rec.errors == [] and producer.rec.errors == []


def test_a_subscriber_that_stops_reading_does_not_stall_the_others(broker, raw_client, stomp_client):
    topic = f"/topic/{unique('busy')}"
    stalled = raw_client(broker, rcvbuf=16384)
    session = stalled.connect(heart_beat="0,0").headers["session"]
    stalled.send_frame("SUBSCRIBE", {"destination": topic, "id": "1", "receipt": "s"})
    stalled.receipt("s")
    # From here on the stalled client reads nothing.
    healthy = stomp_client(broker)
    healthy.subscribe(topic)
    producer = stomp_client(broker)
    body = b"x" * 4096
    count = 1500  # about 6 MB: far more than socket buffers and the outbox hold
    for i in range(count):
        producer.send(topic, body, receipt=(i % 100 == 99))
    healthy.wait_messages(count, timeout=10)
    assert len(healthy.messages) == count
    assert producer.rec.errors == [] and healthy.rec.errors == []
    # The stalled subscriber really was stalled: its output is backed up in the broker.
    backlog = broker.call(lambda: broker.running.server.connections[session].session.outbox.nbytes)
    assert backlog >= 64 * 1024
