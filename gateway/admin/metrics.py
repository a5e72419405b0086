"""Prometheus text exposition (format 0.0.4) of the broker, its connections
and its store.  Built on demand from the live objects: nothing is counted
twice, and the hot path pays nothing for metrics it does not keep anyway."""

from __future__ import annotations

import bisect
import os
import resource
import time
from collections.abc import Iterable
from typing import Any

from gateway.admin.cluster import View, families, label as _label
from persistence.archive import list_topics


def _start_time_s() -> float:
    """When this process started, in seconds since the epoch: the kernel's
    record in /proc, else when this module was imported (at start-up)."""
    try:
        with open("/proc/self/stat") as stat:
            ticks = int(stat.read().rpartition(")")[2].split()[19])  # field 22, starttime
        with open("/proc/stat") as system:
            boot = next(int(line.split()[1]) for line in system if line.startswith("btime "))
        return round(boot + ticks / os.sysconf("SC_CLK_TCK"), 2)
    except (OSError, ValueError, IndexError, StopIteration):
        return round(time.time(), 2)


STARTED_S = _start_time_s()

# Seconds a store batch took to write and fdatasync.
WRITE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class Histogram:
    """A cumulative histogram with fixed buckets, as Prometheus expects."""

    def __init__(self, buckets: Iterable[float] = WRITE_BUCKETS) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str, samples: Iterable[tuple[str, float]]) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            self.lines.append(f"{name}{labels} {value}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def rss_bytes() -> int:
    try:
        with open(f"/proc/{os.getpid()}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _process(out: _Writer) -> None:
    """The process families Prometheus' own clients export, under their
    names, so the usual dashboards and alerts work unchanged."""
    out.family("process_resident_memory_bytes", "gauge", "Resident memory of the broker process.", [("", rss_bytes())])
    times = os.times()
    out.family("process_cpu_seconds_total", "counter", "CPU time the broker process has used (user and system).",
               [("", round(times.user + times.system, 3))])
    try:
        open_fds = len(os.listdir("/proc/self/fd"))
    except OSError:  # not Linux: left out rather than made up
        open_fds = -1
    if open_fds >= 0:
        out.family("process_open_fds", "gauge", "Open file descriptors (connections, store segments, listeners).",
                   [("", open_fds)])
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY:
        out.family("process_max_fds", "gauge", "The open file descriptor limit (soft).", [("", soft)])
    out.family("process_start_time_seconds", "gauge", "When the broker process started, in seconds since the epoch.",
               [("", STARTED_S)])


def render_standby(view: View) -> str:
    """A node that serves no clients (an HA backup): its HA state and the process."""
    out = _Writer()
    for family in families(view):
        out.family(*family)
    _process(out)
    return out.text()


def render(broker: Any, server: Any, store: Any, writes: Histogram, gatekeeper: Any = None, disk: Any = None,
           cluster: View | None = None, mqtt: Any = None) -> str:
    out = _Writer()
    for family in families(cluster) if cluster is not None else ():
        out.family(*family)
    by_protocol: dict[str, int] = {}
    for connection in list(server.connections.values()):
        by_protocol[connection.protocol] = by_protocol.get(connection.protocol, 0) + 1
    protocols = sorted(set(by_protocol) | set(server.accepted))
    out.family("gateway_connections", "gauge", "Open client connections.",
               ((f'{{protocol="{_label(p)}"}}', by_protocol.get(p, 0)) for p in protocols))
    out.family("gateway_connections_accepted_total", "counter", "Client connections accepted since start.",
               ((f'{{protocol="{_label(p)}"}}', server.accepted.get(p, 0)) for p in protocols))
    received, sent = server.traffic()
    out.family("gateway_received_bytes_total", "counter", "Bytes received from clients.", [("", received)])
    out.family("gateway_sent_bytes_total", "counter", "Bytes sent to clients.", [("", sent)])
    stats = broker.stats
    out.family("gateway_messages_published_total", "counter", "Messages routed (sends and publishes).",
               [("", stats.messages_in)])
    out.family("gateway_messages_discarded_total", "counter", "Messages dropped for want of a receiver.",
               [("", stats.messages_discarded)])
    out.family("gateway_producer_holds_total", "counter", "Times flow control held a producer back.",
               [("", stats.producer_holds)])
    out.family("gateway_dead_letters_total", "counter", "Messages moved to a dead-letter queue.",
               [("", stats.dead_lettered)])
    out.family("gateway_authorization_denied_total", "counter", "Operations the authorization map refused.",
               ((f'{{operation="{op}"}}', stats.denied.get(op, 0)) for op in ("read", "write", "admin")))
    out.family("gateway_retained_messages", "gauge", "Retained messages kept (MQTT).", [("", len(broker.retained))])
    out.family("gateway_retained_bytes", "gauge", "Body bytes of the retained messages kept.",
               [("", broker.retained.nbytes)])
    out.family("gateway_retained_refused_total", "counter",
               "Retained messages not kept for max_retained_messages / max_retained_bytes (still published).",
               [("", stats.retained_refused)])
    if gatekeeper is not None:
        out.family("gateway_logins_refused_total", "counter",
                   "CONNECTs refused: wrong or missing credentials, an address locked out, a connection limit, anonymous from another machine.",
                   ((f'{{reason="{kind}"}}', gatekeeper.refused.get(kind, 0))
                    for kind in ("credentials", "rate_limited", "unavailable", "remote_anonymous")))
    if mqtt is not None:  # the MQTT sessions' registry
        out.family("gateway_mqtt_oversize_dropped_total", "counter",
                   "MQTT 5 messages not sent for being over the subscriber's Maximum Packet Size.",
                   [("", mqtt.oversize_dropped)])
    out.family("gateway_tls_handshakes_failed_total", "counter", "TLS handshakes that failed or timed out.",
               [("", server.tls_handshakes_failed)])
    # A durable subscription's or shared group's queue (its address a topic)
    # is named by its key (a non-durable group's queue has none: its group's).
    queues = [(q.address.text if q.address.is_queue else q.key or q.owner.key, q) for q in broker.all_queues()]
    fields = (
        ("gateway_destination_depth", "gauge", "Messages waiting in a queue or durable subscription.", lambda q: q.depth),
        ("gateway_destination_consumers", "gauge", "Consumers attached.", lambda q: len(q.consumers)),
        ("gateway_destination_enqueued_total", "counter", "Messages that entered.", lambda q: q.stats.enqueued),
        ("gateway_destination_dequeued_total", "counter", "Messages consumed (acked).", lambda q: q.stats.dequeued),
        ("gateway_destination_redelivered_total", "counter", "Messages put back for redelivery.",
         lambda q: q.stats.redelivered),
        ("gateway_destination_discarded_total", "counter", "Messages dropped (limits, purges, dead letters).",
         lambda q: q.stats.discarded),
        ("gateway_destination_expired_total", "counter", "Messages that expired before delivery.",
         lambda q: q.stats.expired),
    )
    for name, kind, help_text, value in fields:
        out.family(name, kind, help_text, ((f'{{destination="{_label(text)}"}}', value(q)) for text, q in queues))
    archive = getattr(store, "archive", None)
    if archive is not None:
        topics = [(f'{{topic="{_label(info.topic)}"}}', info) for info in list_topics(archive)]
        out.family("gateway_archive_earliest_offset", "gauge", "The oldest offset an archived topic still keeps.",
                   ((labels, info.earliest) for labels, info in topics))
        out.family("gateway_archive_latest_offset", "gauge", "The offset an archived topic's next message gets.",
                   ((labels, info.latest) for labels, info in topics))
        out.family("gateway_archive_bytes", "gauge", "Bytes in an archived topic's segments.",
                   ((labels, info.bytes) for labels, info in topics))
    store_stats = store.stats()
    out.family("gateway_store_bytes", "gauge", "Bytes in journal segments.", [("", store_stats["bytes"])])
    out.family("gateway_store_segments", "gauge", "Journal segment files.", [("", store_stats["segments"])])
    out.family("gateway_store_live_messages", "gauge", "Stored messages still referenced.",
               [("", store_stats["live_messages"])])
    out.family("gateway_store_fsyncs_total", "counter", "fdatasync calls on the journal.", [("", store_stats["fsyncs"])])
    out.family("gateway_store_corrupt_records_total", "counter", "Records skipped for a bad checksum.",
               [("", store_stats["corrupt_records"])])
    out.family("gateway_disk_alarm", "gauge",
               "1 while the data folder's free space is below store.min_free_bytes (persistent producers held).",
               [("", int(broker.disk_alarm))])
    if disk is not None and disk.free_bytes >= 0:
        out.family("gateway_disk_free_bytes", "gauge", "Free bytes on the data folder's filesystem, last looked at.",
                   [("", disk.free_bytes)])
    cumulative = 0
    samples = []
    for bound, count in zip(writes.buckets, writes.counts):
        cumulative += count
        samples.append((f'_bucket{{le="{bound}"}}', cumulative))
    samples.append(('_bucket{le="+Inf"}', writes.count))
    out.lines.append("# HELP gateway_store_write_seconds Time to write and sync one batch (group commit).")
    out.lines.append("# TYPE gateway_store_write_seconds histogram")
    for suffix, value in samples:
        out.lines.append(f"gateway_store_write_seconds{suffix} {value}")
    out.lines.append(f"gateway_store_write_seconds_sum {writes.total}")
    out.lines.append(f"gateway_store_write_seconds_count {writes.count}")
    _process(out)
    return out.text()
