"""The MQTT session through its own door, sans-IO: packets in as bytes,
packets read back from its outbox, a fake clock driving next_deadline() and
on_deadline(), and a real core Broker with no store."""

from __future__ import annotations

from typing import Any

from core.broker import Broker
from gateway.mqtt import codec
from gateway.mqtt.codec import packets
from gateway.mqtt.inflight import Stage
from gateway.mqtt.session import MqttSession, MqttSettings, Registry
from tests.support.core_fakes import FakeClock


class Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def bind(self, **_: Any) -> Log:
        return self

    def info(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))

    warning = info


class Peer:
    """The client's end of one session: packets in, the outbox read back."""

    def __init__(self, broker: Broker, clock: FakeClock, registry: Registry, **settings: Any) -> None:
        self.log = Log()
        self.session = MqttSession(broker, clock, MqttSettings(**settings), registry, conn_id="m1", log=self.log)
        self.codec = codec.MqttConnection(codec.Role.CLIENT)
        self.pending: list[Any] = []  # read after the CONNACK by connect()

    def send(self, *sent: Any) -> None:
        self.session.skeleton.receive_data(b"".join(self.codec.send(packet) for packet in sent))

    def read(self) -> list[Any]:
        out, self.pending = self.pending, []
        while data := self.session.outbox.drain(1 << 62):
            self.session.skeleton.on_drained()
            self.codec.receive_data(data)
            out.extend(self.codec.events())
        return out

    def connect(self, client_id: str = "c", **fields: Any) -> packets.ConnAck:
        self.send(packets.Connect(client_id, **fields))
        connack, *self.pending = self.read()
        assert isinstance(connack, packets.ConnAck), connack
        return connack

    @property
    def inflight(self) -> dict[int, Stage]:
        return {packet_id: entry.stage for packet_id, entry in self.session.session.outbound.items()}


class World:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.broker = Broker(self.clock)
        self.registry = Registry()

    def peer(self, **settings: Any) -> Peer:
        return Peer(self.broker, self.clock, self.registry, **settings)

    def subscriber(self, topic: str, qos: int, **settings: Any) -> Peer:
        peer = self.peer(**settings)
        peer.connect(f"sub-{topic}-{qos}")
        peer.send(packets.Subscribe(1, [(topic, qos)]))
        assert peer.read() == [packets.SubAck(1, [qos])]
        return peer


# -- CONNECT ---------------------------------------------------------------


def test_connect_is_accepted() -> None:
    peer = World().peer()
    assert peer.connect() == packets.ConnAck(False, packets.ACCEPTED)
    assert not peer.session.closed and peer.session.client is not None


def test_a_packet_before_connect_closes_without_an_answer() -> None:
    peer = World().peer()
    peer.session.skeleton.receive_data(bytes([0xC0, 0x00]))  # PINGREQ
    assert peer.read() == []
    assert peer.session.closed


def test_a_second_connect_closes_the_connection() -> None:
    peer = World().peer()
    peer.connect()
    peer.session.skeleton.receive_data(codec.MqttConnection(codec.Role.CLIENT).send(packets.Connect("c")))
    assert peer.session.closed and peer.read() == []


def test_a_bad_protocol_level_gets_its_connack_code() -> None:
    peer = World().peer()
    peer.send(packets.Connect("c", protocol_level=9))
    [connack] = peer.read()
    assert connack == packets.ConnAck(False, packets.UNACCEPTABLE_PROTOCOL_VERSION)
    assert peer.session.closed


def test_an_empty_client_id_without_clean_session_is_refused() -> None:
    peer = World().peer()
    peer.send(packets.Connect("", clean_session=False))
    assert peer.read() == [packets.ConnAck(False, packets.IDENTIFIER_REJECTED)]
    assert peer.session.closed


def test_eof_says_whether_it_cut_a_packet() -> None:
    world = World()
    sub = world.subscriber("t", 0)
    peer = world.peer()
    peer.connect()
    whole = peer.codec.send(packets.Publish("t", b"last", 0))
    peer.session.skeleton.receive_data(whole + whole[:3])
    peer.session.skeleton.receive_data(b"")
    assert peer.session.close_reason == "peer closed the connection mid-packet"
    assert [p.payload for p in sub.read()] == [b"last"]  # the whole one, not the cut one


# -- PUBLISH from the client -------------------------------------------------


def test_publish_at_each_qos_reaches_a_subscriber_and_is_answered() -> None:
    world = World()
    sub = world.subscriber("a/b", 0)
    pub = world.peer()
    pub.connect("pub")
    pub.send(packets.Publish("a/b", b"q0", 0), packets.Publish("a/b", b"q1", 1, packet_id=1),
             packets.Publish("a/b", b"q2", 2, packet_id=2))
    assert pub.read() == [packets.PubAck(1), packets.PubRec(2)]
    assert [(p.topic, p.payload) for p in sub.read()] == [("a/b", b"q0"), ("a/b", b"q1"), ("a/b", b"q2")]


def test_inbound_qos2_is_routed_once_however_often_it_is_resent() -> None:
    world = World()
    sub = world.subscriber("t", 0)
    pub = world.peer()
    pub.connect("pub")
    publish = packets.Publish("t", b"once", 2, packet_id=7)
    pub.send(publish)
    pub.send(packets.Publish("t", b"once", 2, dup=True, packet_id=7))  # resent before PUBREL
    assert pub.read() == [packets.PubRec(7), packets.PubRec(7)]
    pub.send(packets.PubRel(7))
    pub.send(packets.PubRel(7))  # a duplicate PUBREL is answered again
    assert pub.read() == [packets.PubComp(7), packets.PubComp(7)]
    assert [p.payload for p in sub.read()] == [b"once"]
    pub.send(publish)  # released: the id is free, this is a new message
    assert pub.read() == [packets.PubRec(7)]
    assert [p.payload for p in sub.read()] == [b"once"]


def test_pingreq_is_answered() -> None:
    peer = World().peer()
    peer.connect()
    peer.send(packets.PingReq())
    assert peer.read() == [packets.PingResp()]


# -- deliveries and the in-flight table --------------------------------------


def test_qos1_delivery_is_in_flight_until_puback_and_duplicates_change_nothing() -> None:
    world = World()
    sub = world.subscriber("t", 1)
    pub = world.peer()
    pub.connect("pub")
    pub.send(packets.Publish("t", b"m", 1, packet_id=1))
    [delivery] = sub.read()
    assert delivery.qos == 1 and delivery.packet_id is not None and not delivery.dup
    assert sub.inflight == {delivery.packet_id: Stage.AWAITING_PUBACK}
    sub.send(packets.PubRec(delivery.packet_id), packets.PubComp(delivery.packet_id))  # the wrong QoS's
    assert sub.inflight == {delivery.packet_id: Stage.AWAITING_PUBACK}
    assert sub.read() == [packets.PubRel(delivery.packet_id)]  # a PUBREC is always answered
    sub.send(packets.PubAck(delivery.packet_id))
    assert sub.inflight == {}
    sub.send(packets.PubAck(delivery.packet_id), packets.PubAck(999))  # duplicate, unknown
    assert sub.inflight == {} and not sub.session.closed and sub.read() == []


def test_qos2_delivery_moves_through_the_table_and_ignores_what_is_out_of_order() -> None:
    world = World()
    sub = world.subscriber("t", 2)
    pub = world.peer()
    pub.connect("pub")
    pub.send(packets.Publish("t", b"m", 2, packet_id=1))
    [delivery] = sub.read()
    pid = delivery.packet_id
    assert sub.inflight == {pid: Stage.AWAITING_PUBREC}
    sub.send(packets.PubComp(pid), packets.PubAck(pid))  # out of order, wrong QoS
    assert sub.inflight == {pid: Stage.AWAITING_PUBREC}
    sub.send(packets.PubRec(pid))
    assert sub.inflight == {pid: Stage.AWAITING_PUBCOMP} and sub.read() == [packets.PubRel(pid)]
    sub.send(packets.PubRec(pid))  # duplicate: PUBREL again, the message is acked once
    assert sub.inflight == {pid: Stage.AWAITING_PUBCOMP} and sub.read() == [packets.PubRel(pid)]
    sub.send(packets.PubComp(pid))
    assert sub.inflight == {}
    sub.send(packets.PubComp(pid))
    assert sub.inflight == {} and not sub.session.closed


def test_the_in_flight_window_holds_deliveries_until_acks_free_it() -> None:
    world = World()
    sub = world.subscriber("t", 1, max_inflight=2)
    pub = world.peer()
    pub.connect("pub")
    for n in range(5):
        pub.send(packets.Publish("t", b"%d" % n, 1, packet_id=n + 1))
    first = sub.read()
    assert [p.payload for p in first] == [b"0", b"1"]
    assert not sub.session.accepting and sub.session.skeleton.paused
    sub.send(packets.PubAck(first[0].packet_id))
    [third] = sub.read()
    assert third.payload == b"2"
    sub.send(packets.PubAck(first[1].packet_id), packets.PubAck(third.packet_id))
    assert [p.payload for p in sub.read()] == [b"3", b"4"]


def test_a_persistent_session_resends_unacked_with_dup_and_the_same_id() -> None:
    world = World()
    first = world.peer()
    first.connect("keep", clean_session=False)
    first.send(packets.Subscribe(1, [("t", 1)]))
    first.read()
    pub = world.peer()
    pub.connect("pub")
    pub.send(packets.Publish("t", b"unacked", 1, packet_id=1))
    [delivery] = first.read()
    first.session.skeleton.receive_data(b"")  # gone without an ack
    again = world.peer()
    assert again.connect("keep", clean_session=False) == packets.ConnAck(True, packets.ACCEPTED)
    [resent] = again.read()
    assert (resent.payload, resent.dup, resent.packet_id) == (b"unacked", True, delivery.packet_id)


def test_a_pubrel_awaiting_pubcomp_is_resent_on_resume() -> None:
    world = World()
    first = world.peer()
    first.connect("keep", clean_session=False)
    first.send(packets.Subscribe(1, [("t", 2)]))
    first.read()
    pub = world.peer()
    pub.connect("pub")
    pub.send(packets.Publish("t", b"m", 2, packet_id=1))
    [delivery] = first.read()
    first.send(packets.PubRec(delivery.packet_id))
    assert first.read() == [packets.PubRel(delivery.packet_id)]
    first.session.skeleton.receive_data(b"")
    again = world.peer()
    again.connect("keep", clean_session=False)
    assert again.read() == [packets.PubRel(delivery.packet_id)]
    assert again.inflight == {delivery.packet_id: Stage.AWAITING_PUBCOMP}


# -- deadlines ---------------------------------------------------------------


def test_no_connect_within_the_connect_timeout_closes() -> None:
    world = World()
    peer = world.peer(connect_timeout_s=3.0)
    assert peer.session.skeleton.next_deadline() == world.clock.now + 3.0
    world.clock.advance(3.0)
    peer.session.skeleton.on_deadline(world.clock.now)
    assert peer.session.closed and peer.session.close_reason == "no CONNECT within the connect timeout"


def test_a_connect_waiting_for_its_password_check_outlives_the_connect_timeout() -> None:
    from gateway.auth import AuthSettings, Gatekeeper, Transport, hash_password, verify_password

    world = World()
    peer = world.peer(connect_timeout_s=3.0)
    users = [{"name": "app", "password_hash": hash_password("pw", iterations=1000)}]
    keeper = Gatekeeper(AuthSettings(users=users))
    checks: list[Any] = []
    keeper.verifiers["messaging"] = lambda passcode, stored, done: checks.append((passcode, stored, done)) or True
    peer.session.admit = lambda login, passcode: keeper.admit(login, passcode, Transport(host="h"))
    peer.send(packets.Connect("c", username="app", password=b"pw"))
    assert len(checks) == 1 and peer.read() == []
    world.clock.advance(60.0)  # the check waits its turn, long past the connect timeout
    peer.session.skeleton.on_deadline(world.clock.now)
    assert not peer.session.closed
    passcode, stored, done = checks.pop()
    done(verify_password(passcode, stored))
    peer.session.skeleton.resume_input()
    [connack] = peer.read()
    assert isinstance(connack, packets.ConnAck) and connack.return_code == 0 and not peer.session.closed


def test_keep_alive_times_grace_then_the_client_is_dropped() -> None:
    world = World()
    peer = world.peer(keepalive_grace=1.5)
    peer.connect(keep_alive=10)
    skeleton = peer.session.skeleton
    assert skeleton.next_deadline() == world.clock.now + 15.0
    world.clock.advance(10.0)
    peer.send(packets.PingReq())  # heard: the 15 s start again
    assert peer.read() == [packets.PingResp()]
    world.clock.advance(14.0)
    skeleton.on_deadline(world.clock.now)
    assert not peer.session.closed
    world.clock.advance(1.0)
    skeleton.on_deadline(world.clock.now)
    assert peer.session.closed
    assert peer.session.close_reason == "keep-alive timeout: nothing received from the client in time"


def test_keep_alive_zero_means_no_deadline() -> None:
    peer = World().peer()
    peer.connect(keep_alive=0)
    assert peer.session.skeleton.next_deadline() is None
