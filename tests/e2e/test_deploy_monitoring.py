"""Monitoring the broker as deploy/ ships it: every PromQL expression of the
Grafana dashboard (deploy/monitoring/grafana-dashboard.json) names metrics a
real `gateway serve` exports on /metrics, with the labels it selects on; the
optional ServiceMonitor scrapes every pod through the headless Service with
a read user's credentials."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.deploy_helpers import DEPLOY, render_python, the
from tests.e2e.test_ha_cluster import synced_pair
from tests.e2e.test_first_users import ADMIN, ADMIN_PASSWORD, ENVIRONMENT, Broker
from tests.support.helpers import Client, unique
from tests.support.processes import HOST

DASHBOARD = DEPLOY / "monitoring" / "grafana-dashboard.json"
# PromQL words that are not metric names: aggregation modifiers, set and vector matching operators.
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or", "unless"}
# Labels Prometheus adds when it scrapes, which the broker does not export.
TARGET_LABELS = {"instance", "job"}


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads: what is left once strings,
    ranges, label matchers, grouping clauses and numbers are taken out, minus
    functions (a name before "(") and keywords."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\boffset\s+-?[\w.]+", " ", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"(?<![\w.])\d+(\.\d+)?([eE][+-]?\d+)?", " ", expr)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        if expr[match.end():].lstrip().startswith("(") or match.group() in KEYWORDS:
            continue
        names.add(match.group())
    return names


def selected_labels(expr: str) -> dict[str, set[str]]:
    """metric name -> the label names its matchers and the grouping around it use."""
    out: dict[str, set[str]] = {}
    for match in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)\{([^}]*)\}", expr):
        labels = {m.group(1) for m in re.finditer(r"([A-Za-z_]\w*)\s*(=~|!~|!=|=)", match.group(2))}
        out.setdefault(match.group(1), set()).update(labels)
    grouped = {label.strip() for clause in re.findall(r"\bby\s*\(([^)]*)\)", expr) for label in clause.split(",")}
    for name in metric_names(expr):
        out.setdefault(name, set()).update(grouped - {"le"})
    return out


def test_the_expression_reader_finds_metrics_and_only_metrics():
    expr = 'histogram_quantile(0.99, sum by (le) (rate(x_bucket{instance=~"$i", a="b{c}"}[$__rate_interval]))) / y_total offset 5m > 1e3'
    assert metric_names(expr) == {"x_bucket", "y_total"}
    assert metric_names("time() - process_start_time_seconds") == {"process_start_time_seconds"}
    assert selected_labels('sum by (protocol) (gateway_connections{instance=~"$i"})') == {"gateway_connections": {"instance", "protocol"}}


HA_ROW = "High availability"  # panels on what only an [ha] group exports (backups, lag)


def dashboard_queries() -> dict[str, list[str]]:
    """The expressions by the row their panel is in ("templating": the variables')."""
    dashboard = json.loads(DASHBOARD.read_text())
    found: dict[str, list[str]] = {}

    def walk(node: Any, row: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "expr" and isinstance(value, str):
                    found.setdefault(row, []).append(value)
                else:
                    walk(value, row)
        elif isinstance(node, list):
            for item in node:
                walk(item, row)

    row = ""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
        walk(panel, row)
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            metric = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query["query"])
            assert metric, query
            found.setdefault("templating", []).append(f"{metric.group(1)}{{{metric.group(2)}=~\".*\"}}")
    return found


def check(queries: list[str], exported: dict[str, set[str]]) -> set[str]:
    """Every metric and label ``queries`` use is in ``exported``; the metric names used."""
    used: set[str] = set()
    for expr in queries:
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        for name, labels in selected_labels(expr).items():
            assert name in exported, f"{name} (in {expr!r}) is not a metric the broker exports"
            missing = labels - TARGET_LABELS - exported[name]
            assert not missing, f"{name} has no label {missing} (in {expr!r})"
        used |= names
    return used


def samples_of(text: str) -> dict[str, set[str]]:
    samples: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    return samples


@pytest.fixture
def exported(tmp_path) -> dict[str, set[str]]:
    """Sample name -> label names, from a real broker with a destination and a client."""
    broker = Broker(tmp_path, ENVIRONMENT, "--log-format", "json")
    try:
        client = Client((HOST, broker.stomp_port)).connect(login=ENVIRONMENT["GATEWAY_USER"],
                                                           passcode=ENVIRONMENT["GATEWAY_PASSWORD"])
        try:
            client.send(f"/queue/{unique('dash')}", b"one")
            status, text = broker.get("/metrics", (ADMIN, ADMIN_PASSWORD))
        finally:
            client.close()
    finally:
        broker.stop()
    assert status == 200
    return samples_of(text)


def test_every_dashboard_expression_names_metrics_a_single_broker_exports(exported):
    by_row = dashboard_queries()
    assert set(by_row) == {"Clients", "Messages", "Store", "Process", HA_ROW, "templating"}
    queries = [expr for row, exprs in by_row.items() if row != HA_ROW for expr in exprs]
    assert len(queries) >= 20
    used = check(queries, exported)
    # The panels an operator looks at first are there.
    assert {"gateway_connections", "gateway_destination_depth", "gateway_store_write_seconds_bucket",
            "process_cpu_seconds_total", "process_open_fds", "gateway_disk_free_bytes"} <= used


def test_the_high_availability_panels_name_what_an_ha_group_exports(tmp_path, zookeeper):
    """The primary's and a backup's /metrics, from a real group of two on a
    real ZooKeeper, with the backup in sync (so the lag families have samples)."""
    with synced_pair(tmp_path, zookeeper, 5) as (_, primary, backup, _doc):
        texts = [node.get("/metrics") for node in (primary, backup)]
    exported: dict[str, set[str]] = {}
    for answer in texts:
        assert answer is not None and answer[0] == 200
        for name, labels in samples_of(answer[1]).items():
            exported.setdefault(name, set()).update(labels)
    used = check(dashboard_queries()[HA_ROW], exported)
    assert {"gateway_ha_role", "gateway_ha_replication_lag_bytes", "gateway_ha_replication_lag_seconds",
            "gateway_ha_backups_in_sync", "gateway_ha_failovers_total"} <= used


def test_the_dashboard_is_importable_json_with_unique_ids():
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and dashboard["uid"] and dashboard["schemaVersion"] >= 36
    datasource = next(v for v in dashboard["templating"]["list"] if v["type"] == "datasource")
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == f"${{{datasource['name']}}}", panel["title"]
            assert panel["targets"], panel["title"]


def test_the_service_monitor_scrapes_every_pod_with_a_read_user():
    (monitor,) = [d for d in yaml.safe_load_all((DEPLOY / "monitoring" / "servicemonitor.yaml").read_text()) if d]
    kustomization = yaml.safe_load((DEPLOY / "monitoring" / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["servicemonitor.yaml"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["kind"] == "ServiceMonitor"
    rendered = render_python()
    selector = monitor["spec"]["selector"]["matchLabels"]
    services = [o for o in rendered if o["kind"] == "Service" and selector.items() <= o["metadata"]["labels"].items()]
    assert [s["metadata"]["name"] for s in services] == ["gateway-headless"], "the headless Service alone"
    headless = services[0]
    assert headless["spec"]["publishNotReadyAddresses"] is True, "backups (never Ready) are scraped too"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in headless["spec"]["ports"]}
    container_port = next(p for p in the(rendered, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]["ports"]
                          if p["name"] == endpoint["port"])
    assert container_port["containerPort"] == 8161 and endpoint["path"] == "/metrics"
    auth = endpoint["basicAuth"]
    assert auth["username"]["key"] == "username" and auth["password"]["key"] == "password"
    assert auth["username"]["name"] == auth["password"]["name"]
