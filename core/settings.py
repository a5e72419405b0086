"""The broker's settings (one frozen record, per-destination overrides in
core/policies.py) and its statistics."""

from __future__ import annotations

import dataclasses
from typing import Any

from core.policies import check_entries


@dataclasses.dataclass(frozen=True)
class BrokerSettings:
    # ActiveMQ's default queue prefetch.
    default_prefetch: int = 1000
    # Messages a non-durable topic subscriber may fall behind before the oldest
    # are discarded (ActiveMQ's pending-message limit strategy).
    topic_buffer_limit: int = 10_000
    # A topic subscriber this far behind holds back the topic's producers
    # (ActiveMQ's producer flow control) until it has caught up half of it.
    topic_high_water: int = 1_000
    # ...unless it takes nothing for this long while producers wait: then it
    # is a slow consumer, and it alone pays (its buffer overflows at
    # topic_buffer_limit) rather than every subscriber of the topic.
    slow_consumer_s: float = 2.0
    # Stored messages a queue keeps in memory with their bodies; beyond this
    # they wait on disk and are read back on dispatch.
    resident_messages: int = 10_000
    # A message NACKed, rolled back or left unacked this many times more than
    # its first delivery goes to the dead-letter queue (ActiveMQ's default 6).
    max_redeliveries: int = 6
    dead_letter_queue: str = "/queue/DLQ"
    # True: each queue's dead letters go to DLQ.<its name> instead.
    dead_letter_per_destination: bool = False
    # A queue this deep holds its producers back (their connections stop
    # reading) until consumers bring it down to half; 0 = no limit.  With
    # send_fail_if_no_space the SEND is refused with an error instead.
    queue_high_water: int = 100_000
    send_fail_if_no_space: bool = False
    # Expired persistent messages go to the dead-letter queue (non-persistent
    # ones are dropped); false drops both.  Counted either way.
    expired_to_dlq: bool = True
    # Redelivery delay: the first redelivery waits this long (0: at once),
    # each later one backoff times longer, up to the maximum.
    redelivery_delay_ms: int = 0
    redelivery_backoff: float = 1.0
    max_redelivery_delay_ms: int = 60_000
    # Queues and durable subscriptions; temporary destinations do not count
    # here (one client could otherwise take them all) but against their
    # connection's own max_temporaries_per_client.
    max_destinations: int = 10_000
    max_temporaries_per_client: int = 100
    max_subscriptions_per_client: int = 1_000
    max_transactions_per_client: int = 64
    max_transaction_messages: int = 100_000
    # Bytes (bodies and headers) held in open transactions until COMMIT: per
    # connection, all its transactions together, and broker-wide; 0 = no limit.
    max_transaction_bytes_per_client: int = 64 * 1024 * 1024
    max_transaction_bytes_total: int = 512 * 1024 * 1024
    # Retained messages (MQTT) kept broker-wide, and their body bytes (0 = no
    # limit): past either a new retained topic is not kept (the publish is
    # still routed), nor a larger value for a kept one; replacing one with a
    # value no larger and clearing one always work.
    max_retained_messages: int = 100_000
    max_retained_bytes: int = 256 * 1024 * 1024
    # ...and one holder's share of them: a logged-in user's, or all anonymous
    # clients' from one source address (core.tally).  Past it, the same as
    # past the broker's bounds for that holder alone; 0 = no share.
    max_retained_messages_per_user: int = 10_000
    max_retained_bytes_per_user: int = 32 * 1024 * 1024
    # Durable subscriptions (STOMP's and persistent MQTT sessions' filters)
    # one logged-in user may hold, and all clients together; past either the
    # SUBSCRIBE is refused (0 = no limit).  Anonymous clients of an open
    # broker are bound by the broker-wide limit alone: they are every device
    # of a broker without users, not one user to be fair to.
    max_durable_subscriptions_per_user: int = 1_000
    max_durable_subscriptions: int = 100_000
    # Shared subscription groups (MQTT 5 $share, JMS 2.0 shared) on the
    # broker, and the messages one group's queue holds before its oldest are
    # discarded (0 = no limit): a durable group collects while no member is
    # connected.
    max_shared_groups: int = 10_000
    max_shared_group_messages: int = 100_000
    # Groups one holder (a user; anonymous clients: per source address) may
    # have made, of those (0 = no share), and the longest group name: a name
    # is part of every key the group is kept under, in memory and on disk.
    max_shared_groups_per_user: int = 1_000
    max_shared_group_name_chars: int = 256
    # Topic archives (per-destination policy, usually): every message
    # published to an archived topic gets the topic's next offset and is kept
    # until retention drops it, by age and by bytes per topic (0 = no limit).
    archive: bool = False
    archive_retention_s: int = 0
    archive_retention_bytes: int = 0
    # Idempotency keys of COMMITs remembered (persistently) so a replayed
    # transaction is discarded; the oldest are forgotten beyond this.
    commit_keys: int = 100_000
    # Per-destination overrides of the settings above (core/policies.py).
    policies: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("max_retained_messages_per_user", "max_retained_bytes_per_user", "max_shared_groups_per_user"):
            if getattr(self, name) < 0:
                raise ValueError(f"broker.{name} must be >= 0 (0: no limit), not {getattr(self, name)}")
        if self.max_shared_group_name_chars < 1:
            raise ValueError(f"broker.max_shared_group_name_chars must be >= 1, not {self.max_shared_group_name_chars}")
        check_entries(self, self.policies)  # a bad entry fails at start-up, named


class BrokerStatistics:
    __slots__ = (
        "messages_in", "messages_discarded", "clients", "producer_holds", "dead_lettered", "denied", "retained_refused",
    )

    def __init__(self) -> None:
        self.denied: dict[str, int] = {}  # operations the authorization map refused, by operation
        self.messages_in = 0
        self.dead_lettered = 0
        self.producer_holds = 0  # times a producer was held back by flow control
        self.messages_discarded = 0
        self.clients = 0
        self.retained_refused = 0  # retained messages not kept for max_retained_*


class QueueStatistics:
    """One queue's counters (core.destinations.Queue.stats)."""

    __slots__ = ("enqueued", "delivered", "dequeued", "redelivered", "discarded", "expired")

    def __init__(self) -> None:
        self.expired = 0
        self.enqueued = 0
        self.delivered = 0  # handed to a consumer (acked or not)
        self.dequeued = 0
        self.redelivered = 0
        self.discarded = 0
