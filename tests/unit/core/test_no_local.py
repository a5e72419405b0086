"""No Local: a subscription never gets what its own client published
(MQTT 5 [MQTT-3.8.3-3], JMS noLocal); everyone else still does."""

from __future__ import annotations

import pytest

from core.broker import Broker, BrokerSettings
from core.errors import InvalidDestination, InvalidRequest
from core.selectors import compile_selector
from core.subscriptions import AckMode
from tests.support.core_fakes import FakeClock, RecordingSink, RecordingStore, address

T = address("/topic/sensors.kitchen")
AUTO = AckMode.AUTO
INDIVIDUAL = AckMode.CLIENT_INDIVIDUAL


def make() -> tuple[Broker, RecordingStore]:
    store = RecordingStore()
    return Broker(FakeClock(), BrokerSettings(), node="t", store=store), store  # type: ignore[arg-type]


def publish(broker: Broker, client: object, where=T, body: bytes = b"x", persistent: bool = False):
    message = broker.message(where, {}, body, persistent=persistent)
    client.send(message)  # type: ignore[attr-defined]
    return message


@pytest.mark.parametrize("pattern", ["/topic/sensors.kitchen", "/topic/sensors.*", "/topic/sensors.>", "/topic/>"])
def test_a_no_local_subscriber_does_not_get_its_own_messages_but_others_do(pattern: str) -> None:
    broker, _ = make()
    me_sink, other_sink = RecordingSink(), RecordingSink()
    me = broker.open_client(me_sink, client_id="me")
    other = broker.open_client(other_sink, client_id="other")
    me.subscribe("s", address(pattern), INDIVIDUAL, no_local=True)
    other.subscribe("s", address(pattern), AUTO, no_local=True)
    me.subscribe("plain", address("/topic/sensors.>"), AUTO)  # the same client, without No Local
    mine = publish(broker, me, body=b"mine")
    theirs = publish(broker, other, body=b"theirs")
    assert sorted((t, m.body) for t, m in me_sink.deliveries) == [("plain", b"mine"), ("plain", b"theirs"), ("s", b"theirs")]
    assert other_sink.messages == [mine]
    me_queue = me.subscription("s").queue
    assert me_queue.stats.enqueued == 1 and me.subscription("s").unacked.keys() == {theirs.id}  # nothing to ack of its own


def test_no_local_compares_client_ids_so_another_connection_of_the_same_client_is_local() -> None:
    broker, _ = make()
    sink = RecordingSink()
    subscriber = broker.open_client(sink, client_id="device-1")
    subscriber.subscribe("s", T, AUTO, no_local=True)
    same_id = broker.open_client(RecordingSink(), client_id="device-1")  # a takeover in progress, say
    anonymous = broker.open_client(RecordingSink())
    publish(broker, same_id, body=b"same id")
    kept = publish(broker, anonymous, body=b"no id")
    assert sink.messages == [kept]


def test_without_a_client_id_no_local_means_this_connection() -> None:
    broker, _ = make()
    sink = RecordingSink()
    first = broker.open_client(sink)
    second = broker.open_client(RecordingSink())
    first.subscribe("s", T, AUTO, no_local=True)
    publish(broker, first)
    theirs = publish(broker, second)
    assert sink.messages == [theirs]


def test_a_selector_still_applies_on_a_no_local_subscription() -> None:
    broker, _ = make()
    sink = RecordingSink()
    me = broker.open_client(sink, client_id="me")
    other = broker.open_client(RecordingSink(), client_id="other")
    me.subscribe("s", T, AUTO, selector=compile_selector("kind = 'hot'"), no_local=True)
    for who in (me, other):
        for kind in ("hot", "cold"):
            message = broker.message(T, {"kind": kind}, kind.encode())
            who.send(message)
    assert [m.body for m in sink.messages] == [b"hot"]
    assert [m.headers["kind"] for m in sink.messages] == ["hot"]


def test_a_durable_no_local_subscription_leaves_out_its_client_ids_messages_while_away_too() -> None:
    broker, store = make()
    sink = RecordingSink()
    first = broker.open_client(sink, client_id="app")
    first.subscribe("d", T, INDIVIDUAL, durable=("app", "n"), no_local=True)
    publish(broker, first, body=b"own, connected", persistent=True)
    first.close()
    later = broker.open_client(RecordingSink(), client_id="app")  # the same client id, reconnected, publishing
    publish(broker, later, body=b"own, away", persistent=True)
    later.close()
    other = broker.open_client(RecordingSink(), client_id="other")
    theirs = publish(broker, other, body=b"theirs", persistent=True)
    back_sink = RecordingSink()
    back = broker.open_client(back_sink, client_id="app")
    back.subscribe("d", T, INDIVIDUAL, durable=("app", "n"), no_local=True)
    assert back_sink.ids == [theirs.id]
    stored = [c for c in store.calls if c[0] == "add"]
    assert stored == [("add", theirs.id, ("durable:3:app:n",))]  # its own were never stored for it


def test_resuming_a_durable_subscription_without_no_local_gets_its_own_again() -> None:
    broker, _ = make()
    sink = RecordingSink()
    client = broker.open_client(sink, client_id="app")
    client.subscribe("d", T, AUTO, durable=("app", "n"), no_local=True)
    publish(broker, client, body=b"left out")
    client.unsubscribe("d")
    client.subscribe("d", T, AUTO, durable=("app", "n"))
    kept = publish(broker, client, body=b"kept")
    assert sink.messages == [kept]


def test_a_message_from_the_store_has_no_origin_and_is_delivered() -> None:
    broker, _ = make()
    producer = broker.open_client(RecordingSink(), client_id="app")
    message = publish(broker, producer)
    assert message.origin is producer.origin and message.origin.client_id == "app"
    assert message.redelivery().origin is producer.origin and message.stub().origin is producer.origin
    recovered = message.redelivery()
    recovered.origin = None  # what core.recovery builds: the store keeps no origin
    sink = RecordingSink()
    subscriber = broker.open_client(sink, client_id="app")
    subscription = subscriber.subscribe("s", T, AUTO, no_local=True)
    assert subscription.queue.selector.matches(recovered)
    assert not subscription.queue.selector.matches(message)


def test_no_local_leaves_out_its_own_retained_value_and_not_others() -> None:
    broker, _ = make()
    me = broker.open_client(RecordingSink(), client_id="me")
    other = broker.open_client(RecordingSink(), client_id="other")
    me.send(broker.message(address("/topic/a.mine"), {}, b"mine"), retain=True)
    other.send(broker.message(address("/topic/a.theirs"), {}, b"theirs"), retain=True)
    sink = RecordingSink()
    subscriber = broker.open_client(sink, client_id="me")
    subscription = subscriber.subscribe("s", address("/topic/a.*"), AUTO, no_local=True, start=False)
    subscriber.start(subscription, retained=True)
    assert [m.body for m in sink.messages] == [b"theirs"]


def test_no_local_is_for_topics_and_not_for_shared_subscriptions() -> None:
    broker, _ = make()
    client = broker.open_client(RecordingSink(), client_id="c")
    with pytest.raises(InvalidDestination):
        client.subscribe("q", address("/queue/work"), AUTO, no_local=True)
    with pytest.raises(InvalidRequest):
        client.subscribe("s", T, AUTO, no_local=True, shared="g")  # [MQTT-3.8.3-4]
    assert client.subscriptions == {}


def test_a_closed_publishers_messages_do_not_keep_its_connection() -> None:
    broker, _ = make()
    sink = RecordingSink()
    publisher = broker.open_client(sink, client_id="p")
    message = publish(broker, publisher)
    publisher.close()
    assert message.origin is publisher.origin and not hasattr(message.origin, "sink")
