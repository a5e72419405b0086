"""Users and the authentication hook every protocol's CONNECT goes through
(STOMP login/passcode, MQTT username/password); the admin API checks the
same kind of hash.  With no user defined the broker admits anyone, as a fresh
ActiveMQ does; as soon as one is defined anonymous access is off unless the
config turns it back on."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
import secrets
from typing import Any, Protocol

HASH_SCHEME = "pbkdf2_sha256"
HASH_ITERATIONS = 200_000
ANONYMOUS = ("auto", "true", "false")
# Verified credentials remembered (as digests), so a reconnecting client does
# not cost a PBKDF2 run each time.
VERIFIED_CACHE = 4096


class Authenticator(Protocol):
    def __call__(self, login: str | None, passcode: str | None) -> bool: ...


def allow_anonymous(login: str | None, passcode: str | None) -> bool:
    return True


def hash_password(password: str, *, iterations: int = HASH_ITERATIONS) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    return f"{HASH_SCHEME}${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def verify_password(password: str, stored: str) -> bool:
    try:
        scheme, iterations, salt, digest = stored.split("$")
        if scheme != HASH_SCHEME:
            return False
        expected = base64.b64decode(digest)
        actual = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(salt), int(iterations))
    except (ValueError, binascii.Error):
        return False
    return hmac.compare_digest(actual, expected)


@dataclasses.dataclass(frozen=True)
class AuthSettings:
    # [{name = "app", password_hash = "pbkdf2_sha256$..."}] (gateway passwd makes one)
    users: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # auto: anonymous clients are let in only while no user is defined.
    anonymous: str = "auto"

    def __post_init__(self) -> None:
        if self.anonymous not in ANONYMOUS:
            raise ValueError(f"auth.anonymous must be one of {', '.join(ANONYMOUS)}, not {self.anonymous!r}")
        for entry in self.users:
            if not isinstance(entry, dict) or not entry.get("name") or not entry.get("password_hash"):
                raise ValueError("auth.users entries need a name and a password_hash")


class UserAuthenticator:
    """Checks CONNECT credentials against the configured users."""

    def __init__(self, settings: AuthSettings) -> None:
        self.users = {entry["name"]: entry["password_hash"] for entry in settings.users}
        self.anonymous = settings.anonymous == "true" or (settings.anonymous == "auto" and not self.users)
        self._verified: set[tuple[str, bytes]] = set()

    def __call__(self, login: str | None, passcode: str | None) -> bool:
        if not self.users:
            # Nobody to check against: whatever a client sends (many send a
            # default login) is let in, as by a broker with no security set up.
            return self.anonymous
        if login is None:
            return self.anonymous
        stored = self.users.get(login)
        if stored is None:
            return False
        key = (login, hashlib.sha256((passcode or "").encode()).digest())
        if key in self._verified:
            return True
        if not verify_password(passcode or "", stored):
            return False
        if len(self._verified) >= VERIFIED_CACHE:
            self._verified.clear()
        self._verified.add(key)
        return True
