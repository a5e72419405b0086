"""Who may use the admin port: HTTP basic auth against the admin users, each
password checked through the broker's one gate (per-address lockout, hashing
off the event loop, a cache of answers).  Shared by the broker's API and a
backup's (gateway/admin/standby.py), so both ask the same way."""

from __future__ import annotations

import base64
import binascii

from gateway.admin.http import Request, Response, error, ok as answer
from gateway.auth import ADMIN, AccessDenied, AuthSettings, Gatekeeper, dummy_hash


# The header the console's scripts send with each request.
CONSOLE_MARK = "x-requested-with"
NO_USERS = ("no admin users are configured: set GATEWAY_ADMIN_USER and GATEWAY_ADMIN_PASSWORD and restart, "
            "or add one to [admin] users (gateway passwd --name NAME --role write prints the entry) or a users "
            "file and send SIGHUP")


def basic(header: str) -> tuple[str | None, str]:
    """(user, password) from a Basic Authorization header; (None, "") if it is none."""
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None, ""
    try:
        name, _, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None, ""
    return name, password


# What each role may do, in order: each covers the ones before it (api.ROLES).
RANKS = {"read": 0, "browse": 1, "write": 2}


class Access:
    """``users``: name -> (password hash, role read|browse|write)."""

    def __init__(self, users: dict[str, tuple[str, str]], gate: Gatekeeper | None = None) -> None:
        self.users = users
        self.gate = gate if gate is not None else Gatekeeper(AuthSettings())
        self.dummy = dummy_hash(hashed for hashed, _ in users.values())

    def replace(self, users: dict[str, tuple[str, str]]) -> None:
        """The admin users from a reloaded configuration, for the requests that follow."""
        self.users = users
        self.dummy = dummy_hash(hashed for hashed, _ in users.values())

    def authorize(self, request: Request, need: str) -> Response | None:
        """The caller's role must cover ``need``.  The password check goes
        through the broker's one gate (per-address lockout, bounded hashing
        off the loop): it raises VerificationPending for the admin server to
        wait on, then handle() is called again and finds the answer."""
        if not self.users:
            # The console shows how to make one when it sees no_admin_users.
            return answer({"status": 403, "reason": NO_USERS, "no_admin_users": True}, 403)
        header = request.headers.get("authorization")
        if not header:  # a browser's first request: ask, no failure counted
            return _challenge(request)
        host = request.host
        try:
            self.gate.gate(ADMIN, host)
        except AccessDenied as exc:
            return error(429, exc.reason, **{"Retry-After": str(max(1, self.gate.retry_after(ADMIN, host)))})
        name, password = basic(header)
        entry = self.users.get(name) if name is not None else None
        ok = self.gate.password(ADMIN, host, name or "", password, entry[0] if entry else self.dummy)
        ok = ok and entry is not None
        self.gate.answered(ADMIN, host, ok)
        if not ok or entry is None:
            return _challenge(request, "wrong user or password")
        if RANKS[entry[1]] < RANKS[need]:
            return error(403, NEEDS[need].format(user=name, role=entry[1]))
        request.user, request.role = name or "", entry[1]
        return None


NEEDS = {
    "browse": "reading message contents takes the browse or write role; {user} has {role}",
    "write": "changing things takes the write role; {user} has {role}",
}


def _challenge(request: Request, reason: str = "credentials required") -> Response:
    """401 asking for basic auth; the console's own requests (marked with
    X-Requested-With) get no challenge header, so the browser shows the
    console's login form instead of its own password dialog."""
    if CONSOLE_MARK in request.headers:
        return error(401, reason)
    return error(401, reason, **{"WWW-Authenticate": 'Basic realm="gateway"'})
