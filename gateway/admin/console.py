"""The web console's files: a page, its scripts and its styles, hand-written
and shipped in the package (gateway/admin/static/), so the console needs no
build step and no network beyond the broker itself.

The page and its files hold no data, so they are served to anyone: a
browser that asks for ``/`` gets the page, which shows its own login form
and sends the credentials (HTTP basic) with each API request it makes.  A
client that does not ask for HTML (curl, scripts) keeps the API's answers:
401 with a challenge, or 403 without admin users."""

from __future__ import annotations

import functools
from importlib import resources

from gateway.admin.http import Response, error

PREFIX = "/console/"
# The page runs only its own files (no inline script, nothing from elsewhere)
# and talks only to this origin: an injected string cannot run as script.
PAGE_POLICY = ("Content-Security-Policy",
               "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
               "form-action 'none'; base-uri 'none'; frame-ancestors 'none'")
TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".html": "text/html; charset=utf-8",
}


@functools.cache
def _read(name: str) -> bytes | None:
    """A file of the console, read once; None if there is no such file."""
    if "/" in name or name.startswith(".") or not any(name.endswith(suffix) for suffix in TYPES):
        return None
    path = resources.files("gateway.admin").joinpath("static", name)
    try:
        return path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None


def page() -> bytes:
    body = _read("index.html")
    assert body is not None, "gateway/admin/static/index.html is missing from the package"
    return body


def serve(method: str, path: str, headers: dict[str, str]) -> Response | None:
    """The console's answer to this request, or None if it is not the console's."""
    if method != "GET":
        return None
    if path == "/" and "text/html" in headers.get("accept", ""):
        return Response(200, page(), TYPES[".html"], [PAGE_POLICY])
    if not path.startswith(PREFIX):
        return None
    name = path[len(PREFIX) :]
    body = _read(name)
    if body is None:
        return error(404, f"no console file {name[:100]!r}")
    return Response(200, body, TYPES[name[name.rindex(".") :]])
