"""Crash tests for queues: the real broker process is killed with SIGKILL
at random moments while producers and consumers are busy, restarted on the
same data folder, and every receipted, un-acked message comes back, once per
session and in producer order; also while segments roll and are compacted.

Black-box: raw STOMP 1.2 sockets against ``gateway serve --stomp-port P
--data-dir D`` on a free loopback port; the promises checked and
``DURABILITY_SEED`` are described in tests/support/durability_helpers.py.  Every loop
and wait is bounded.  ``-s`` shows each test's ledger summary.
"""

from __future__ import annotations

import random
import threading
import time

from tests.support.durability_helpers import Ledger, Producer, consume, join_all, seeded, wait_delivered
from tests.support.helpers import unique
from tests.support.processes import BrokerProcess


QUEUE_ROUNDS = 24


def test_receipted_queue_messages_survive_sigkill_at_random_moments(broker_process):
    queue_crash_rounds(broker_process(), seeded("queue crash"), QUEUE_ROUNDS)


SMALL_SEGMENTS = """
[store]
segment_bytes = 65536
maintenance_interval_s = 0.05
"""


def test_queue_crashes_while_segments_roll_and_are_compacted(broker_process, tmp_path):
    """The same with tiny segments and maintenance (checkpoints, deleting and
    compacting segments) running all the time, so kills land in the middle of it."""
    config = tmp_path / "gateway.toml"
    config.write_text(SMALL_SEGMENTS)
    queue_crash_rounds(broker_process("--config", str(config)), seeded("queue crash, small segments"), 12)


def queue_crash_rounds(broker: BrokerProcess, rng: random.Random, rounds_wanted: int) -> None:
    """Bounded by its count of rounds and each round's own deadlines, never by
    a budget for all of them: a slow machine runs the same rounds, slower."""
    ledger = Ledger()
    queue = f"/queue/{unique('crash')}"
    producers = [f"p{i}" for i in range(4)]
    seqs = dict.fromkeys(producers, 0)
    started = time.monotonic()
    in_flight_at_kill = []
    rounds = 0
    while rounds < rounds_wanted:
        rounds += 1
        required = ledger.required()
        broker.start()
        ledger.new_session()
        deadline = time.monotonic() + 30
        consumer = consume(broker.port, queue, ledger, random.Random(rng.random()), deadline)
        # Some kills land while the backlog is being redelivered and acked; the
        # others only after everything owed has come back (checked here).
        early = rng.random() < 0.2
        if not early:
            wait_delivered(ledger, required, broker, 20.0, f"round {rounds}")
            ledger.check()
        stop = threading.Event()
        threads = [Producer(name, broker.port, queue, ledger, seqs, rng.choice((1, 8, 32)), stop, deadline)
                   for name in producers]
        for thread in threads:
            thread.start()
        time.sleep(rng.uniform(0.0, 0.3) if early else rng.uniform(0.05, 0.8))
        broker.kill()
        join_all([*threads, consumer])
        in_flight_at_kill.append(sum(len(t.in_flight) for t in threads))
        ledger.check()

    # One last restart, without a kill: everything owed is there, then a clean stop.
    required = ledger.required()
    broker.start()
    ledger.new_session()
    consumer = consume(broker.port, queue, ledger, rng, time.monotonic() + 30, ack_p=0.0)
    wait_delivered(ledger, required, broker, 20.0, "final restart")
    consumer.stop.set()
    join_all([consumer])
    consumer.peer.disconnect()
    assert broker.terminate() == 0
    ledger.check()
    print(f"{rounds} kills in {time.monotonic() - started:.1f} s; {ledger.summary()}; "
          f"SENDs in flight at each kill: {in_flight_at_kill}")
    # The kills were mid-load, and the test did something.
    assert sum(1 for n in in_flight_at_kill if n) >= rounds // 2, f"kills not mid-load: {in_flight_at_kill}"
    assert len(ledger.receipted) >= 20 * rounds, (
        f"only {len(ledger.receipted)} of {len(ledger.sent)} SENDs receipted in {rounds} rounds: do receipts stall?")
    assert ledger.acked and ledger.required(), f"nothing acked or nothing left owed: {ledger.summary()}"
