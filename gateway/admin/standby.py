"""The admin port of a node that serves no clients (an HA backup).

It answers the probes (``/healthz`` and ``/livez`` 200, ``/readyz`` 503 with
its state; on the probe port too) and,
behind the same basic auth as a primary's API (read role), two reads:
``/metrics`` (what a backup has to report: its HA state, epoch, applied LSN)
and ``/api/v1/cluster`` (the group as this node sees it), so an operator
looking at any pod sees the cluster; the console's page and files and
``/api/v1/whoami``, so its Cluster page works here too.  Nothing else: no
broker runs here, so every other path answers 503 saying so."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from gateway.admin import console
from gateway.admin.access import Access
from gateway.admin.cluster import ClusterBody, Source
from gateway.admin.http import Request, Response, error, ok
from gateway.auth import Gatekeeper

CONTENT_METRICS = "text/plain; version=0.0.4; charset=utf-8"


class StandbyApi:
    """``limits``: what the admin port's connection slots read of a server
    (its ``max_connections_per_address``)."""

    def __init__(self, source: Source, *, users: dict[str, tuple[str, str]], metrics: Callable[[], str],
                 not_ready: Callable[[], str], limits: Any, gate: Gatekeeper | None = None) -> None:
        self.source = source
        self.access = Access(users, gate)
        self.metrics = metrics
        self.not_ready = not_ready  # why: the node's state
        self.limits = limits

    @property
    def server(self) -> StandbyApi:
        return self  # AdminSlots reads server.limits

    @property
    def gate(self) -> Gatekeeper:
        return self.access.gate

    def probe(self, path: str) -> Response | None:
        """A probe's answer (here and on the probe port), or None."""
        if path in ("/healthz", "/livez"):
            return Response(200, b"ok\n", "text/plain")
        if path == "/readyz":
            return Response(503, f"not ready: {self.not_ready()}\n".encode(), "text/plain")
        return None

    def handle(self, request: Request) -> Response:
        path = urlsplit(request.target).path
        probed = self.probe(path)
        if probed is not None:
            return probed
        page = console.serve(request.method, path, request.headers)
        if page is not None:
            return page
        if path not in ("/metrics", "/api/v1/cluster", "/api/v1/whoami"):
            return error(503, "a backup serves only /healthz, /readyz, /metrics, /api/v1/cluster and the console's "
                              "Cluster page")
        if request.method != "GET":
            return error(405, f"{request.method} is not allowed here")
        denied = self.access.authorize(request, "read")
        if denied is not None:
            return denied
        if path == "/metrics":
            return Response(200, self.metrics().encode(), CONTENT_METRICS)
        if path == "/api/v1/whoami":
            return ok({"user": request.user, "role": request.role})
        return Response(200, b"", stream=ClusterBody(self.source))
