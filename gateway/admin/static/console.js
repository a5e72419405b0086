// The console's shell: logging in (HTTP basic, kept for this tab only),
// calling the API, the pages' router and the refresh loop.  The pages
// themselves are in pages.js and destination.js.
"use strict";

const REFRESH_MS = 2000;
const CREDENTIALS = "gateway.credentials";  // sessionStorage: gone when the tab closes

const Console = (() => {
  const pages = {};  // name -> async (view, args) => void, registered by pages.js
  let timer = null;
  let generation = 0;  // a page left while its refresh was waiting does not draw

  // -- the API -------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, body) {
      super(body && body.reason ? body.reason : "HTTP " + status);
      this.status = status;
      this.body = body || {};
    }
  }

  // Absolute URLs on the origin; every request says it is the console's
  // (X-Requested-With), so a 401 carries no challenge and the browser shows
  // no password dialog of its own: the login form asks instead.
  async function api(path, options = {}) {
    const headers = {"X-Requested-With": "gateway-console"};
    const saved = sessionStorage.getItem(CREDENTIALS);
    if (saved) headers["Authorization"] = "Basic " + saved;
    if (options.json !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(location.origin + path, {
      method: options.method || "GET", headers, credentials: "omit",
      body: options.json !== undefined ? JSON.stringify(options.json) : undefined,
    });
    const text = await response.text();
    let body = null;
    try { body = text ? JSON.parse(text) : null; } catch (e) { body = {reason: text}; }
    if (response.status === 401) {
      sessionStorage.removeItem(CREDENTIALS);  // wrong (or no longer right): asked for again
      showLogin(saved ? "wrong user or password" : "");
      throw new ApiError(401, body);
    }
    if (response.status === 403 && body && body.no_admin_users) { showOnly("setup"); throw new ApiError(403, body); }
    if (!response.ok) throw new ApiError(response.status, body);
    return body;
  }

  const destinationPath = (name) => "/api/v1/destinations/" + encodeURIComponent(name);

  // -- building pages --------------------------------------------------------

  // el("td", {class: "n"}, "text" | Node, ...)
  function el(name, attrs = {}, ...children) {
    const node = document.createElement(name);
    for (const [key, value] of Object.entries(attrs)) {
      if (value === undefined || value === null || value === false) continue;
      if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children) if (child !== null && child !== undefined) node.append(child);
    return node;
  }

  // A table: ``columns`` [[heading, numeric?]], rows appended by the caller.
  function table(id, columns) {
    const head = el("tr", {}, ...columns.map(([title, numeric]) => el("th", {class: numeric ? "n" : null}, title)));
    return el("table", {id}, el("thead", {}, head), el("tbody"));
  }

  function cell(row, content, className) {
    const td = el("td", {class: className}, content === undefined || content === null ? "" : String(content));
    row.append(td);
    return td;
  }

  // A button that acts on the second click (within 4 s): "purge" becomes
  // "really purge?", so a stray click deletes nothing.  ``key`` names it
  // (the page is redrawn every refresh; the armed state outlives that).
  const armedUntil = {};
  function armed(label, key, action) {
    const button = el("button", {type: "button", class: "danger " + key.split(":")[0]}, label);
    const show = () => {
      const on = Date.now() < (armedUntil[key] || 0);
      button.textContent = on ? "really " + label + "?" : label;
      button.classList.toggle("armed", on);
    };
    show();
    button.addEventListener("click", async () => {
      if (Date.now() >= (armedUntil[key] || 0)) {
        armedUntil[key] = Date.now() + 4000;
        show();
        setTimeout(show, 4100);
        return;
      }
      delete armedUntil[key];
      button.disabled = true;
      await act(action);
    });
    return button;
  }

  // Run an action, say how it went in the status line, redraw the page.
  async function act(action) {
    try {
      const said = await action();
      status(said || "done");
    } catch (e) {
      if (e.status !== 401) status("failed: " + e.message, true);
    }
    await refresh();
  }

  function status(text, bad) {
    const line = document.getElementById("status");
    // The last action's outcome, with its time: it stays while pages change.
    line.textContent = text ? new Date().toLocaleTimeString() + "  " + text : "";
    line.className = bad ? "error" : "muted";
  }

  // -- who is logged in ------------------------------------------------------

  function showOnly(id) {
    for (const section of ["login", "setup", "app"]) document.getElementById(section).hidden = section !== id;
    document.getElementById("nav").hidden = id !== "app";
    document.getElementById("who").hidden = id !== "app";
    if (id !== "app" && timer) { clearInterval(timer); timer = null; }
  }

  function showLogin(message) {
    showOnly("login");
    document.getElementById("login-error").textContent = message || "";
  }

  async function login(event) {
    event.preventDefault();
    const user = document.getElementById("login-user").value;
    const password = document.getElementById("login-password").value;
    // btoa takes Latin-1: encode UTF-8 first so any password works.
    sessionStorage.setItem(CREDENTIALS, btoa(String.fromCharCode(...new TextEncoder().encode(user + ":" + password))));
    await start();
  }

  function logout() {
    sessionStorage.removeItem(CREDENTIALS);
    showLogin("");
  }

  async function start() {
    let me;
    try {
      me = await api("/api/v1/whoami");
    } catch (e) {
      // 401 and no admin users are shown already; anything else (429 after
      // too many wrong passwords, a broker gone) is said on the form.
      if (e.status !== 401 && !(e.body && e.body.no_admin_users)) showLogin(e.status ? e.message : "the broker did not answer: " + e.message);
      return;
    }
    document.getElementById("who-name").textContent = me.user + " (" + me.role + ")";
    document.body.dataset.role = me.role;
    showOnly("app");
    await refresh();
    if (!timer) timer = setInterval(refresh, REFRESH_MS);
  }

  // -- pages -----------------------------------------------------------------

  function route() {
    const parts = location.hash.replace(/^#\/?/, "").split("/");
    const name = pages[parts[0]] ? parts[0] : "overview";
    return [name, parts.slice(1).map(decodeURIComponent)];
  }

  async function refresh() {
    if (document.getElementById("app").hidden) return;
    const [name, args] = route();
    const mine = generation;
    for (const link of document.querySelectorAll("#nav a")) {
      link.classList.toggle("current", link.dataset.page === name || (name === "destination" && link.dataset.page === "queues"));
    }
    const view = document.createElement("div");
    view.id = "page-" + name;
    try {
      await pages[name](view, args);
    } catch (e) {
      if (e.status === 401 || (e.body && e.body.no_admin_users)) return;
      view.replaceChildren(el("p", {class: "error"}, "could not load: " + e.message));
    }
    if (mine !== generation) return;
    // Keep what the user is typing: a page marks such inputs with data-keep.
    const page = document.getElementById("page");
    for (const input of page.querySelectorAll("[data-keep]")) {
      const twin = view.querySelector(`[data-keep="${input.dataset.keep}"]`);
      if (twin) twin.replaceWith(input);
    }
    page.replaceChildren(view);
    document.body.dataset.page = name;
    document.body.dataset.updated = String(Date.now());
  }

  function register(name, render) { pages[name] = render; }

  window.addEventListener("hashchange", () => { generation++; refresh(); });
  document.addEventListener("DOMContentLoaded", () => {
    document.getElementById("login-form").addEventListener("submit", login);
    document.getElementById("logout").addEventListener("click", logout);
    start();
  });

  return {api, destinationPath, el, table, cell, armed, act, status, register, refresh};
})();
