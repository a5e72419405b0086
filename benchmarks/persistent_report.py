"""Printing the persistence benchmarks' results: one scenario at a time and
the summary table."""

from __future__ import annotations

from report import fmt, pct


def print_scenario(r: dict) -> None:
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
    shutdown = b.get("shutdown_s")
    how = (f"SIGTERM -> exit code {b.get('exit_code')} in {fmt(shutdown, '.2f')} s" if shutdown is not None
           else f"exit code {b.get('exit_code')}")
    print(f"  shutdown      {how}; load average before {r.get('loadavg_before')}")
    if b.get("log_tail") and not r["ok"]:
        print("  broker log (tail):")
        for line in b["log_tail"].splitlines():
            print(f"    | {line}")


def print_summary(results: list[dict]) -> None:
    print("\n== summary")
    head = (f"{'scenario':<10} {'result':<7} {'rcpt/s':>9} {'acked/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'fsync/s':>8} "
            f"{'RSS MiB':>8} {'kill->1st':>9} {'term->1st':>9} {'RSS kill':>8}")
    print(head)
    print("-" * len(head))
    for r in results:
        lat = r.get("latency_ms") or {}
        rs = {x["after"]: x for x in r.get("restarts", [])}
        rss = r.get("broker", {}).get("rss_mib") if r["scenario"] == "persistent" else rs.get("SIGTERM", {}).get("rss_mib")
        print(f"{r['scenario']:<10} {'OK' if r['ok'] else 'FAILED':<7} {fmt(r.get('receipted_per_s')):>9} "
              f"{fmt(r.get('acked_per_s')):>9} {fmt(lat.get('p50_ms'), '.2f'):>7} {fmt(lat.get('p99_ms'), '.2f'):>7} "
              f"{fmt(r.get('fsyncs_per_s')):>8} {fmt(rss, '.1f'):>8} "
              f"{fmt(rs.get('SIGKILL', {}).get('first_message_s'), '.2f'):>9} "
              f"{fmt(rs.get('SIGTERM', {}).get('first_message_s'), '.2f'):>9} "
              f"{fmt(rs.get('SIGKILL', {}).get('rss_mib'), '.1f'):>8}")
