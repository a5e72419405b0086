"""Per-destination policies: matching by pattern, the specific over the general."""

from __future__ import annotations

import pytest

from core.broker import Broker, BrokerSettings
from core.subscriptions import AckMode
from gateway import config
from tests.support.core_fakes import FakeClock, RecordingSink, address

POLICIES = [
    {"destination": "/queue/>", "max_redeliveries": 5, "default_prefetch": 50},
    {"destination": "/queue/orders.>", "max_redeliveries": 2, "dead_letter_per_destination": True},
    {"destination": "/queue/orders.urgent", "max_redeliveries": 0},
    {"destination": "/topic/prices.*", "topic_high_water": 7},
]


def make() -> Broker:
    return Broker(FakeClock(), BrokerSettings(max_redeliveries=6, policies=POLICIES), node="t")


@pytest.mark.parametrize(
    ("destination", "redeliveries", "prefetch"),
    [("/queue/other", 5, 50), ("/queue/orders.eu", 2, 50), ("/queue/orders.urgent", 0, 50), ("/topic/x", 6, 1000)],
)
def test_the_most_specific_matching_entry_wins_field_by_field(destination: str, redeliveries: int, prefetch: int) -> None:
    policy = make().policies.for_address(address(destination))
    assert (policy.max_redeliveries, policy.default_prefetch) == (redeliveries, prefetch)


def test_policies_shape_queues_subscriptions_and_dead_letters() -> None:
    broker = make()
    client = broker.open_client(RecordingSink())
    subscription = client.subscribe("s", address("/queue/orders.eu"), AckMode.CLIENT_INDIVIDUAL)
    assert subscription.prefetch == 50
    assert broker.queues[address("/queue/orders.eu")].max_redeliveries == 2
    topic = client.subscribe("t", address("/topic/prices.eu"), AckMode.AUTO)
    assert topic.queue.high_water == 7
    producer = broker.open_client(RecordingSink())
    message = broker.message(address("/queue/orders.eu"), {}, b"poison")
    producer.send(message)
    for _ in range(3):
        client.nack("s", next(iter(subscription.unacked)))
    assert [m.body for m in broker.queues[address("/queue/DLQ.orders.eu")].pending] == [b"poison"]


@pytest.mark.parametrize(
    ("entry", "complaint"),
    [
        ({"max_redeliveries": 1}, "destination"),
        ({"destination": "/nowhere/x"}, "destination"),
        ({"destination": "/queue/a", "max_destinations": 5}, "not a per-destination setting"),
        ({"destination": "/queue/a", "max_redeliveries": "three"}, "expected int"),
    ],
)
def test_a_bad_policy_entry_is_refused_at_start_up_by_name(tmp_path, entry, complaint) -> None:
    lines = ["[[broker.policies]]"] + [f"{k} = {v!r}".replace("'", '"') for k, v in entry.items()]
    path = tmp_path / "gateway.toml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(config.ConfigError, match=complaint):
        config.load(str(path))


def test_policies_load_from_the_config_file(tmp_path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text('[[broker.policies]]\ndestination = "/queue/orders.>"\nsend_fail_if_no_space = true\n')
    loaded = config.load(str(path))
    broker = Broker(FakeClock(), loaded.broker, node="t")
    assert broker.policies.for_address(address("/queue/orders.x")).send_fail_if_no_space
    assert not broker.policies.for_address(address("/queue/other")).send_fail_if_no_space
