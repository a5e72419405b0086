"""The STOMP session through its own door, sans-IO: bytes in, frames read
back from its outbox, a fake clock driving next_deadline()/on_deadline(),
and a real core Broker (no store unless a test gives it one)."""

from __future__ import annotations

from typing import Any

from core.broker import Broker, BrokerSettings
from gateway.stomp import codec, frames
from gateway.stomp.session import StompSession, StompSettings
from tests.support.core_fakes import FakeClock, RecordingStore


class Log:
    """A structlog stand-in that keeps what was logged."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    def bind(self, **_: Any) -> Log:
        return self

    def info(self, event: str, **fields: Any) -> None:
        self.events.append(("info", event, fields))

    def warning(self, event: str, **fields: Any) -> None:
        self.events.append(("warning", event, fields))

    def named(self, event: str) -> list[dict[str, Any]]:
        return [fields for _, name, fields in self.events if name == event]


def frame(command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> bytes:
    head = "".join(f"{key}:{value}\n" for key, value in (headers or {}).items())
    return f"{command}\n{head}\n".encode() + body + b"\x00"


class Peer:
    """The client's end of one session: writes frames in, reads the outbox out."""

    def __init__(self, broker: Broker, clock: FakeClock, **settings: Any) -> None:
        self.log = Log()
        self.session = StompSession(broker, clock, StompSettings(**settings), conn_id="c1", log=self.log)
        self.codec = codec.StompConnection(codec.Role.CLIENT)
        self.codec.set_version("1.2")
        self.raw: list[bytes] = []
        self.durable_lsn = 1 << 62  # everything durable unless a test says otherwise

    def send(self, command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.session.skeleton.receive_data(frame(command, headers, body))

    def connect(self, **headers: str) -> frames.Frame:
        self.send("CONNECT", {"accept-version": "1.2", "host": "h", "heart-beat": "0,0", **headers})
        [connected] = self.read()
        assert type(connected) is frames.Connected, connected
        return connected

    def read(self) -> list[frames.Frame]:
        """Drain the outbox as the writer would (then on_drained) and parse it."""
        out: list[frames.Frame] = []
        while True:
            data = self.session.outbox.drain(self.durable_lsn)
            if not data:
                return out
            self.raw.append(data)
            self.session.skeleton.on_drained()
            self.codec.receive_data(data)
            out.extend(self.codec.events())


def setup(**settings: Any) -> tuple[Broker, FakeClock, Peer]:
    clock = FakeClock()
    broker = Broker(clock)
    return broker, clock, Peer(broker, clock, **settings)


# -- CONNECT ---------------------------------------------------------------


def test_connect_gets_connected_with_the_negotiated_version_and_heart_beat() -> None:
    _, _, peer = setup(heartbeat_send_ms=500, heartbeat_receive_ms=700)
    connected = peer.connect(**{"accept-version": "1.0,1.1,1.2", "heart-beat": "0,0"})
    assert connected.headers["version"] == "1.2"
    assert connected.headers["heart-beat"] == "500,700"
    assert connected.headers["session"] == "c1"
    assert not peer.session.closed and peer.session.client is not None
    assert peer.session.skeleton.next_deadline() is None  # heart-beats off both ways: nothing to wait for


def test_a_frame_before_connect_is_an_error_that_echoes_its_receipt() -> None:
    _, _, peer = setup()
    peer.send("SEND", {"destination": "/queue/a", "receipt": "r1"})
    [error] = peer.read()
    assert type(error) is frames.Error
    assert error.headers["message"] == "expected CONNECT or STOMP, not SEND"
    assert error.headers["receipt-id"] == "r1"
    assert peer.session.closed and peer.session.close_reason == "expected CONNECT or STOMP, not SEND"
    assert peer.log.named("frame_rejected") == [{"frame": "SEND", "reason": "expected CONNECT or STOMP, not SEND"}]


def test_a_second_connect_is_an_error() -> None:
    _, _, peer = setup()
    peer.connect()
    peer.send("STOMP", {"accept-version": "1.2", "host": "h"})
    [error] = peer.read()
    assert error.headers["message"] == "unexpected STOMP frame: the connection is already established"
    assert peer.session.closed


def test_an_unsupported_version_is_refused_with_the_versions_offered() -> None:
    _, _, peer = setup()
    peer.send("CONNECT", {"accept-version": "9.9", "host": "h"})
    [error] = peer.read()
    assert error.headers["version"] == "1.0,1.1,1.2"
    assert peer.session.closed


def test_bytes_the_codec_cannot_parse_get_its_error() -> None:
    _, _, peer = setup()
    peer.session.skeleton.receive_data(b"NOT-A-COMMAND\n\n\x00")
    [error] = peer.read()
    assert type(error) is frames.Error and "NOT-A-COMMAND" in error.headers["message"]
    assert peer.session.closed


def test_frames_after_the_error_are_not_handled() -> None:
    _, _, peer = setup()
    peer.session.skeleton.receive_data(frame("SEND", {"destination": "/queue/a"}) + frame("CONNECT"))
    assert [type(f) for f in peer.read()] == [frames.Error]
    assert peer.session.client is None  # the CONNECT behind the error was not handled


def test_eof_closes_quietly_and_says_whether_it_cut_a_frame() -> None:
    _, _, whole = setup()
    whole.connect()
    whole.session.skeleton.receive_data(b"")
    assert whole.session.closed and whole.session.close_reason == "peer closed the connection"
    assert whole.read() == []
    _, _, cut = setup()
    cut.connect()
    cut.session.skeleton.receive_data(b"SEND\ndestination:/queue/a\n")
    cut.session.skeleton.receive_data(b"")
    assert cut.session.close_reason == "peer closed the connection mid-frame"


# -- SEND, MESSAGE, receipts -------------------------------------------------


def test_send_reaches_a_subscriber_as_message_and_a_receipt_answers_it() -> None:
    broker, clock, consumer = setup()
    producer = Peer(broker, clock)
    consumer.connect()
    producer.connect()
    consumer.send("SUBSCRIBE", {"destination": "/queue/a", "id": "s1", "receipt": "sub"})
    assert [f.headers["receipt-id"] for f in consumer.read()] == ["sub"]
    producer.send("SEND", {"destination": "/queue/a", "receipt": "r1", "color": "red", "priority": "7"}, b"hello")
    [receipt] = producer.read()
    assert type(receipt) is frames.Receipt and receipt.headers == {"receipt-id": "r1"}
    [message] = consumer.read()
    assert type(message) is frames.Message and message.body == b"hello"
    assert message.headers["subscription"] == "s1"
    assert message.headers["destination"] == "/queue/a"
    assert message.headers["color"] == "red" and message.headers["priority"] == "7"
    assert "receipt" not in message.headers and "ack" not in message.headers  # auto ack: no ack id


def test_a_refused_send_echoes_its_receipt_though_the_header_was_consumed() -> None:
    _, _, peer = setup()
    peer.connect()
    peer.send("SEND", {"destination": "/queue/a", "receipt": "r9", "priority": "12"})
    [error] = peer.read()
    assert error.headers["message"] == "priority must be 0 to 9"
    assert error.headers["receipt-id"] == "r9"
    assert error.body == b"The rejected frame was SEND.\n"


def test_a_core_error_is_an_error_frame_with_the_receipt() -> None:
    _, _, peer = setup()
    peer.connect()
    peer.send("COMMIT", {"transaction": "nope", "receipt": "c1"})
    [error] = peer.read()
    assert "nope" in error.headers["message"] and error.headers["receipt-id"] == "c1"
    assert peer.session.closed


def test_a_receipt_for_a_persistent_send_waits_for_the_store() -> None:
    clock = FakeClock()
    store = RecordingStore()
    broker = Broker(clock, store=store)
    peer = Peer(broker, clock)
    peer.connect()
    peer.durable_lsn = 0
    peer.send("SEND", {"destination": "/queue/a", "persistent": "true", "receipt": "p1"}, b"x")
    assert peer.read() == [] and peer.session.outbox  # held behind its LSN
    gate = peer.session.outbox.waiting_on()
    assert gate is not None and gate > 0
    peer.durable_lsn = gate
    assert [f.headers["receipt-id"] for f in peer.read()] == ["p1"]


def test_a_failed_store_write_withdraws_the_receipt_and_says_so() -> None:
    clock = FakeClock()
    broker = Broker(clock, store=RecordingStore())
    peer = Peer(broker, clock)
    peer.connect()
    peer.durable_lsn = 0
    peer.send("SEND", {"destination": "/queue/a", "persistent": "true", "receipt": "p1"}, b"x")
    lsn = peer.session.outbox.waiting_on()
    assert lsn is not None
    peer.session.storage_failed(lsn, lsn, "disk full")
    peer.durable_lsn = 1 << 62
    [error] = peer.read()
    assert type(error) is frames.Error and error.headers["receipt-id"] == "p1"
    assert "disk full" in error.headers["message"] and error.body == b"receipt p1 withdrawn: not stored\n"


def test_a_receipt_an_ha_primary_stored_but_its_backups_did_not_confirm_is_withdrawn_saying_so() -> None:
    clock = FakeClock()
    broker = Broker(clock, store=RecordingStore())
    peer = Peer(broker, clock)
    peer.connect()
    peer.durable_lsn = 0
    peer.send("SEND", {"destination": "/queue/a", "persistent": "true", "receipt": "p1"}, b"x")
    lsn = peer.session.outbox.waiting_on()
    assert lsn is not None
    peer.session.storage_failed(lsn, lsn, "not confirmed by 1 in-sync backup within 10 s (0 in sync)", stored=True)
    peer.durable_lsn = 1 << 62
    [error] = peer.read()
    assert type(error) is frames.Error and error.headers["receipt-id"] == "p1"
    assert error.headers["message"] == "stored on the primary only: not confirmed by 1 in-sync backup within 10 s (0 in sync)"
    assert b"not stored" not in error.body and error.body.startswith(b"receipt p1 withdrawn: stored on the primary only")


# -- ack modes ---------------------------------------------------------------


def test_client_individual_acks_release_the_prefetch_window_one_message_at_a_time() -> None:
    broker, clock, consumer = setup()
    producer = Peer(broker, clock)
    consumer.connect()
    producer.connect()
    consumer.send("SUBSCRIBE", {"destination": "/queue/a", "id": "s", "ack": "client-individual",
                                "activemq.prefetchSize": "1"})
    for body in (b"1", b"2"):
        producer.send("SEND", {"destination": "/queue/a"}, body)
    [first] = consumer.read()
    assert first.body == b"1" and first.headers["ack"].startswith("1/")
    consumer.send("ACK", {"id": first.headers["ack"], "receipt": "a1"})
    # The ack frees the window: the core delivers the next at once, then the RECEIPT.
    second, receipt = consumer.read()
    assert second.body == b"2" and receipt.headers["receipt-id"] == "a1"
    consumer.send("ACK", {"id": first.headers["ack"]})  # already acked
    [error] = consumer.read()
    assert type(error) is frames.Error and "not awaiting acknowledgement" in error.headers["message"]


def test_client_ack_is_cumulative() -> None:
    broker, clock, consumer = setup()
    producer = Peer(broker, clock)
    consumer.connect()
    producer.connect()
    consumer.send("SUBSCRIBE", {"destination": "/queue/a", "id": "s", "ack": "client"})
    for body in (b"1", b"2"):
        producer.send("SEND", {"destination": "/queue/a"}, body)
    first, second = consumer.read()
    consumer.send("ACK", {"id": second.headers["ack"], "receipt": "both"})
    assert [f.headers.get("receipt-id") for f in consumer.read()] == ["both"]
    consumer.send("ACK", {"id": first.headers["ack"]})  # acked with the second
    [error] = consumer.read()
    assert type(error) is frames.Error


def test_nack_redelivers() -> None:
    broker, clock, consumer = setup()
    producer = Peer(broker, clock)
    consumer.connect()
    producer.connect()
    consumer.send("SUBSCRIBE", {"destination": "/queue/a", "id": "s", "ack": "client-individual"})
    producer.send("SEND", {"destination": "/queue/a"}, b"again")
    [message] = consumer.read()
    consumer.send("NACK", {"id": message.headers["ack"]})
    [redelivered] = consumer.read()
    assert redelivered.body == b"again" and redelivered.headers["redelivered"] == "true"


# -- deadlines ---------------------------------------------------------------


def test_no_connect_within_the_connect_timeout_is_an_error() -> None:
    _, clock, peer = setup(connect_timeout_s=5.0)
    deadline = peer.session.skeleton.next_deadline()
    assert deadline == clock.now + 5.0
    peer.session.skeleton.on_deadline(deadline - 0.1)
    assert not peer.session.closed and peer.read() == []
    clock.advance(5.0)
    peer.session.skeleton.on_deadline(clock.now)
    [error] = peer.read()
    assert error.headers["message"] == "no CONNECT within the connect timeout"
    assert peer.session.closed and peer.session.skeleton.next_deadline() is None


def test_a_connect_waiting_for_its_password_check_outlives_the_connect_timeout() -> None:
    from gateway.auth import AuthSettings, Gatekeeper, Transport, hash_password, verify_password

    _, clock, peer = setup(connect_timeout_s=5.0)
    users = [{"name": "app", "password_hash": hash_password("pw", iterations=1000)}]
    keeper = Gatekeeper(AuthSettings(users=users))
    checks: list[Any] = []
    keeper.verifiers["messaging"] = lambda passcode, stored, done: checks.append((passcode, stored, done)) or True
    peer.session.admit = lambda login, passcode: keeper.admit(login, passcode, Transport(host="h"))
    clock.advance(4.0)
    peer.send("CONNECT", {"accept-version": "1.2", "host": "h", "heart-beat": "0,0", "login": "app", "passcode": "pw"})
    assert len(checks) == 1 and peer.read() == []  # waiting for its check, sent in time
    assert peer.session.skeleton.next_deadline() is None
    clock.advance(60.0)  # the check waits its turn in a loaded queue, long past the connect timeout
    peer.session.skeleton.on_deadline(clock.now)
    assert not peer.session.closed and peer.read() == []
    passcode, stored, done = checks.pop()
    done(verify_password(passcode, stored))
    peer.session.skeleton.resume_input()  # what the server does once the gate is released
    [connected] = peer.read()
    assert type(connected) is frames.Connected and not peer.session.closed


def test_heart_beats_go_out_when_idle_and_a_silent_client_is_dropped() -> None:
    _, clock, peer = setup(heartbeat_send_ms=1000, heartbeat_receive_ms=1000, heartbeat_grace=2.0)
    start = clock.now
    peer.connect(**{"heart-beat": "1000,1000"})
    skeleton = peer.session.skeleton
    assert skeleton.next_deadline() == start + 1.0  # our beat, before their silence (2 s)
    clock.advance(1.0)
    skeleton.on_deadline(clock.now)
    peer.read()
    assert peer.raw[-1] == b"\n"  # a heart-beat
    clock.advance(0.5)
    skeleton.receive_data(b"\n")  # theirs: silence starts again
    assert skeleton.next_deadline() == clock.now + 0.5  # our next beat, 1 s after the last
    clock.advance(0.5)
    skeleton.on_deadline(clock.now)
    clock.advance(1.0)
    skeleton.on_deadline(clock.now)
    assert not peer.session.closed  # 1.5 s since they spoke, under 2 s
    clock.advance(0.5)
    skeleton.on_deadline(clock.now)
    assert peer.session.closed
    assert peer.session.close_reason == "heart-beat timeout: nothing received from the client in time"
    assert type(peer.read()[-1]) is frames.Error


def test_output_waiting_counts_as_a_heart_beat() -> None:
    broker, clock, peer = setup(heartbeat_send_ms=1000)
    peer.connect(**{"heart-beat": "0,1000"})
    peer.send("SEND", {"destination": "/queue/a", "receipt": "r"})  # left in the outbox
    clock.advance(1.0)
    peer.session.skeleton.on_deadline(clock.now)
    assert [type(f) for f in peer.read()] == [frames.Receipt]
    assert b"\n" not in peer.raw


# -- flow control ------------------------------------------------------------


def test_a_full_outbox_stops_deliveries_and_draining_resumes_them() -> None:
    broker, clock, consumer = setup(outbox_high_water_bytes=600)
    producer = Peer(broker, clock)
    consumer.connect()
    producer.connect()
    consumer.send("SUBSCRIBE", {"destination": "/queue/a", "id": "s"})
    for n in range(20):
        producer.send("SEND", {"destination": "/queue/a"}, b"%03d" % n + b"x" * 100)
    outbox = consumer.session.outbox
    assert outbox.full and not consumer.session.accepting and not consumer.session.skeleton.wants_input
    held = outbox.nbytes
    assert held < 600 + 400  # stopped at the high-water mark, not after all 20
    bodies = [f.body[:3] for f in consumer.read()]  # drains, on_drained resumes, repeat
    while len(bodies) < 20:
        more = consumer.read()
        assert more, "deliveries did not resume"
        bodies += [f.body[:3] for f in more]
    assert bodies == [b"%03d" % n for n in range(20)]


def test_a_producer_held_by_the_core_stops_reading_until_released() -> None:
    clock = FakeClock()
    broker = Broker(clock, BrokerSettings(queue_high_water=2))
    producer, consumer = Peer(broker, clock), Peer(broker, clock)
    producer.connect()
    consumer.connect()
    producer.session.skeleton.receive_data(b"".join(frame("SEND", {"destination": "/queue/q"}, b"%d" % n) for n in range(5)))
    skeleton = producer.session.skeleton
    assert not skeleton.wants_input and skeleton.codec.buffered_bytes  # the rest waits in the codec
    woken: list[bool] = []
    skeleton.gate.wake_reader = lambda: woken.append(True)
    consumer.send("SUBSCRIBE", {"destination": "/queue/q", "id": "s"})
    assert woken and skeleton.wants_input  # the queue drained: the core let go
    skeleton.resume_input()
    assert sorted(f.body for f in consumer.read()) == [b"0", b"1", b"2", b"3", b"4"]


def test_a_held_producer_at_its_deadline_cuts_a_slow_topic_consumer_loose() -> None:
    clock = FakeClock()
    broker = Broker(clock, BrokerSettings(topic_high_water=2, slow_consumer_s=2.0))
    producer, consumer = Peer(broker, clock), Peer(broker, clock, outbox_high_water_bytes=1)
    producer.connect()
    consumer.connect()
    consumer.send("SUBSCRIBE", {"destination": "/topic/t", "id": "s"})
    consumer.read()
    for n in range(6):
        producer.send("SEND", {"destination": "/topic/t"}, b"%d" % n)
    skeleton = producer.session.skeleton
    assert not skeleton.wants_input
    deadline = skeleton.next_deadline()
    assert deadline == clock.now + 2.0
    clock.advance(2.0)
    skeleton.on_deadline(clock.now)
    assert [f["destination"] for f in producer.log.named("slow_consumer")] == ["/topic/t"]
    assert skeleton.wants_input and not producer.session.closed
