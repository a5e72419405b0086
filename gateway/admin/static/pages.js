// The console's list pages: overview (figures and charts over the last
// minutes), queues, topics with their subscribers, connections, topic
// archives and the cluster.  Each draws into ``view`` from fresh API data.
"use strict";

(() => {
  const {api, el, table, cell, armed, register} = Console;
  const short = Charts.short;
  const link = (name) => el("a", {href: "#/destination/" + encodeURIComponent(name), class: "name"}, name);
  const writer = () => document.body.dataset.role === "write";

  function figure(id, label, value) {
    return el("div", {class: "figure", id}, el("div", {class: "label"}, label), el("div", {class: "value"}, value));
  }

  function chartCard(title, id, svg) {
    svg.id = id;
    return el("div", {class: "card"}, el("h2", {}, title), svg);
  }

  // Rates and depth history by destination name, from /api/v1/history.
  const lastOf = (ring) => (ring && ring.length ? ring[ring.length - 1] : null);

  register("overview", async (view) => {
    const [now, history] = await Promise.all([api("/api/v1/overview"), api("/api/v1/history")]);
    const samples = history.samples;
    const last = samples.length ? samples[samples.length - 1] : {in: 0, out: 0};
    const protocols = Object.entries(now.by_protocol).map(([p, n]) => `${p} ${n}`).join(", ") || "none";
    view.append(
      el("h1", {}, "Overview"),
      el("div", {class: "figures"},
        figure("fig-in", "messages in /s", short(last.in)),
        figure("fig-out", "messages out /s", short(last.out)),
        figure("fig-queued", "queued", String(now.queued)),
        figure("fig-unacked", "unacked", String(now.unacked)),
        figure("fig-connections", "connections (" + protocols + ")", String(now.connections)),
        figure("fig-memory", "memory (RSS)", short(now.memory, "B")),
        figure("fig-store", "store", short(now.store_bytes, "B")),
        figure("fig-disk", "disk free", now.disk_free >= 0 ? short(now.disk_free, "B") : "?"),
      ),
      el("div", {class: "charts"},
        chartCard("Message rates", "chart-rates", Charts.line(samples, [
          {label: "in/s", key: "in", color: "#2f6fde"}, {label: "out/s", key: "out", color: "#23a36b"}], {title: "messages per second"})),
        chartCard("Queued messages", "chart-queued", Charts.line(samples, [
          {label: "queued", key: "queued", color: "#d9822b"}, {label: "unacked", key: "unacked", color: "#8a4fd1"}], {title: "messages waiting"})),
        chartCard("Connections", "chart-connections", Charts.line(samples, [
          {label: "connections", key: "connections", color: "#2f6fde"}], {title: "open connections"})),
        chartCard("Memory and store", "chart-memory", Charts.line(samples, [
          {label: "memory", key: "memory", color: "#c62f2f"}, {label: "store", key: "store_bytes", color: "#6b7380"}],
          {title: "bytes", unit: "B"})),
      ),
      el("p", {class: "muted"}, `${samples.length} samples, one every ${history.interval_s} s; ` +
        `${now.published} messages published since start, ${now.dead_lettered} dead-lettered, ${now.destinations} queues`),
    );
  });

  register("queues", async (view) => {
    const [destinations, history] = await Promise.all([api("/api/v1/destinations"), api("/api/v1/history")]);
    const t = table("destinations", [["name"], ["type"], ["depth", 1], ["unacked", 1], ["consumers", 1], ["in/s", 1],
      ["out/s", 1], ["enqueued", 1], ["dequeued", 1], ["depth, last minutes"], [""]]);
    const body = t.tBodies[0];
    for (const d of destinations) {
      const ring = history.destinations[d.name] || [];
      const last = lastOf(ring);
      const row = el("tr", {"data-name": d.name});
      row.append(el("td", {}, link(d.name), d.name.includes("DLQ") ? el("span", {class: "badge dlq"}, " dead letters") : null));
      cell(row, d.type);
      cell(row, d.depth, "n depth");
      cell(row, d.unacked, "n unacked");
      cell(row, d.consumers, "n consumers");
      cell(row, last ? last[2] : "", "n rate-in");
      cell(row, last ? last[3] : "", "n rate-out");
      cell(row, d.enqueued, "n");
      cell(row, d.dequeued, "n");
      row.append(el("td", {class: "spark"}, Charts.sparkline(ring.map((s) => s[1]))));
      const actions = el("td");
      if (writer() && (d.type === "queue" || d.type === "temp-queue")) {
        actions.append(armed("purge", "purge:" + d.name,
          () => api(Console.destinationPath(d.destination) + "/purge", {method: "POST"}).then((r) => `purged ${r.purged} from ${d.name}`)));
      }
      row.append(actions);
      body.append(row);
    }
    view.append(el("h1", {}, "Queues"), el("p", {class: "muted"},
      "Queues, durable subscriptions and shared subscription groups: what waits (depth), what was delivered and is not yet acked."), t);
    if (!destinations.length) view.append(el("p", {}, "No queues yet."));
  });

  register("topics", async (view) => {
    const [topics, history] = await Promise.all([api("/api/v1/topics"), api("/api/v1/history")]);
    const t = table("topics", [["topic / subscriber"], ["kind"], ["client"], ["pending", 1], ["unacked", 1], ["to subscribers /s", 1],
      ["copies in", 1], ["archive offsets"], ["pending, last minutes"]]);
    const body = t.tBodies[0];
    for (const topic of topics) {
      const ring = history.destinations[topic.topic] || [];
      const last = lastOf(ring);
      const archived = topic.archive ? `${topic.archive.earliest} \u2026 ${topic.archive.latest}` : "";
      const row = el("tr", {"data-topic": topic.topic, class: "topic"});
      row.append(el("td", {}, el("strong", {}, topic.topic)));
      cell(row, topic.subscribers.length + " subscribers", "subscribers");
      cell(row, "");
      cell(row, topic.pending, "n pending");
      cell(row, topic.unacked, "n unacked");
      cell(row, last ? last[2] : "", "n rate-in");
      cell(row, topic.enqueued, "n");
      cell(row, archived, "archive");
      row.append(el("td", {class: "spark"}, Charts.sparkline(ring.map((s) => s[1]))));
      body.append(row);
      for (const s of topic.subscribers) {
        const sub = el("tr", {class: "subscriber", "data-name": s.name, "data-topic": topic.topic});
        sub.append(el("td", {}, s.kind === "non-durable" ? s.name : link(s.name)));
        cell(sub, s.kind + (s.active ? "" : " (offline)") + (s.members !== undefined ? `, ${s.members} members` : ""), "kind");
        cell(sub, s.client_id || s.connection || "");
        cell(sub, s.pending, "n pending");
        cell(sub, s.unacked, "n unacked");
        cell(sub, "");
        cell(sub, s.enqueued, "n");
        cell(sub, "");
        cell(sub, "");
        body.append(sub);
      }
    }
    view.append(el("h1", {}, "Topics"), el("p", {class: "muted"},
      "Every topic someone subscribes to, or that is archived, with its subscribers: each message published is copied to " +
      "each subscriber, so the topic's figures are its subscribers' together."), t);
    if (!topics.length) view.append(el("p", {}, "No topic subscribers or archives yet."));
  });

  register("connections", async (view) => {
    const connections = await api("/api/v1/connections");
    const t = table("connections", [["id"], ["protocol"], ["peer"], ["client id"], ["subscriptions", 1], ["bytes in", 1],
      ["bytes out", 1], ["open since"], [""]]);
    for (const c of connections) {
      const row = el("tr", {"data-id": c.id, "data-client": c.client_id || ""});
      cell(row, c.id); cell(row, c.protocol); cell(row, c.peer); cell(row, c.client_id || "");
      cell(row, c.subscriptions, "n"); cell(row, short(c.bytes_in, "B"), "n"); cell(row, short(c.bytes_out, "B"), "n");
      cell(row, new Date(c.opened).toLocaleTimeString());
      const actions = el("td");
      if (writer()) {
        actions.append(armed("close", "close:" + c.id,
          () => api("/api/v1/connections/" + encodeURIComponent(c.id), {method: "DELETE"}).then(() => "closed " + c.id)));
      }
      row.append(actions);
      t.tBodies[0].append(row);
    }
    view.append(el("h1", {}, "Connections"), t);
    if (!connections.length) view.append(el("p", {}, "No client is connected."));
  });

  register("archive", async (view) => {
    view.append(el("h1", {}, "Topic archives"));
    let listed;
    try {
      listed = await api("/api/v1/archive");
    } catch (e) {
      if (e.status !== 404) throw e;
      view.append(el("p", {}, "This broker keeps no archive."));
      return;
    }
    const t = table("archive", [["topic"], ["earliest offset", 1], ["latest offset", 1], ["messages", 1], ["bytes", 1]]);
    for (const a of listed.topics) {
      const row = el("tr", {"data-topic": a.topic});
      cell(row, a.topic); cell(row, a.earliest, "n earliest"); cell(row, a.latest, "n latest");
      cell(row, a.messages, "n messages"); cell(row, short(a.bytes, "B"), "n");
      t.tBodies[0].append(row);
    }
    view.append(el("p", {class: "muted"}, "Archived topics keep every message by offset (the policy's archive = true); " +
      "read a range as Arrow with GET /api/v1/archive/{topic}/messages?from=A&to=B, or from Spark. " +
      "The latest offset is the one the next message gets."), t);
    if (!listed.topics.length) view.append(el("p", {}, "No topic is archived (policy archive = true)."));
  });

  register("cluster", async (view) => {
    const c = await api("/api/v1/cluster");
    view.append(el("h1", {}, "Cluster"));
    const panel = el("section", {id: "cluster"});
    view.append(panel);
    if (c.role === "single") {
      panel.hidden = true;
      view.append(el("p", {id: "single"}, `A single node (no [ha] configured), at LSN ${c.lsn}.`));
      return;
    }
    panel.append(el("p", {id: "cluster-note"}, `this node: ${c.node_id} (${c.state}), primary: ${c.primary || "none"}` +
      (c.role === "primary" ? `, in sync: ${c.in_sync} of ${c.sync_replicas} required` : "") +
      (c.zookeeper === "ok" ? "" : "; ZooKeeper: " + c.zookeeper)));
    const t = table("nodes", [["node"], ["role"], ["epoch", 1], ["LSN", 1], ["in sync"], ["lag (bytes)", 1], ["lag (s)", 1]]);
    for (const n of c.nodes) {
      const row = el("tr", {"data-node": n.node_id}), r = n.replication;
      const bound = (v) => (r && !r.lag_exact ? "\u2265 " : "") + v;
      cell(row, n.node_id + (n.self ? " (this node)" : "")); cell(row, n.role === null ? "?" : n.role, "role");
      cell(row, n.epoch, "n epoch"); cell(row, n.lsn, "n lsn"); cell(row, r ? (r.in_sync ? "yes" : "no") : "");
      cell(row, r ? bound(r.lag_bytes) : "", "n lag"); cell(row, r ? bound(r.lag_seconds) : "", "n");
      t.tBodies[0].append(row);
    }
    panel.append(t);
  });
})();
