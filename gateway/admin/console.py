"""The web console: one page, no build step, polling the JSON API.

The browser authenticates the page with HTTP basic auth (the API answers 401
with a challenge) and sends the same credentials with every fetch."""

from __future__ import annotations

PAGE = b"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>gateway console</title>
<style>
  body { font: 14px system-ui, sans-serif; margin: 1.5rem; color: #222; }
  h1 { font-size: 1.3rem; } h2 { font-size: 1.1rem; margin-top: 1.5rem; }
  table { border-collapse: collapse; min-width: 40rem; }
  th, td { border-bottom: 1px solid #ddd; padding: .3rem .6rem; text-align: left; }
  td.n { text-align: right; font-variant-numeric: tabular-nums; }
  #status { color: #666; }
</style>
</head>
<body>
<h1>gateway</h1>
<p id="status">loading&hellip;</p>
<section id="cluster" hidden>
<h2>Cluster</h2>
<p id="cluster-note"></p>
<table id="nodes">
  <thead><tr><th>node</th><th>role</th><th>epoch</th><th>LSN</th><th>in sync</th><th>lag (bytes)</th><th>lag (s)</th></tr></thead>
  <tbody></tbody>
</table>
</section>
<h2>Destinations</h2>
<table id="destinations">
  <thead><tr><th>name</th><th>type</th><th>depth</th><th>consumers</th><th>in/s</th><th>out/s</th><th></th></tr></thead>
  <tbody></tbody>
</table>
<h2>Connections</h2>
<table id="connections">
  <thead><tr><th>id</th><th>protocol</th><th>peer</th><th>client id</th><th>subscriptions</th></tr></thead>
  <tbody></tbody>
</table>
<script>
"use strict";
const REFRESH_MS = 1000;
// Absolute URLs on the origin: a page opened as http://user:pass@host/ may
// not fetch relative URLs (they would inherit the embedded credentials).
const api = (path) => location.origin + path;
let previous = {}, previousAt = 0;

function cell(row, text, numeric) {
  const td = row.insertCell();
  td.textContent = text;
  if (numeric) td.className = "n";
  return td;
}

async function purge(name) {
  const path = "/api/v1/destinations/" + encodeURIComponent(name) + "/purge";
  const response = await fetch(api(path), {method: "POST", credentials: "same-origin"});
  if (!response.ok) alert("purge failed: " + (await response.json()).reason);
  refresh();
}

// The HA group (/api/v1/cluster); a single node (role "single") hides the panel.
function showCluster(c) {
  const panel = document.getElementById("cluster");
  panel.hidden = c.role === "single";
  if (panel.hidden) return;
  const note = "this node: " + c.node_id + " (" + c.state + "), primary: " + (c.primary || "none") +
    (c.role === "primary" ? ", in sync: " + c.in_sync + " of " + c.sync_replicas + " required" : "") +
    (c.zookeeper === "ok" ? "" : "; ZooKeeper: " + c.zookeeper);
  document.getElementById("cluster-note").textContent = note;
  const body = document.querySelector("#nodes tbody");
  body.replaceChildren();
  for (const n of c.nodes) {
    const row = body.insertRow(), r = n.replication;
    row.dataset.node = n.node_id;
    cell(row, n.node_id + (n.self ? " (this node)" : ""));
    cell(row, n.role === null ? "?" : n.role).className = "role";
    cell(row, n.epoch, true).className = "n epoch";
    cell(row, n.lsn, true).className = "n lsn";
    cell(row, r ? (r.in_sync ? "yes" : "no") : "");
    cell(row, r ? (r.lag_exact ? "" : "\\u2265 ") + r.lag_bytes : "", true).className = "n lag";
    cell(row, r ? (r.lag_exact ? "" : "\\u2265 ") + r.lag_seconds : "", true);
  }
}

async function refresh() {
  try {
    const [destinations, connections, cluster] = await Promise.all([
      fetch(api("/api/v1/destinations"), {credentials: "same-origin"}).then(r => r.json()),
      fetch(api("/api/v1/connections"), {credentials: "same-origin"}).then(r => r.json()),
      fetch(api("/api/v1/cluster"), {credentials: "same-origin"}).then(r => r.json()),
    ]);
    showCluster(cluster);
    const now = performance.now(), seconds = (now - previousAt) / 1000, current = {};
    const body = document.querySelector("#destinations tbody");
    body.replaceChildren();
    for (const d of destinations) {
      const row = body.insertRow();
      row.dataset.name = d.name;
      const before = previous[d.name];
      const rate = (field) => before && seconds > 0 ? ((d[field] - before[field]) / seconds).toFixed(1) : "";
      cell(row, d.name); cell(row, d.type);
      cell(row, d.depth, true).className = "n depth";
      cell(row, d.consumers, true); cell(row, rate("enqueued"), true); cell(row, rate("dequeued"), true);
      const action = row.insertCell();
      if (d.type === "queue" || d.type === "temp-queue") {
        const button = document.createElement("button");
        button.textContent = "purge";
        button.className = "purge";
        button.onclick = () => purge(d.destination);
        action.append(button);
      }
      current[d.name] = d;
    }
    previous = current; previousAt = now;
    const conns = document.querySelector("#connections tbody");
    conns.replaceChildren();
    for (const c of connections) {
      const row = conns.insertRow();
      cell(row, c.id); cell(row, c.protocol); cell(row, c.peer); cell(row, c.client_id || ""); cell(row, c.subscriptions, true);
    }
    document.getElementById("status").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    document.getElementById("status").textContent = "error: " + e;
  }
}
refresh();
setInterval(refresh, REFRESH_MS);
</script>
</body>
</html>
"""
