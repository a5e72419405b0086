"""Printing benchmark results: the figure formatting every runner's report
uses, and the reports of run.py's queue, topic and latency scenarios and of
persistent.py's persistent and restart scenarios (one scenario at a time, then
the summary table)."""

from __future__ import annotations


def fmt(value, spec: str = ",.0f", missing: str = "-") -> str:
    if value is None or value != value:  # None or NaN
        return missing
    return format(value, spec)


def pct(cpu, wall) -> str:
    if cpu is None or not wall:
        return ""
    return f" ({100 * cpu / wall:.0f}% of a core)"


PERSISTENCE = ("persistent", "restart")


def print_scenario(r: dict) -> None:
    if r["scenario"] in PERSISTENCE:
        _print_persistence_scenario(r)
    else:
        _print_throughput_scenario(r)


def print_summary(results: list[dict]) -> None:
    persistence = bool(results) and results[0]["scenario"] in PERSISTENCE
    head, row = (_PERSISTENCE_HEAD, _persistence_row) if persistence else (_THROUGHPUT_HEAD, _throughput_row)
    print("\n== summary")
    print(head)
    print("-" * len(head))
    for r in results:
        print(row(r))


def _print_end(r: dict, b: dict) -> None:
    shutdown = b.get("shutdown_s")
    how = (f"SIGTERM -> exit code {b.get('exit_code')} in {fmt(shutdown, '.2f')} s" if shutdown is not None
           else f"exit code {b.get('exit_code')}")
    print(f"  shutdown      {how}; load average before {r.get('loadavg_before')}")
    if b.get("log_tail") and not r["ok"]:
        print("  broker log (tail):")
        for line in b["log_tail"].splitlines():
            print(f"    | {line}")


def _print_throughput_scenario(r: dict) -> None:
    name = r["scenario"]
    n = r.get("messages")
    headline = {
        "queue": f"1 producer -> {r.get('destination')} -> 1 consumer, {fmt(n)} x 128 B",
        "topic": f"1 producer -> {r.get('destination')} -> {r.get('subscribers')} subscribers "
                 f"in {r.get('consumer_processes')} processes, {fmt(n)} x 128 B",
        "latency": f"{fmt(r.get('rate'))} msgs/s for {r.get('seconds')} s -> {r.get('destination')} -> 1 consumer, 128 B",
    }[name]
    print(f"\n== {name}: {headline}; STOMP 1.2, ack auto, no receipts")
    if r["ok"]:
        each = " each" if r.get("subscribers", 1) > 1 else ""
        print(f"  result        OK: {fmt(r.get('delivered'))} of {fmt(r.get('expected'))} delivered"
              f"{' (' + fmt(n) + each + ')' if each else ''}, none lost, in order")
    else:
        print(f"  result        FAILED: {fmt(r.get('delivered'))} of {fmt(r.get('expected'))} delivered"
              + (f", {fmt(r.get('missing'))} missing" if r.get("missing") else ""))
        for text in r["problems"]:
            print(f"    ! {text}")
    wall = r.get("elapsed_s")
    if name == "latency":
        lat = r.get("latency_ms") or {}
        print(f"  rate          asked {fmt(r.get('rate'))} msgs/s; producer sent {fmt(r.get('send_rate'))} msgs/s, "
              f"consumer received {fmt(r.get('receive_rate'))} msgs/s")
        p = r.get("producer", {})
        if "late_ticks" in p:
            print(f"  pacing        {p['late_ticks']} ticks behind schedule (max lag {p['max_schedule_lag_ms']:.2f} ms)")
        print(f"  latency ms    p50 {fmt(lat.get('p50_ms'), '.3f')}  p90 {fmt(lat.get('p90_ms'), '.3f')}  "
              f"p99 {fmt(lat.get('p99_ms'), '.3f')}  p99.9 {fmt(lat.get('p999_ms'), '.3f')}  "
              f"max {fmt(lat.get('max_ms'), '.3f')}  (mean {fmt(lat.get('mean_ms'), '.3f')}, n={fmt(lat.get('count'))})")
    else:
        label = "delivered" if name == "topic" else "throughput"
        print(f"  {label:<13} {fmt(r.get('msgs_per_s'))} msgs/s   = {fmt(r.get('delivered'))} delivered / "
              f"{fmt(wall, '.3f')} s (first send -> last receive)")
        if r.get("publish_s"):
            print(f"  publish       {fmt(r.get('publish_msgs_per_s'))} msgs/s   = {fmt(n)} SENDs taken by the broker in "
                  f"{fmt(r.get('publish_s'), '.3f')} s (producer's socket writes done after {fmt(r.get('send_s'), '.3f')} s)")
        else:
            print("  publish       -   (the broker never confirmed taking every SEND)")
    b = r.get("broker", {})
    print(f"  broker        CPU {fmt(b.get('cpu_s'), '.2f')} s{pct(b.get('cpu_s'), wall)};  "
          f"RSS {fmt(b.get('rss_mib'), '.1f')} MiB at end, peak {fmt(b.get('peak_rss_mib'), '.1f')} MiB "
          f"(idle at start {fmt(r.get('broker_rss_idle_mib'), '.1f')} MiB)")
    p = r.get("producer", {})
    print(f"  producer      CPU {fmt(p.get('cpu_s'), '.2f')} s{pct(p.get('cpu_s'), wall)}")
    for i, c in enumerate(r.get("consumers", [])):
        label = "consumer" if len(r["consumers"]) == 1 else f"consumer {i + 1}"
        socks = len(c.get("streams") or [])
        print(f"  {label:<13} CPU {fmt(c.get('cpu_s'), '.2f')} s{pct(c.get('cpu_s'), wall)}"
              + (f" for {socks} sockets" if socks > 1 else ""))
    _print_end(r, b)


_THROUGHPUT_HEAD = (
    f"{'scenario':<9} {'result':<7} {'msgs/s':>9} {'publish/s':>9} {'p50 ms':>7} {'p99 ms':>7} "
    f"{'p99.9 ms':>8} {'max ms':>7} {'RSS MiB':>8} {'peak MiB':>8} {'broker s':>8} {'prod s':>6} {'cons s':>6}")


def _throughput_row(r: dict) -> str:
    lat = r.get("latency_ms") or {}
    b = r.get("broker", {})
    cons = sum(c.get("cpu_s") or 0 for c in r.get("consumers", [])) if r.get("consumers") else None
    rate = r.get("msgs_per_s") if r["scenario"] != "latency" else r.get("receive_rate")
    return (f"{r['scenario']:<9} {'OK' if r['ok'] else 'FAILED':<7} {fmt(rate):>9} {fmt(r.get('publish_msgs_per_s')):>9} "
            f"{fmt(lat.get('p50_ms'), '.2f'):>7} {fmt(lat.get('p99_ms'), '.2f'):>7} {fmt(lat.get('p999_ms'), '.2f'):>8} "
            f"{fmt(lat.get('max_ms'), '.2f'):>7} {fmt(b.get('rss_mib'), '.1f'):>8} {fmt(b.get('peak_rss_mib'), '.1f'):>8} "
            f"{fmt(b.get('cpu_s'), '.2f'):>8} {fmt(r.get('producer', {}).get('cpu_s'), '.2f'):>6} {fmt(cons, '.2f'):>6}")


def _print_persistence_scenario(r: dict) -> None:
    name = r["scenario"]
    if name == "persistent":
        print(f"\n== persistent: {r.get('producers')} producers x {r.get('window')} receipted SENDs in flight -> "
              f"{r.get('destination')} -> 1 consumer (client-individual, ACK each), 128 B, {r.get('seconds')} s")
    else:
        print(f"\n== restart: {fmt(r.get('messages'))} persistent x 128 B in {r.get('destination')}, "
              f"then SIGKILL / SIGTERM and restart")
    if r["ok"]:
        print("  result        OK" + (f": {fmt(r.get('received'))} of {fmt(r.get('receipted'))} receipted messages "
                                     f"received and acked" if name == "persistent" else ""))
    else:
        print("  result        FAILED")
        for text in r["problems"]:
            print(f"    ! {text}")
    b = r.get("broker", {})
    if name == "persistent":
        lat = r.get("latency_ms") or {}
        print(f"  receipted     {fmt(r.get('receipted_per_s'))} msgs/s   = {fmt(r.get('receipted'))} receipts / "
              f"{fmt(r.get('elapsed_s'), '.3f')} s (first send -> last receipt)")
        print(f"  consumed      {fmt(r.get('acked_per_s'))} msgs/s   = {fmt(r.get('received'))} received and acked / "
              f"{fmt(r.get('consumer_elapsed_s'), '.3f')} s (first send -> last receive)")
        print(f"  receipt ms    p50 {fmt(lat.get('p50_ms'), '.3f')}  p99 {fmt(lat.get('p99_ms'), '.3f')}  "
              f"max {fmt(lat.get('max_ms'), '.3f')}  (n={fmt(lat.get('count'))})")
        if "fsyncs" in r:
            print(f"  fsyncs        {fmt(r.get('fsyncs_per_s'))} /s   = {fmt(r.get('fsyncs'))} fsyncs (store_stats) / "
                  f"{fmt(r.get('load_s'), '.1f')} s load; {fmt(r.get('fsyncs_per_receipt'), '.3f')} per receipt")
        else:
            print(f"  fsyncs        {r.get('fsyncs_note', 'n/a')}")
        print(f"  broker        CPU {fmt(b.get('cpu_s'), '.2f')} s{pct(b.get('cpu_s'), r.get('elapsed_s'))};  "
              f"RSS {fmt(b.get('rss_mib'), '.1f')} MiB at end, peak {fmt(b.get('peak_rss_mib'), '.1f')} MiB "
              f"(idle at start {fmt(r.get('broker_rss_idle_mib'), '.1f')} MiB)")
        p, c = r.get("producer", {}), r.get("consumer", {})
        print(f"  producers     CPU {fmt(p.get('cpu_s'), '.2f')} s;  consumer CPU {fmt(c.get('cpu_s'), '.2f')} s")
    else:
        print(f"  fill          {fmt(r.get('fill_msgs_per_s'))} msgs/s   = {fmt(r.get('messages'))} in "
              f"{fmt(r.get('fill_s'), '.1f')} s; RSS {fmt(r.get('rss_filled_mib'), '.1f')} MiB filled "
              f"(idle {fmt(r.get('broker_rss_idle_mib'), '.1f')} MiB); data dir {fmt(r.get('data_dir_mib'), '.1f')} MiB")
        for x in r.get("restarts", []):
            rec = x.get("recovered") or {}
            extra = (f"; store_recovered: {fmt(rec.get('messages'))} messages in {fmt(rec.get('seconds'), '.2f')} s"
                     if rec else "")
            print(f"  {'after ' + x['after']:<13} port accepting {fmt(x.get('accept_s'), '.2f')} s, first message "
                  f"{fmt(x.get('first_message_s'), '.2f')} s after exec; RSS {fmt(x.get('rss_mib'), '.1f')} MiB "
                  f"(peak {fmt(x.get('peak_rss_mib'), '.1f')}){extra}")
        if "sigterm_shutdown_s" in r:
            print(f"  SIGTERM       exit code {r.get('sigterm_exit_code')} in {fmt(r.get('sigterm_shutdown_s'), '.2f')} s "
                  f"with {fmt(r.get('messages'))} messages stored")
    _print_end(r, b)


_PERSISTENCE_HEAD = (
    f"{'scenario':<10} {'result':<7} {'rcpt/s':>9} {'acked/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'fsync/s':>8} "
    f"{'RSS MiB':>8} {'kill->1st':>9} {'term->1st':>9} {'RSS kill':>8}")


def _persistence_row(r: dict) -> str:
    lat = r.get("latency_ms") or {}
    rs = {x["after"]: x for x in r.get("restarts", [])}
    rss = r.get("broker", {}).get("rss_mib") if r["scenario"] == "persistent" else rs.get("SIGTERM", {}).get("rss_mib")
    return (f"{r['scenario']:<10} {'OK' if r['ok'] else 'FAILED':<7} {fmt(r.get('receipted_per_s')):>9} "
            f"{fmt(r.get('acked_per_s')):>9} {fmt(lat.get('p50_ms'), '.2f'):>7} {fmt(lat.get('p99_ms'), '.2f'):>7} "
            f"{fmt(r.get('fsyncs_per_s')):>8} {fmt(rss, '.1f'):>8} "
            f"{fmt(rs.get('SIGKILL', {}).get('first_message_s'), '.2f'):>9} "
            f"{fmt(rs.get('SIGTERM', {}).get('first_message_s'), '.2f'):>9} "
            f"{fmt(rs.get('SIGKILL', {}).get('rss_mib'), '.1f'):>8}")
