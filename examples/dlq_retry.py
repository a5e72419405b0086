"""Move the messages of a dead-letter queue back to the destinations they
came from, with stomp.py: ActiveMQ's "retry" for a DLQ, through the door any
client uses.

Each message is moved in one STOMP transaction, its SEND to the destination
its ``originalDestination`` header names and its ACK from the DLQ together,
so a message is never lost and never doubled by a crash half-way; the COMMIT
carries a receipt, so the move is on disk (on a store with sync = "always")
before the next one starts.  The broker's dead-letter headers are dropped,
the message's own headers (content-type, priority, persistent, yours) kept.

    python examples/dlq_retry.py --login ops --passcode secret
    python examples/dlq_retry.py --only /queue/orders     # just what came from there
    python examples/dlq_retry.py --dlq /queue/DLQ.orders --max 100

It stops when the DLQ has had nothing for it for ``--idle`` seconds (or after
``--max`` messages) and prints how many it moved.  The user needs read on the
DLQ and write on the destinations ([[auth.acl]]).
"""

from __future__ import annotations

import argparse
import itertools
import queue
import sys
import threading
from typing import Any

import stomp

# Headers the broker sets on a delivery or a dead letter: not the message's own.
DROPPED = {"message-id", "destination", "subscription", "ack", "redelivered", "content-length",
           "originalDestination", "originalMessageId", "dlqDeliveryFailureCause"}
RECEIPT_TIMEOUT_S = 10.0


class Mover(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.messages: queue.Queue[Any] = queue.Queue(maxsize=1000)  # bounded by the subscription's prefetch
        self.receipts: dict[str, threading.Event] = {}
        self.errors: list[str] = []

    def on_message(self, frame: Any) -> None:
        self.messages.put(frame)

    def on_receipt(self, frame: Any) -> None:
        event = self.receipts.get(frame.headers["receipt-id"])
        if event is not None:
            event.set()

    def on_error(self, frame: Any) -> None:
        self.errors.append(frame.headers.get("message", "ERROR"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=61613)
    parser.add_argument("--login")
    parser.add_argument("--passcode")
    parser.add_argument("--dlq", default="/queue/DLQ", help="the dead-letter queue (default /queue/DLQ)")
    parser.add_argument("--only", metavar="DESTINATION", help="move only what came from this destination")
    parser.add_argument("--max", type=int, default=0, help="stop after this many (default: all)")
    parser.add_argument("--idle", type=float, default=2.0, help="stop once nothing came for this long (s)")
    args = parser.parse_args(argv)

    conn = stomp.Connection12([(args.host, args.port)], auto_decode=False, reconnect_attempts_max=1)
    mover = Mover()
    conn.set_listener("mover", mover)
    conn.connect(args.login, args.passcode, wait=True)
    headers = {"activemq.prefetchSize": "100"}
    if args.only:
        # A selector on the broker's header: the others stay in the DLQ untouched.
        headers["selector"] = "originalDestination = '" + args.only.replace("'", "''") + "'"
    conn.subscribe(args.dlq, id="dlq-retry", ack="client-individual", headers=headers)
    moved = 0
    ids = itertools.count()
    try:
        while not args.max or moved < args.max:
            try:
                frame = mover.messages.get(timeout=args.idle)
            except queue.Empty:
                break
            target = frame.headers.get("originalDestination")
            if not target:
                print(f"left in the DLQ (no originalDestination): {frame.headers.get('message-id')}", file=sys.stderr)
                continue
            kept = {k: v for k, v in frame.headers.items() if k not in DROPPED}
            tx, receipt = f"retry-{next(ids)}", f"moved-{moved}"
            done = mover.receipts[receipt] = threading.Event()
            conn.begin(tx)
            conn.send(target, frame.body, headers={**kept, "transaction": tx})
            conn.ack(frame.headers["ack"], transaction=tx)
            conn.commit(tx, headers={"receipt": receipt})
            if not done.wait(RECEIPT_TIMEOUT_S) or mover.errors:
                print(f"gateway refused the move: {mover.errors or 'no receipt'}", file=sys.stderr)
                return 1
            del mover.receipts[receipt]
            moved += 1
    finally:
        conn.disconnect()
    print(f"moved {moved} message(s) from {args.dlq}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
