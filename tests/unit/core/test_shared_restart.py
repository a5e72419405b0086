"""A durable shared subscription group through a restart on the real store:
the group, its persistent messages and its memberships come back; a group
whose last membership went does not."""

from __future__ import annotations

from pathlib import Path

from core import recovery
from core.broker import Broker, BrokerSettings
from core.shared import group_key
from core.subscriptions import AckMode
from persistence.store import Store
from tests.support.core_fakes import FakeClock, RecordingSink, address

T = address("/topic/jobs.>")
JOB = address("/topic/jobs.render")
INDIVIDUAL = AckMode.CLIENT_INDIVIDUAL


def start(path: Path) -> tuple[Broker, Store]:
    store = Store(path, sync="never")
    recovered = store.open()
    broker = Broker(FakeClock(), BrokerSettings(), node="t", store=store)
    assert recovery.restore(broker, recovered) == 0
    return broker, store


def publish(broker: Broker, bodies: list[bytes], persistent: bool = True) -> None:
    producer = broker.open_client(RecordingSink())
    for body in bodies:
        producer.send(broker.message(JOB, {}, body, persistent=persistent))
    producer.close()


def test_a_durable_group_and_its_persistent_messages_survive_a_restart(tmp_path: Path) -> None:
    broker, store = start(tmp_path)
    first = broker.open_client(RecordingSink(), client_id="c1")
    first.subscribe("m", T, INDIVIDUAL, 1, shared="g", durable=("c1", "jobs"))
    second_sink = RecordingSink()
    second = broker.open_client(second_sink, client_id="c2")
    second.subscribe("m", T, INDIVIDUAL, 1, shared="g", durable=("c2", "jobs"))
    publish(broker, [b"0"])
    delivered = [*first.subscriptions["m"].unacked, *second.subscriptions["m"].unacked]
    assert len(delivered) == 1  # to one member, unacked when both left
    first.close()
    second.close()
    publish(broker, [b"1", b"2"])
    publish(broker, [b"lost"], persistent=False)  # non-persistent: gone with the process
    store.close()

    broker, store = start(tmp_path)
    group = broker.shared[group_key("g", T)]
    assert group.durable and sorted(group.held) == sorted(m.key for m in broker.shared.memberships.values())
    assert [m.client_id for m in broker.shared.of_client("c1")] == ["c1"]
    assert group.queue.depth == 3  # stubs: their bodies wait on disk
    sink = RecordingSink()
    back = broker.open_client(sink, client_id="c1")
    back.subscribe("m", T, AckMode.AUTO, shared="g", durable=("c1", "jobs"))
    assert sorted(m.body for m in sink.messages) == [b"0", b"1", b"2"]
    assert delivered[0] in sink.ids
    back.unsubscribe("m", remove_durable=True)
    assert group_key("g", T) in broker.shared  # c2's membership keeps it
    publish(broker, [b"3"])
    store.close()

    broker, store = start(tmp_path)
    assert [m.client_id for m in broker.shared.memberships.values()] == ["c2"]
    dropper = broker.open_client(RecordingSink(), client_id="c2")
    dropper.drop_shared("c2", "jobs")
    assert broker.shared == {}
    store.close()

    broker, store = start(tmp_path)
    assert broker.shared == {} and broker.shared.memberships == {} and broker.all_queues() == []
    store.close()


def test_a_stored_group_left_without_memberships_goes_at_recovery(tmp_path: Path) -> None:
    broker, store = start(tmp_path)
    persistent = broker.open_client(RecordingSink(), client_id="c1")
    persistent.subscribe("m", T, INDIVIDUAL, shared="g", durable=("c1", "n"))
    clean = broker.open_client(RecordingSink(), client_id="c2")
    clean.subscribe("m", T, INDIVIDUAL, shared="g")
    persistent.unsubscribe("m", remove_durable=True)  # the clean member keeps the group, stored, for now
    publish(broker, [b"x"])
    store.close()  # a crash-like stop: the clean member never left

    broker, store = start(tmp_path)
    assert broker.shared == {} and broker.all_queues() == []
    store.close()


def test_a_reservation_comes_back_after_a_restart_and_one_handed_back_and_acked_does_not(tmp_path: Path) -> None:
    broker, store = start(tmp_path)
    away = broker.open_client(RecordingSink(), client_id="c1")
    away.subscribe("m", T, INDIVIDUAL, 10, shared="g", durable=("c1", "jobs"))
    publish(broker, [b"mine", b"anyone's", b"acked"])
    unacked = away.subscriptions["m"].unacked
    mine, _, acked = list(unacked)
    away.close(reserve={mine, acked})
    # "acked" is reserved, handed back and finished before the restart: nothing brings it back.
    back = broker.open_client(RecordingSink(), client_id="c1")
    back.subscribe("m", T, INDIVIDUAL, 10, shared="g", durable=("c1", "jobs"))
    back.ack("m", acked)
    back.close(reserve={mine})
    store.close()

    broker, store = start(tmp_path)
    other_sink = RecordingSink()
    other = broker.open_client(other_sink, client_id="c2")
    other.subscribe("m", T, AckMode.AUTO, shared="g")
    assert [m.body for m in other_sink.messages] == [b"anyone's"]
    other.close()
    sink = RecordingSink()
    again = broker.open_client(sink, client_id="c1")
    again.subscribe("m", T, INDIVIDUAL, 10, shared="g", durable=("c1", "jobs"))
    assert [m.body for m in sink.messages] == [b"mine"] and sink.messages[0].redelivered
    again.ack("m", mine)
    again.close()
    store.close()

    broker, store = start(tmp_path)
    assert broker.shared[group_key("g", T)].queue.depth == 0
    assert not broker.shared.memberships[next(iter(broker.shared.memberships))].reserved
    store.close()
