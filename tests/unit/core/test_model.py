"""A Hypothesis state machine over one queue and a few consumers.

The model tracks where every message is (pending in the queue, unacked at one
consumer, held by an open transaction's ACK/NACK, acked, or an uncommitted or
aborted transactional send) and checks each delivery against it, so:

* a message is delivered only while it is pending, hence an acked message is
  never delivered again and no message is at two consumers at once;
* every committed message is acked, pending, unacked at exactly one consumer,
  or held by exactly one open transaction (nothing lost, nothing duplicated);
* first deliveries keep FIFO order within a priority, and a delivery is marked
  redelivered exactly when the message was delivered before;
* no consumer holds more unacked messages than its prefetch;
* the queue never keeps a message back while some consumer has room.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from core.broker import Broker, BrokerSettings, Client
from core.messages import Message
from core.subscriptions import AckMode
from tests.support.core_fakes import FakeClock, RecordingSink, address

Q = address("/queue/model")
N_CONSUMERS = 3
TX = "tx"

PENDING, ACKED, ABORTED = "pending", "acked", "aborted"

# Rules pick among the consumers they apply to, so no step is wasted.
PICK = st.integers(0, N_CONSUMERS - 1)


def choose(pick: int, candidates: list[Consumer]) -> Consumer:
    assert candidates
    return candidates[pick % len(candidates)]


@dataclass
class Consumer:
    index: int
    client: Client
    sink: RecordingSink
    token: Any = None  # the live subscription's token, None when unsubscribed
    generation: int = 0
    mode: AckMode = AckMode.AUTO
    prefetch: int = 1
    unacked: list[str] = field(default_factory=list)  # delivery order
    tx: dict[str, list[str]] | None = None  # {"sends", "acks", "nacks"}


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[RecordingSink, Any, Message]] = []
        # The model tracks every message within one queue; dead-lettering (a
        # policy proven in tests/e2e/test_acks.py) would move one out of its sight.
        self.broker = Broker(FakeClock(), BrokerSettings(max_redeliveries=10**9), node="model")
        self.producer = self.broker.open_client(RecordingSink())
        self.consumers = []
        for i in range(N_CONSUMERS):
            sink = RecordingSink(log=self.log)
            self.consumers.append(Consumer(i, self.broker.open_client(sink), sink))
        self.by_sink = {id(c.sink): c for c in self.consumers}
        # Where each message is: PENDING, ACKED, ABORTED, ("unacked", i),
        # ("held", i) by consumer i's open transaction, ("txsend", i).
        self.location: dict[str, Any] = {}
        self.priority: dict[str, int] = {}
        self.committed_order: list[str] = []
        self.delivered: set[str] = set()

    # -- helpers -----------------------------------------------------------

    def new_message(self, priority: int) -> Message:
        message = self.broker.message(Q, {}, b"", priority=priority)
        self.priority[message.id] = priority
        return message

    def commit_to_queue(self, ids: list[str]) -> None:
        for mid in ids:
            assert self.location[mid] != PENDING
            self.location[mid] = PENDING
        self.committed_order.extend(ids)

    def settle_deliveries(self) -> None:
        """Check every delivery the last operation made against the model."""
        log, self.log[:] = list(self.log), []
        for sink, token, message in log:
            consumer = self.by_sink[id(sink)]
            mid = message.id
            assert token is not None and token == consumer.token, "delivery to a dead subscription"
            assert self.location.get(mid) == PENDING, f"{mid} delivered while {self.location.get(mid)}"
            assert message.redelivered == (mid in self.delivered)
            if mid not in self.delivered:
                # FIFO within a priority for first deliveries.
                before = self.committed_order[: self.committed_order.index(mid)]
                late = [m for m in before if self.priority[m] == message.priority and m not in self.delivered]
                assert not late, f"{mid} delivered before earlier {late}"
                self.delivered.add(mid)
            if consumer.mode is AckMode.AUTO:
                self.location[mid] = ACKED
            else:
                self.location[mid] = ("unacked", consumer.index)
                consumer.unacked.append(mid)

    def subscribed(self) -> list[Consumer]:
        return [c for c in self.consumers if c.token is not None]

    # -- rules -------------------------------------------------------------

    @initialize(
        modes=st.lists(st.sampled_from(AckMode), min_size=N_CONSUMERS, max_size=N_CONSUMERS),
        prefetches=st.lists(st.integers(1, 3), min_size=N_CONSUMERS, max_size=N_CONSUMERS),
    )
    def subscribe_everyone(self, modes: list[AckMode], prefetches: list[int]) -> None:
        for consumer, mode, prefetch in zip(self.consumers, modes, prefetches):
            self._subscribe(consumer, mode, prefetch)

    @rule(priority=st.sampled_from([0, 4, 4, 9]))
    def send(self, priority: int) -> None:
        message = self.new_message(priority)
        self.location[message.id] = ("txsend", -1)
        self.commit_to_queue([message.id])
        self.producer.send(message)
        self.settle_deliveries()

    @precondition(lambda self: len(self.subscribed()) < N_CONSUMERS)
    @rule(pick=PICK, mode=st.sampled_from(AckMode), prefetch=st.integers(1, 3))
    def subscribe(self, pick: int, mode: AckMode, prefetch: int) -> None:
        self._subscribe(choose(pick, [c for c in self.consumers if c.token is None]), mode, prefetch)

    def _subscribe(self, consumer: Consumer, mode: AckMode, prefetch: int) -> None:
        consumer.generation += 1
        consumer.token = f"s{consumer.index}.{consumer.generation}"
        consumer.mode, consumer.prefetch = mode, prefetch
        consumer.client.subscribe(consumer.token, Q, mode, prefetch)
        self.settle_deliveries()

    @precondition(lambda self: self.subscribed())
    @rule(pick=PICK)
    def unsubscribe(self, pick: int) -> None:
        consumer = choose(pick, self.subscribed())
        token, consumer.token = consumer.token, None
        for mid in consumer.unacked:
            self.location[mid] = PENDING
        consumer.unacked = []
        consumer.client.unsubscribe(token)
        self.settle_deliveries()

    def holders(self) -> list[Consumer]:
        return [c for c in self.consumers if c.unacked]

    def holders_in_transaction(self) -> list[Consumer]:
        return [c for c in self.consumers if c.unacked and c.tx is not None]

    def _settle(self, consumer: Consumer, k: int, in_tx: bool, verb: str) -> None:
        i = consumer.index
        k %= len(consumer.unacked)
        mid = consumer.unacked[k]
        if consumer.mode is AckMode.CLIENT:
            taken, consumer.unacked = consumer.unacked[: k + 1], consumer.unacked[k + 1 :]
        else:
            taken = [consumer.unacked.pop(k)]
        for m in taken:
            if in_tx:
                self.location[m] = ("held", i)
            else:
                self.location[m] = ACKED if verb == "ack" else PENDING
        if in_tx:
            assert consumer.tx is not None
            consumer.tx[verb + "s"].extend(taken)
        getattr(consumer.client, verb)(consumer.token, mid, TX if in_tx else None)
        self.settle_deliveries()

    @precondition(lambda self: self.holders())
    @rule(pick=PICK, k=st.integers(0, 10))
    def ack(self, pick: int, k: int) -> None:
        self._settle(choose(pick, self.holders()), k, False, "ack")

    @precondition(lambda self: self.holders())
    @rule(pick=PICK, k=st.integers(0, 10))
    def nack(self, pick: int, k: int) -> None:
        self._settle(choose(pick, self.holders()), k, False, "nack")

    @precondition(lambda self: self.holders_in_transaction())
    @rule(pick=PICK, k=st.integers(0, 10), verb=st.sampled_from(["ack", "ack", "nack"]))
    def settle_in_transaction(self, pick: int, k: int, verb: str) -> None:
        self._settle(choose(pick, self.holders_in_transaction()), k, True, verb)

    def in_transaction(self) -> list[Consumer]:
        return [c for c in self.consumers if c.tx is not None]

    @precondition(lambda self: len(self.in_transaction()) < N_CONSUMERS)
    @rule(pick=PICK)
    def begin(self, pick: int) -> None:
        consumer = choose(pick, [c for c in self.consumers if c.tx is None])
        consumer.tx = {"sends": [], "acks": [], "nacks": []}
        consumer.client.begin(TX)

    @precondition(lambda self: self.in_transaction())
    @rule(pick=PICK, priority=st.sampled_from([0, 4, 9]))
    def send_in_transaction(self, pick: int, priority: int) -> None:
        consumer = choose(pick, self.in_transaction())
        assert consumer.tx is not None
        message = self.new_message(priority)
        self.location[message.id] = ("txsend", consumer.index)
        consumer.tx["sends"].append(message.id)
        consumer.client.send(message, TX)
        assert self.log == []  # invisible until commit

    @precondition(lambda self: self.in_transaction())
    @rule(pick=PICK, commit=st.booleans())
    def end_transaction(self, pick: int, commit: bool) -> None:
        consumer = choose(pick, self.in_transaction())
        if commit:
            self.commit(consumer)
        else:
            self.abort(consumer)

    def commit(self, consumer: Consumer) -> None:
        assert consumer.tx is not None
        tx, consumer.tx = consumer.tx, None
        self.commit_to_queue(tx["sends"])
        for mid in tx["acks"]:
            self.location[mid] = ACKED
        for mid in tx["nacks"]:
            self.location[mid] = PENDING
        consumer.client.commit(TX)
        self.settle_deliveries()

    def abort(self, consumer: Consumer) -> None:
        assert consumer.tx is not None
        tx, consumer.tx = consumer.tx, None
        for mid in tx["sends"]:
            self.location[mid] = ABORTED
        for mid in tx["acks"] + tx["nacks"]:
            self.location[mid] = PENDING
        consumer.client.abort(TX)
        self.settle_deliveries()

    @rule(pick=PICK)
    def toggle_accepting(self, pick: int) -> None:
        consumer = choose(pick, self.consumers)
        consumer.sink.accepting = not consumer.sink.accepting
        if consumer.sink.accepting:
            consumer.client.resume()
        self.settle_deliveries()

    # -- invariants --------------------------------------------------------

    @invariant()
    def every_message_is_in_exactly_one_place(self) -> None:
        queue = self.broker.queue(Q)
        pending = [m.id for m in queue.pending] if queue is not None else []
        places: Counter[str] = Counter(pending)
        for consumer in self.consumers:
            if consumer.token is not None:
                unacked = list(consumer.client.subscription(consumer.token).unacked)
                assert unacked == consumer.unacked
                places.update(unacked)
            else:
                assert consumer.unacked == []
            tx = consumer.client.transactions.get(TX)
            assert (tx is None) == (consumer.tx is None)
            if tx is not None and consumer.tx is not None:
                held = [m.id for _, messages in tx.settled_back() for m in messages]
                assert sorted(held) == sorted(consumer.tx["acks"] + consumer.tx["nacks"])
                assert [m.id for _, m in tx.sends] == consumer.tx["sends"]
                places.update(held)
        duplicated = [mid for mid, n in places.items() if n > 1]
        assert not duplicated, f"in two places at once: {duplicated}"
        acked = {mid for mid in self.committed_order if self.location[mid] == ACKED}
        assert set(places) | acked == set(self.committed_order), "lost"
        assert not (set(places) & acked), "acked yet still held"
        assert set(pending) == {mid for mid, where in self.location.items() if where == PENDING}
        if queue is not None:
            assert queue.stats.dequeued == len(acked)

    @invariant()
    def prefetch_is_respected(self) -> None:
        for consumer in self.subscribed():
            subscription = consumer.client.subscription(consumer.token)
            if consumer.mode is not AckMode.AUTO:
                assert len(subscription.unacked) <= consumer.prefetch

    @invariant()
    def nothing_waits_while_a_consumer_has_room(self) -> None:
        queue = self.broker.queue(Q)
        if queue is not None and queue.depth:
            for consumer in self.subscribed():
                assert not consumer.client.subscription(consumer.token).has_room, consumer.token


QueueMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
test_queue_model = QueueMachine.TestCase
