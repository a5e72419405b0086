"""What an operator sees of the cluster, without processes: a backup's lag
read off the primary's memory of its batches (exact while remembered, lower
bounds beyond), the /api/v1/cluster document merged from the node's live
view and the /nodes records, and the gateway_ha_* metric families (valid
Prometheus text, one role sample per state, lag labelled by backup)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from gateway.admin import cluster, metrics
from gateway.admin.cluster import ClusterBody, Lag, Member, Members, View
from gateway.ha.status import STATES, Marks


def marks(batches: list[tuple[int, int, float]], start: int = 0, limit: int = 100) -> Marks:
    """``batches``: (LSNs in it, bytes, written at), one after the other from ``start``."""
    m = Marks(start, 0.0, limit)
    lsn = start
    for count, size, at in batches:
        lsn += count
        m.add(lsn, size, at)
    return m


def test_a_caught_up_backup_has_no_lag() -> None:
    m = marks([(3, 100, 1.0), (2, 50, 2.0)])
    assert m.behind(5, now=9.0) == (0, 0, 0.0, True)
    assert m.behind(7, now=9.0) == (0, 0, 0.0, True)  # (never ahead)


def test_lag_counts_the_batches_after_the_acked_lsn_and_the_age_of_the_oldest() -> None:
    m = marks([(3, 100, 1.0), (2, 50, 2.0), (1, 10, 3.0)])  # LSNs 1-3, 4-5, 6
    assert m.behind(5, now=10.0) == (1, 10, 7.0, True)
    assert m.behind(3, now=10.0) == (3, 60, 8.0, True)
    assert m.behind(0, now=10.0) == (6, 160, 9.0, True)
    assert m.behind(4, now=10.0) == (2, 60, 8.0, True)  # part of a batch held: all of it counts


def test_behind_what_is_remembered_the_figures_are_lower_bounds() -> None:
    m = marks([(3, 100, 1.0), (2, 50, 2.0), (1, 10, 3.0)], limit=2)  # the first batch forgotten
    assert m.behind(3, now=10.0) == (3, 60, 8.0, True)
    assert m.behind(1, now=10.0) == (5, 60, 9.0, False)
    # A primary's start: what was written before it, written no later than then.
    fresh = Marks(40, 5.0)
    assert fresh.behind(30, now=6.5) == (10, 0, 1.5, False)


@given(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 1000), st.floats(0, 100)), max_size=30),
       st.integers(0, 160))
def test_exact_lag_is_the_sum_over_the_unacked_batches(batches: list[tuple[int, int, float]], acked: int) -> None:
    batches = [(n, size, float(i)) for i, (n, size, _) in enumerate(batches)]  # written in order
    m = marks(batches)
    ends, lsn = [], 0
    for n, size, at in batches:
        lsn += n
        ends.append((lsn, size, at))
    unacked = [(end, size, at) for end, size, at in ends if end > acked]
    lsns, nbytes, seconds, exact = m.behind(acked, now=1000.0)
    assert exact
    assert lsns == max(0, lsn - acked)
    assert nbytes == sum(size for _, size, _ in unacked)
    assert seconds == (1000.0 - unacked[0][2] if unacked else 0.0)


# -- the document -------------------------------------------------------------


def lag(node_id: str, acked: int, *, in_sync: bool = True, behind: int = 0) -> Lag:
    return Lag(node_id, acked, 2, in_sync, behind, behind * 100, behind * 0.5)


PRIMARY = View(node_id="gw-0", role="primary", state="primary", epoch=2, lsn=120, states=STATES, failovers=1,
               primary="gw-0", sync_replicas=1, backups=(lag("gw-1", 120), lag("gw-3", 90, in_sync=False, behind=30)))
RECORDS = Members((Member("gw-1", "backup", 2, 100, "h1:7000"), Member("gw-0", "primary", 2, 7, "h0:7000"),
                   Member("gw-2", "syncing", 1, 5, "h2:7000")))


def test_a_single_node_answers_its_own_view_with_role_single() -> None:
    doc = cluster.document(cluster.Single(lambda: 42).view(), Members())
    assert doc["role"] == "single" and doc["lsn"] == 42
    assert doc["nodes"] == [{"node_id": "", "role": "single", "state": "single", "epoch": 0, "lsn": 42, "self": True}]


def test_the_primary_lists_every_node_with_what_it_knows_of_each_backup() -> None:
    doc = cluster.document(PRIMARY, RECORDS)
    assert (doc["node_id"], doc["role"], doc["epoch"], doc["lsn"]) == ("gw-0", "primary", 2, 120)
    assert (doc["primary"], doc["sync_replicas"], doc["in_sync"], doc["zookeeper"]) == ("gw-0", 1, 1, "ok")
    nodes = {n["node_id"]: n for n in doc["nodes"]}
    assert list(nodes) == ["gw-0", "gw-1", "gw-2", "gw-3"]
    assert nodes["gw-0"]["self"] and nodes["gw-0"]["lsn"] == 120  # live, not the record's 7
    assert nodes["gw-1"]["lsn"] == 120 and nodes["gw-1"]["replication"]["lag_bytes"] == 0  # acked beats the record
    assert nodes["gw-2"]["epoch"] == 1 and nodes["gw-1"]["epoch"] == 2
    assert nodes["gw-1"]["replication"]["in_sync"] is True
    assert nodes["gw-2"]["role"] == "syncing" and "replication" not in nodes["gw-2"]  # not connected
    # Connected, with no record (its session gone): still shown, with what the primary knows.
    assert nodes["gw-3"]["role"] is None and nodes["gw-3"]["replication"] == {
        "acked_lsn": 90, "acked_epoch": 2, "in_sync": False, "lag_lsns": 30, "lag_bytes": 3000, "lag_seconds": 15.0,
        "lag_exact": True}


def test_without_zookeeper_the_node_still_shows_itself_and_says_why() -> None:
    body = ClusterBody(Fixed(PRIMARY, Members(error="nodes: no answer from ZooKeeper within 3 s")))
    doc = json.loads(body.next_chunk() or b"")
    assert body.next_chunk() is None
    assert doc["zookeeper"].startswith("nodes: no answer")
    assert [n["node_id"] for n in doc["nodes"]] == ["gw-0", "gw-1", "gw-3"]  # itself, and its backups


class Fixed:
    def __init__(self, view: View, members: Members) -> None:
        self.fixed = view, members

    def view(self) -> View:
        return self.fixed[0]

    def members(self) -> Members:
        return self.fixed[1]


# -- the metrics --------------------------------------------------------------


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_the_primary_exports_its_role_epoch_lsn_and_each_backups_lag() -> None:
    got = samples(metrics.render_standby(PRIMARY))  # the families a primary's /metrics carries too
    roles = {labels[0][1]: value for (name, labels), value in got.items() if name == "gateway_ha_role"}
    assert roles == {state: (1.0 if state == "primary" else 0.0) for state in STATES}
    assert got[("gateway_ha_epoch", ())] == 2 and got[("gateway_ha_lsn", ())] == 120
    assert got[("gateway_ha_failovers_total", ())] == 1
    assert got[("gateway_ha_backups_in_sync", ())] == 1
    assert got[("gateway_ha_replication_lag_bytes", (("backup", "gw-3"),))] == 3000
    assert got[("gateway_ha_replication_lag_seconds", (("backup", "gw-3"),))] == 15.0
    assert got[("gateway_ha_replication_lag_bytes", (("backup", "gw-1"),))] == 0
    assert got[("gateway_ha_backup_in_sync", (("backup", "gw-3"),))] == 0


def test_a_backup_exports_its_state_and_applied_lsn_but_no_lag() -> None:
    view = View(node_id="gw-1", role="backup", state="backup_in_sync", epoch=2, lsn=99, states=STATES, primary="gw-0")
    got = samples(metrics.render_standby(view))
    assert got[("gateway_ha_role", (("role", "backup_in_sync"),))] == 1
    assert got[("gateway_ha_role", (("role", "primary"),))] == 0
    assert got[("gateway_ha_lsn", ())] == 99 and got[("gateway_ha_failovers_total", ())] == 0
    assert not [name for name, _ in got if "lag" in name or "in_sync" in name]


def test_a_single_node_exports_only_its_role() -> None:
    got = samples(metrics.render_standby(cluster.Single(lambda: 5).view()))
    assert [key for key in got if key[0].startswith("gateway_ha")] == [("gateway_ha_role", (("role", "single"),))]
    assert got[("gateway_ha_role", (("role", "single"),))] == 1
