"""The admin API's semantics: request in, response out, no sockets.

Routes (``admin/server.py`` runs them over h11):

    GET    /healthz, /livez                      open: the process is alive
    GET    /readyz                               open: 200 once recovered and listening, 503 otherwise
    GET    /metrics                              read: Prometheus text exposition
    GET    /                                     the web console (a browser's: open, it logs in itself)
    GET    /console/{file}                       open: the console's scripts and styles
    GET    /api/v1/whoami                        read: the user asking and their role
    GET    /api/v1/overview                      read: totals now (queued, unacked, connections, memory, disk)
    GET    /api/v1/history                       read: the last minutes, sampled (admin/history.py)
    GET    /api/v1/topics                        read: topics with their subscribers (admin/topics.py)
    GET    /api/v1/destinations                  read: every queue and durable subscription
    GET    /api/v1/destinations/{name}           read: one, in detail
    GET    /api/v1/destinations/{name}/messages  browse: the first ?limit=N (default 20, max 1000), bodies included
    POST   /api/v1/destinations/{name}/messages  write: send {"body": str, "headers": {}, "persistent": bool}
    POST   /api/v1/destinations/{name}/purge     write: drop every pending message
    POST   /api/v1/destinations/{name}/retry     write: dead letters back to their original destinations
                                                 ({"message_ids": [...]}: those only)
    DELETE /api/v1/destinations/{name}           write: delete an unused queue (?force=true: with its messages),
                                                 or an offline durable subscription (its name is its key: durable:...)
    GET    /api/v1/cluster                       read: this node and its HA group (admin/cluster.py)
    POST   /api/v1/reload                        write: read the config file again and apply it (gateway/reload.py)
    GET    /api/v1/connections                   read: every connection
    DELETE /api/v1/connections/{id}              write: close one
    GET    /api/v1/archive[/{topic}]             read: topic archives, their offsets and sizes (admin/archive.py)
    GET    /api/v1/archive/{topic}/messages      browse: a range of an archive's messages

``{name}`` is the destination URL-encoded (``%2Fqueue%2Forders``) or without
its leading slash (``queue/orders``).  Errors are JSON: ``{"status", "reason"}``.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import tomllib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from core import deadletters, names
from core.broker import Broker
from core.errors import CoreError, QueueNotEmpty
from core.shared import SharedGroup
from gateway.admin import archive, console, topics
from gateway.admin.access import Access
from gateway.admin.cluster import ClusterBody, Single, Source
from gateway.admin.http import Request, Response, error, ok
from gateway.auth import Gatekeeper

# Each role covers the ones before it: read sees metrics and state (counts,
# depths, connections, the cluster), never a message; browse also reads
# message contents (a queue's messages, an archive's ranges); write also
# changes things.  Prometheus needs read only.
ROLES = ("read", "browse", "write")
WRITE_METHODS = frozenset({"POST", "PUT", "DELETE", "PATCH"})
USERS_FILE_ENV = "GATEWAY_ADMIN_USERS_FILE"


@dataclasses.dataclass(frozen=True)
class AdminSettings:
    # [{name = "ops", password_hash = "pbkdf2_sha256$...", role = "write"}]:
    # read (metrics and state, no message contents), browse (read, and
    # message contents), write (browse, and changes).  With no user at all the
    # API answers 403.
    users: list[dict[str, str]] = dataclasses.field(default_factory=list)
    users_file: str = ""  # a TOML file with the same `users` list (a Secret)
    max_request_bytes: int = 1024 * 1024
    request_timeout_s: float = 10.0
    # Pages allowed to open /stomp and /mqtt WebSockets, by their Origin
    # ("https://app.example.com"); empty: any.  Clients that send no Origin
    # (not browsers) are not affected.
    websocket_origins: list[str] = dataclasses.field(default_factory=list)
    # Pages besides the console itself (same host and port) whose scripts may
    # change things here (POST, PUT, DELETE); websocket_origins count too.
    # A browser's request from any other page is refused (CSRF).
    allowed_origins: list[str] = dataclasses.field(default_factory=list)
    # Connections to this port at once (API and WebSockets): its own bound,
    # so a flood here cannot take the file descriptors STOMP and MQTT need.
    max_connections: int = 256
    # ... and from one address (0: no per-address bound): a browser opens
    # six at most, so one address cannot hold the port (with 256 in all, it
    # takes 16 addresses of idle sockets to fill it, and idle_timeout_s
    # closes theirs).
    max_connections_per_address: int = 16
    # Seconds a connection may stay silent before its first request, or
    # between two requests on a kept-alive one (at most request_timeout_s);
    # then it is closed (a request under way has request_timeout_s).  Idle
    # sockets give their slots back quickly.
    idle_timeout_s: float = 5.0
    # A listener of its own serving only /healthz, /livez and /readyz,
    # without auth, for Kubernetes' probes (admin/server.py says why it is
    # its own port): -1 none, 0 a free one, else that port.  It binds where
    # the admin port does.
    probe_port: int = -1
    # Seconds between the console's history samples (its charts keep 180).
    history_interval_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError("admin.max_connections must be >= 1")
        if self.max_connections_per_address < 0:
            raise ValueError("admin.max_connections_per_address must be >= 0 (0: no per-address bound)")
        if self.idle_timeout_s <= 0:
            raise ValueError("admin.idle_timeout_s must be > 0")
        if not -1 <= self.probe_port <= 65535:
            raise ValueError("admin.probe_port must be -1 (none), 0 (a free one) or a port up to 65535")
        if not 0.1 <= self.history_interval_s <= 3600:
            raise ValueError("admin.history_interval_s must be between 0.1 and 3600")


def load_users(settings: AdminSettings) -> dict[str, tuple[str, str]]:
    """name -> (password hash, role), from the config and the users file."""
    entries = list(settings.users)
    path = settings.users_file or os.environ.get(USERS_FILE_ENV, "")
    if path:
        entries += tomllib.loads(Path(path).read_text()).get("users", [])
    users = {}
    for entry in entries:
        name, hashed, role = entry.get("name"), entry.get("password_hash"), entry.get("role", "read")
        if not name or not hashed or role not in ROLES:
            raise ValueError(f"admin user entries need name, password_hash and role read|browse|write: {entry.get('name')!r}")
        if name in users:
            # [admin] users, the users file and GATEWAY_ADMIN_USER: which one
            # counts would be a guess.
            raise ValueError(f"admin user {name!r} is defined twice (config, users file {path or '-'} or environment)")
        users[name] = (hashed, role)
    return users


def shows_contents(path: str) -> bool:
    """Whether a GET of ``path`` answers with message contents (bodies and
    headers), which take the browse role: a queue's messages, an archive's."""
    rest = path.removeprefix("/api/v1/")
    return rest != path and rest.startswith(("destinations/", "archive/")) and rest.endswith("/messages")


def _same_host(origin: str, host: str) -> bool:
    """Whether ``origin`` (scheme://host[:port]) names the host and port the
    request was sent to (its Host header), default ports filled in."""
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.hostname or not host:
        return False  # "null" (a sandboxed or file: page) is never ours
    default = 443 if parts.scheme == "https" else 80
    try:
        origin_port = parts.port or default
        target = urlsplit("//" + host.strip().lower())
        target_port = target.port or default
    except ValueError:
        return False
    return parts.hostname == target.hostname and origin_port == target_port


def _json_only(request: Request) -> Response | None:
    """A request that changes things carries JSON or nothing: the types an
    HTML form can send (urlencoded, multipart, text/plain) are refused, so no
    page elsewhere can forge one without the browser asking first (CORS)."""
    declared = request.headers.get("content-type")
    if declared is None:
        return None
    if declared.split(";", 1)[0].strip().lower() != "application/json":
        return error(415, f"expected Content-Type application/json, not {declared[:100]}")
    return None


class AdminApi:
    """Routes requests to the broker, the server's connections and the store."""

    def __init__(
        self,
        broker: Broker,
        server: Any,
        *,
        users: dict[str, tuple[str, str]],
        ready: Callable[[], bool],
        metrics: Callable[[], str],
        archive: Any = None,
        origins: Iterable[str] = (),
        gate: Gatekeeper | None = None,
        cluster: Source | None = None,
        history: Any = None,
        reload: Callable[[], Any] | None = None,
    ) -> None:
        self.broker = broker
        self.archive = archive  # persistence.archive.Archive, or None
        self.server = server
        self.access = Access(users, gate)
        self.ready = ready
        self.metrics = metrics
        self.origins = frozenset(o.strip().rstrip("/").lower() for o in origins)
        # Sources of /api/v1/cluster: this node (single) or its HA group.
        self.cluster = cluster
        self.history = history  # admin/history.History, or None (no charts)
        # Reads the configuration again and applies it (gateway/reload.py): a reload.Outcome.
        self.reload = reload

    def probe(self, path: str) -> Response | None:
        """A probe's answer (here and on the probe port, admin/server.py), or
        None when ``path`` is no probe's."""
        if path in ("/healthz", "/livez"):
            return Response(200, b"ok\n", "text/plain")
        if path == "/readyz":
            ready = self.ready()
            return Response(200 if ready else 503, b"ready\n" if ready else b"not ready\n", "text/plain")
        return None

    def handle(self, request: Request) -> Response:
        parts = urlsplit(request.target)
        path = parts.path
        probed = self.probe(path)
        if probed is not None:
            return probed
        page = console.serve(request.method, path, request.headers)
        if page is not None:  # the console's page and files: no data in them, so open
            return page
        write = request.method in WRITE_METHODS
        if write:
            refused = self._same_origin(request) or _json_only(request)
            if refused is not None:
                return refused
        # Password checks: the broker's gate (lockout, hashing off the loop, cache).
        denied = self.access.authorize(request, "write" if write else "browse" if shows_contents(path) else "read")
        if denied is not None:
            return denied
        if path == "/api/v1/whoami" and request.method == "GET":
            return ok({"user": request.user, "role": request.role})
        try:
            return self._route(request.method, path, parse_qs(parts.query), request.body)
        except CoreError as exc:
            return error(409, exc.reason)

    def _same_origin(self, request: Request) -> Response | None:
        """A browser says which page a request comes from (Origin, or at
        least Referer); one that changes things must come from the console
        itself or an allowed page, or a page elsewhere could use the
        operator's logged-in browser (CSRF).  Without either header the
        client is no browser (curl, scripts) and is not affected."""
        origin = request.headers.get("origin")
        if origin is None and "referer" in request.headers:
            parts = urlsplit(request.headers["referer"])
            origin = f"{parts.scheme}://{parts.netloc}"
        if origin is None:
            return None
        origin = origin.strip().rstrip("/").lower()
        if origin in self.origins or _same_host(origin, request.headers.get("host", "")):
            return None
        return error(403, f"cross-origin request from {origin[:200]} refused: not this console's own page "
                          "(admin.allowed_origins)")

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: bytes) -> Response:
        if path == "/" and method == "GET":
            return Response(200, console.page(), "text/html; charset=utf-8", [console.PAGE_POLICY])
        if path == "/metrics" and method == "GET":
            return Response(200, self.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")
        if not path.startswith("/api/v1/"):
            return error(404, f"no such resource {path[:100]!r}")
        rest = path[len("/api/v1/") :]
        if method == "GET" and rest in self._views:
            return ok(self._views[rest](self))
        if rest == "destinations" and method == "GET":
            return ok([self._destination(q) for q in self._queues()])
        if rest == "cluster" and method == "GET":
            # The group's records come from ZooKeeper: read in a worker thread, as the body.
            source = self.cluster or Single(lambda: getattr(self.broker.store, "durable_lsn", 0))
            return Response(200, b"", stream=ClusterBody(source))
        if rest == "reload" and method == "POST":
            if self.reload is None:
                return error(404, "this node has no configuration to reload")
            outcome = self.reload()
            if outcome.refused is not None:
                return error(409, f"the configuration was not reloaded (the running one stays): {outcome.refused}")
            return ok(outcome.body())
        if rest == "connections" and method == "GET":
            return ok([self._connection(cid, c) for cid, c in list(self.server.connections.items())])
        if rest.startswith("connections/") and method == "DELETE":
            connection = self.server.connections.get(unquote(rest[len("connections/") :]))
            if connection is None:
                return error(404, "no such connection")
            connection.shutdown("closed by an administrator")
            return ok({"closed": True})
        if rest.startswith("destinations/"):
            return self._on_destination(method, rest[len("destinations/") :], query, body)
        if rest == "archive" or rest.startswith("archive/"):
            return archive.route(self.archive, method, rest[len("archive") :], query)
        return error(404 if method == "GET" else 405, f"no route for {method} {path[:100]}")

    def _overview(self) -> Any:
        if self.history is None:
            return {}
        stats = self.broker.stats
        by_protocol: dict[str, int] = {}
        for connection in list(self.server.connections.values()):
            by_protocol[connection.protocol] = by_protocol.get(connection.protocol, 0) + 1
        return {**self.history.measure(), "published": stats.messages_in, "dead_lettered": stats.dead_lettered,
                "destinations": len(self.broker.queues), "by_protocol": by_protocol}

    def _history(self) -> Any:
        return self.history.view() if self.history is not None else {"interval_s": 0, "samples": [], "destinations": {}}

    def _topics(self) -> Any:
        return topics.view(self.broker, self.server, self.archive)

    _views: dict[str, Callable[[AdminApi], Any]] = {
        "overview": _overview, "history": _history, "topics": _topics,
    }

    def _on_destination(self, method: str, rest: str, query: dict[str, list[str]], body: bytes) -> Response:
        action = ""
        for suffix in ("/messages", "/purge", "/retry"):
            if rest.endswith(suffix):
                rest, action = rest[: -len(suffix)], suffix[1:]
        text = unquote(rest)
        if text.startswith("durable:") and not action and method == "DELETE":
            # Whoever owns it: removing durable state is an administrator's power.
            if text not in self.broker.durables:
                return error(404, f"no durable subscription {text[:200]!r}")
            self.broker.remove_durable(text)
            return ok({"deleted": text})
        if text.startswith(("durable:", "shared:")):  # a subscription's queue, by the name the list gives
            keyed = self.broker.durables.get(text) or self.broker.shared.get(text)
            if keyed is None:
                return error(404, f"no subscription {text[:200]!r}")
            return self._on_queue(method, action, keyed.queue, None, query, body)
        address = names.parse(text if text.startswith("/") else "/" + text)
        if isinstance(address, str):
            return error(400, f"invalid destination: {address}")
        if action == "messages" and method == "POST":
            return self._send(address, body)
        queue = self.broker.queue(address)
        if queue is None:
            return error(404, f"no destination {address.text!r}")
        return self._on_queue(method, action, queue, address, query, body)

    def _on_queue(self, method: str, action: str, queue: Any, address: names.Address | None,
                  query: dict[str, list[str]], body: bytes) -> Response:
        if not action and method == "GET":
            return ok(self._destination(queue))
        if action == "messages" and method == "GET":
            try:
                limit = max(1, min(1000, int(query.get("limit", ["20"])[0])))
            except ValueError:
                return error(400, "limit must be an integer")
            return ok([self._message(m) for m in queue.browse(limit)])
        if action == "purge" and method == "POST":
            return ok({"purged": queue.purge()})
        if action == "retry" and method == "POST":
            return self._retry(queue, body)
        if not action and method == "DELETE":
            if address is None or not address.is_queue:
                return error(400, "only queues can be deleted here")
            force = query.get("force", [""])[0] == "true"
            try:
                return ok({"deleted": self.broker.remove_queue(address, force=force)})
            except QueueNotEmpty as exc:
                reason = f"{exc.reason}; use ?force=true"
                return ok({"status": 409, "reason": reason, "depth": exc.depth}, 409)
        return error(405, f"{method} is not allowed here")

    def _send(self, address: names.Address, body: bytes) -> Response:
        try:
            request = json.loads(body or b"{}")
            text = request.get("body", "")
            headers = {str(k): str(v) for k, v in request.get("headers", {}).items()}
            persistent = bool(request.get("persistent", False))
        except (ValueError, AttributeError):
            return error(400, 'expected JSON {"body": "...", "headers": {...}, "persistent": false}')
        if not isinstance(text, str):
            return error(400, "body must be a string")
        message = self.broker.message(address, headers, text.encode(), persistent=persistent)
        # The sender is the operator (a write-role admin user, already checked),
        # whose rights cover every destination as purge and delete do; the
        # clients' authorization map is not theirs to answer to.
        self.broker.publish(message)  # the same door as a client's SEND, without a producer to hold
        return ok({"message_id": message.id}, 201)

    def _retry(self, queue: Any, body: bytes) -> Response:
        try:
            request = json.loads(body or b"{}")
            ids = request.get("message_ids")
        except (ValueError, AttributeError):
            return error(400, 'expected JSON {"message_ids": [...]} or nothing')
        if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, str) for i in ids)):
            return error(400, "message_ids must be a list of strings")
        result = deadletters.retry(self.broker, queue, None if ids is None else set(ids))
        answer = {"moved": result.moved, "skipped": result.skipped, **({"reason": result.reason} if result.reason else {})}
        return ok(answer, 409 if result.reason and not result.moved else 200)

    # -- views ---------------------------------------------------------------

    def _queues(self) -> list[Any]:
        return self.broker.all_queues()

    def _destination(self, queue: Any) -> dict[str, Any]:
        durable = queue.key is not None and queue.key.startswith("durable:")
        shared = isinstance(queue.owner, SharedGroup)
        stats = queue.stats
        owner = self.broker.durables[queue.key].owner if durable and queue.key in self.broker.durables else None
        kind = "durable-subscription" if durable else queue.address.kind.name.lower().replace("_", "-")
        return {
            "name": topics.queue_name(queue),
            "type": "shared-subscription" if shared else kind,
            "destination": queue.address.text,
            "depth": queue.depth,
            "unacked": topics.unacked(queue),
            "consumers": len(queue.consumers),
            "enqueued": stats.enqueued,
            "dequeued": stats.dequeued,
            "redelivered": stats.redelivered,
            "discarded": stats.discarded,
            "expired": stats.expired,
            **({"owner": owner} if durable else {}),
        }

    def _message(self, message: Any) -> dict[str, Any]:
        damaged = False
        if message.body is None:  # on disk: read a copy, leave the queue's stub alone
            copy = message.stub()
            damaged = not copy.load(self.broker.store)  # reported; dispatch drops it
            message = copy
        body = message.body or b""
        try:
            text, encoding = body.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            text, encoding = base64.b64encode(body).decode(), "base64"
        return {
            "message_id": message.id, "destination": message.address.text, "priority": message.priority,
            "timestamp": message.timestamp, "expires": message.expires, "persistent": message.persistent,
            "redelivered": message.redelivered, "headers": message.headers or {}, "body": text,
            "body_encoding": encoding, **({"damaged": True} if damaged else {}),
        }

    def _connection(self, conn_id: str, connection: Any) -> dict[str, Any]:
        session = connection.session
        client = getattr(session, "client", None)
        return {
            "id": conn_id, "protocol": connection.protocol, "peer": connection.peer,
            "opened": connection.opened_ms, "client_id": getattr(client, "client_id", None),
            "subscriptions": len(client.subscriptions) if client is not None else 0,
            "bytes_in": connection.bytes_in, "bytes_out": session.outbox.sent_bytes,
        }
