// One destination's page (#/destination/<name>): its figures and recent
// depth, its waiting messages (browse), and what an operator does to it:
// send, purge, delete, and for a dead-letter queue, retry each message to
// the destination it came from.
"use strict";

(() => {
  const {api, destinationPath, el, table, cell, armed, act, register, status} = Console;
  const BROWSE_LIMIT = 50;

  function figure(label, value, className) {
    return el("div", {class: "figure " + className}, el("div", {class: "label"}, label), el("div", {class: "value"}, String(value)));
  }

  // The send form keeps what is typed across refreshes (data-keep).
  function sendForm(name) {
    const body = el("textarea", {id: "send-body", "data-keep": "send-body", placeholder: "message body"});
    const headers = el("input", {id: "send-headers", "data-keep": "send-headers", placeholder: 'headers as JSON, e.g. {"type": "order"}', size: 40});
    const persistent = el("input", {id: "send-persistent", "data-keep": "send-persistent", type: "checkbox"});
    // Read the fields when clicked: a refresh keeps the ones being typed in
    // (moved into its new page), not the fresh ones made here.
    const send = async () => {
      const [body, headers, persistent] = ["send-body", "send-headers", "send-persistent"].map((id) => document.getElementById(id));
      let extra = {};
      try { extra = headers.value.trim() ? JSON.parse(headers.value) : {}; } catch (e) { status("headers are not JSON: " + e.message, true); return; }
      const text = body.value;
      await act(() => api(destinationPath(name) + "/messages", {method: "POST", json: {body: text, headers: extra, persistent: persistent.checked}})
        .then((r) => { body.value = ""; return "sent " + r.message_id + " to " + name; }));
    };
    return el("div", {class: "card", id: "send"}, el("h2", {}, "Send a message"), body,
      el("div", {class: "actions"}, headers, el("label", {}, persistent, " persistent"),
        el("button", {type: "button", id: "send-button", class: "primary", onclick: send}, "send")));
  }

  register("destination", async (view, args) => {
    const name = args.join("/");
    const [d, history] = await Promise.all([api(destinationPath(name)), api("/api/v1/history")]);
    // Message contents take the browse role (or write); a read user sees the figures only.
    const browse = document.body.dataset.role === "browse" || document.body.dataset.role === "write";
    const messages = browse ? await api(destinationPath(name) + "/messages?limit=" + BROWSE_LIMIT) : [];
    const ring = history.destinations[d.name] || [];
    const deadLetters = messages.some((m) => m.headers && m.headers.originalDestination);
    const isQueue = d.type === "queue" || d.type === "temp-queue";
    const write = document.body.dataset.role === "write";

    view.append(el("h1", {id: "dest-name"}, d.name, " ", el("span", {class: "badge"}, d.type),
      deadLetters ? el("span", {class: "badge dlq"}, "dead letters") : null));
    view.append(el("div", {class: "figures"},
      figure("depth", d.depth, "depth"), figure("unacked", d.unacked, "unacked"), figure("consumers", d.consumers, "consumers"),
      figure("enqueued", d.enqueued, "enqueued"), figure("dequeued", d.dequeued, "dequeued"),
      figure("redelivered", d.redelivered, "redelivered"), figure("expired", d.expired, "expired")));
    const samples = ring.map(([t, depth, rateIn, rateOut]) => ({t, depth, in: rateIn, out: rateOut}));
    view.append(el("div", {class: "charts"},
      el("div", {class: "card"}, el("h2", {}, "Depth"), Object.assign(Charts.line(samples, [{label: "depth", key: "depth", color: "#d9822b"}]), {id: "chart-depth"})),
      el("div", {class: "card"}, el("h2", {}, "Rates"), Object.assign(Charts.line(samples, [
        {label: "in/s", key: "in", color: "#2f6fde"}, {label: "out/s", key: "out", color: "#23a36b"}]), {id: "chart-dest-rates"}))));

    if (write) {
      const actions = el("div", {class: "actions", id: "dest-actions"});
      if (deadLetters) {
        actions.append(el("button", {type: "button", id: "retry-all", class: "primary", onclick: () => act(() =>
          api(destinationPath(name) + "/retry", {method: "POST"}).then((r) => `retried ${r.moved}` + (r.skipped ? `, ${r.skipped} without an original destination` : "") + (r.reason ? ": " + r.reason : "")))},
          "retry all to their original destinations"));
      }
      if (isQueue) {
        actions.append(armed("purge", "purge:" + name, () => api(destinationPath(name) + "/purge", {method: "POST"}).then((r) => `purged ${r.purged}`)));
        actions.append(armed("delete", "delete:" + name, async () => {
          const r = await api(destinationPath(name) + "?force=true", {method: "DELETE"});
          location.hash = "#/queues";
          return `deleted ${name} (${r.deleted} messages with it)`;
        }));
      } else if (d.type === "durable-subscription") {
        actions.append(armed("delete", "delete:" + name, async () => {
          await api(destinationPath(name), {method: "DELETE"});
          location.hash = "#/topics";
          return "deleted " + name;
        }));
      }
      view.append(actions);
    }

    const t = table("messages", [["message id"], ["priority", 1], ["redelivered"], ["persistent"], ["sent"],
      deadLetters ? ["from"] : ["headers"], ["body"], [""]]);
    for (const m of messages) {
      const row = el("tr", {"data-id": m.message_id});
      const headers = m.headers || {};
      cell(row, m.message_id); cell(row, m.priority, "n"); cell(row, m.redelivered ? "yes" : "");
      cell(row, m.persistent ? "yes" : ""); cell(row, m.timestamp ? new Date(m.timestamp).toLocaleTimeString() : "");
      if (deadLetters) cell(row, (headers.originalDestination || "") + (headers.dlqDeliveryFailureCause ? " (" + headers.dlqDeliveryFailureCause + ")" : ""), "origin");
      else cell(row, Object.entries(headers).map(([k, v]) => `${k}=${v}`).join(", "));
      const body = cell(row, m.body_encoding === "base64" ? "(binary) " + m.body : m.body, "body");
      body.title = m.body;
      const actions = el("td");
      if (write && headers.originalDestination) {
        actions.append(el("button", {type: "button", class: "retry", onclick: () => act(() =>
          api(destinationPath(name) + "/retry", {method: "POST", json: {message_ids: [m.message_id]}})
            .then((r) => r.moved ? `retried ${m.message_id} to ${headers.originalDestination}` : "not retried: " + (r.reason || "no original destination")))},
          "retry"));
      }
      row.append(actions);
      t.tBodies[0].append(row);
    }
    if (!browse) {
      view.append(el("p", {id: "no-browse"}, "Message contents need the browse role."));
    } else {
      view.append(el("h2", {}, `Messages (the first ${BROWSE_LIMIT}, not consumed)`), t);
      if (!messages.length) view.append(el("p", {id: "no-messages"}, "No message is waiting."));
    }
    if (write && isQueue) view.append(sendForm(d.destination));
  });
})();
