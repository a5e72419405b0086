"""Users and the authentication hook every protocol's CONNECT goes through
(STOMP login/passcode, MQTT username/password, or a TLS client certificate);
the admin API checks the same kind of hash.  With no user defined the broker
admits anonymous clients from this machine only (a loopback source address),
as Mosquitto 2 does: anyone else must log in, or ``[auth] anonymous = "true"``
must open the broker to every address on purpose.  As soon as a user is
defined anonymous access is off unless the config turns it back on.

Wrong credentials cost the caller, not the broker: after a few failures from
one address within a window, further attempts from it are refused before any
password hash is computed (PBKDF2 is slow on purpose; the app computes it in a
worker thread, see VerificationPending).  Each door (messaging, admin) has its
own verifier, a bounded budget of threads and queued checks, so guessing at
one door never delays a login at the other.
The same gate refuses connections the server admitted past a limit, so each
protocol can say so the way it says "no" to a login."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
import ipaddress
import secrets
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from core.authorization import ANONYMOUS_PRINCIPAL, Principal, parse_entries

HASH_SCHEME = "pbkdf2_sha256"
HASH_ITERATIONS = 200_000
ANONYMOUS = ("auto", "true", "false")
# Verified credentials remembered (as digests), so a reconnecting client does
# not cost a PBKDF2 run each time.
VERIFIED_CACHE = 4096
# Addresses whose failed logins are remembered at once; the oldest is
# forgotten first, so a spray from many addresses cannot grow the table.
TRACKED_ADDRESSES = 10_000


# Password checks waiting for or running in a worker thread from one address
# at one door; more attempts from it meanwhile are refused (a burst cannot
# queue hashes).
PENDING_PER_ADDRESS = 4
# The doors a lockout and a password budget are kept for: a locked-out
# messaging address can still reach the console (and the other way round),
# each with its own count, and each door's checks queue for its own threads.
MESSAGING, ADMIN = "messaging", "admin"
# A door's verifier: runs verify_password(passcode, stored) off the loop and
# then calls back with the answer; False when that door's queue is full.
Verifier = Callable[[str, str, Callable[[bool], None]], bool]


# What an anonymous client from another machine is told by a broker that
# admits anonymous clients from this one only.
REMOTE_ANONYMOUS = ("anonymous access from remote addresses is off (the broker has no users): log in, "
                    'or set [auth] anonymous = "true" to admit anonymous clients from any address')


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a peer's address as the socket gave it) is this
    machine's loopback: 127.0.0.0/8, ::1, or either written as an
    IPv4-mapped IPv6 address (``::ffff:127.0.0.1``, what a dual-stack socket
    reports for an IPv4 peer).  Anything else, a name or "unknown" included,
    is remote.  Only the socket's own peer counts: a WebSocket's
    X-Forwarded-For is the client's to write, and TLS changes nothing."""
    try:
        address = ipaddress.ip_address(host.partition("%")[0])  # a link-local address's zone
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


class VerificationPending(Exception):
    """The credentials need a password hash computed off the event loop.
    ``start(done)`` queues that work and calls ``done()`` once the answer is
    known (a retried admit then has it); it returns False when too much is
    queued already."""

    def __init__(self, start: Callable[[Callable[[], None]], bool]) -> None:
        super().__init__("password check pending")
        self.start = start


class AccessDenied(Exception):
    """A CONNECT refused; ``reason`` is what the client is told.  ``kind`` is
    ``credentials`` (wrong or missing), ``rate_limited`` (too many failures
    from its address), ``unavailable`` (a connection limit) or
    ``remote_anonymous`` (no login, from another machine, on a broker that
    admits anonymous clients from this one only)."""

    def __init__(self, reason: str, kind: str = "credentials") -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


def spent_door(login: str | None, passcode: str | None) -> Principal:
    """What a session keeps as its door once its CONNECT got in (the codec
    refuses a second one before it): the real one, with the transport it
    holds, is let go rather than kept for the connection's life."""
    raise AccessDenied("already connected")


@dataclasses.dataclass(frozen=True, slots=True)
class Transport:
    """What the server knows about a connection before it speaks."""

    peer: str = "unknown"  # host:port
    host: str = "unknown"
    tls: bool = False
    certificate_user: str | None = None  # a verified client certificate's user
    refused: str | None = None  # why the server will not serve it (a limit)


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


def usable_hash(stored: str) -> bool:
    """Whether some password can match ``stored``: a hash this module could
    have made.  A placeholder (deploy/admin-users.toml's
    ``pbkdf2_sha256$REPLACE-ME``) cannot, and admits nobody."""
    try:
        scheme, iterations, salt, digest = stored.split("$")
        return (scheme == HASH_SCHEME and int(iterations) > 0 and bool(base64.b64decode(salt, validate=True))
                and len(base64.b64decode(digest, validate=True)) == hashlib.sha256().digest_size)
    except (ValueError, binascii.Error):
        return False


@dataclasses.dataclass(frozen=True)
class AuthSettings:
    # [{name = "app", password_hash = "pbkdf2_sha256$..."}] (gateway passwd makes one)
    users: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # and optional groups = ["producers"], named by [[auth.acl]] grants.
    # A TOML file with more of the same `users` list (a Kubernetes Secret),
    # or GATEWAY_USERS_FILE in the environment; read with the config (and on reload).
    users_file: str = ""
    # auto: anonymous clients are let in only while no user is defined, and
    # then only from this machine (loopback); true: from anywhere; false: never.
    anonymous: str = "auto"
    # [{destination = "/queue/orders.>", read = ["consumers"], write = ["app"],
    #   admin = ["admins"]}]: see core/authorization.py.  Empty: no checks.
    acl: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # Failed logins from one address within the window before its further
    # attempts are refused unchecked until the window has passed.
    max_failed_logins: int = 5
    failed_login_window_s: float = 60.0

    @property
    def groups(self) -> frozenset[str]:
        """The declared groups: those users are in, and "anonymous" (anonymous clients')."""
        return frozenset(g for entry in self.users for g in entry.get("groups", ())) | {ANONYMOUS_PRINCIPAL.name}

    def __post_init__(self) -> None:
        if self.anonymous not in ANONYMOUS:
            raise ValueError(f"auth.anonymous must be one of {', '.join(ANONYMOUS)}, not {self.anonymous!r}")
        for entry in self.users:
            if not isinstance(entry, dict) or not entry.get("name") or not entry.get("password_hash"):
                raise ValueError("auth.users entries need a name and a password_hash")
            groups = entry.get("groups", [])
            if not isinstance(groups, list) or not all(isinstance(g, str) and g for g in groups):
                raise ValueError(f"auth.users {entry['name']!r}: groups must be a list of names")
        users = {entry["name"] for entry in self.users}
        clash = sorted(users & self.groups)
        if clash:
            # Which of the two a plain name in the map means would be a guess.
            raise ValueError(f"auth: {', '.join(map(repr, clash))} is both a user and a group; rename one")
        parse_entries(self.acl, groups=self.groups)
        if self.max_failed_logins < 1 or self.failed_login_window_s <= 0:
            raise ValueError("auth.max_failed_logins must be >= 1 and auth.failed_login_window_s > 0")


class Gatekeeper:
    """Admits a CONNECT: a principal for the core, or :class:`AccessDenied`.

    Every password check passes here, whatever the door (STOMP, MQTT, their
    WebSockets, the admin API's Basic auth): one lockout per address and
    door, one bound on checks in progress per address and door, one cache of
    answers, and per door one verifier whose worker threads are the only ones
    hashing for it (``verifiers``): a flood of wrong admin passwords fills
    the admin door's queue, never the one a STOMP or MQTT login waits in.  An
    unknown user costs a hash like a known one (against a dummy with the
    same parameters), so how long a refusal takes says nothing about who
    exists."""

    def __init__(self, settings: AuthSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self._verified: set[tuple[str, str, bytes]] = set()
        self._rejected: set[tuple[str, str, bytes]] = set()  # answers waiting for their retried check
        self._generation = 0  # reconfigurations so far: an answer about older users is not remembered
        self.reconfigure(settings)
        self._pending: dict[tuple[str, str], int] = {}  # (door, host) -> checks queued or running
        # door -> its verifier, each with its own threads and queue (set by
        # the app, gateway/tasks.py); a door without one verifies inline.
        self.verifiers: dict[str, Verifier] = {}
        self._clock = clock
        self.refused: dict[str, int] = {}  # CONNECTs refused, by AccessDenied.kind
        # (door, host) -> (window start, failures)
        self._failures: OrderedDict[tuple[str, str], tuple[float, int]] = OrderedDict()

    def reconfigure(self, settings: AuthSettings) -> None:
        """Take ``settings``' users for the logins from now on (a reload);
        the remembered answers go, so a removed user or a changed password
        admits nobody, while the failure counts and checks in progress stay."""
        self.settings = settings
        self.users = {entry["name"]: entry["password_hash"] for entry in settings.users}
        self.groups = {entry["name"]: frozenset(entry.get("groups", ())) for entry in settings.users}
        self.anonymous = settings.anonymous == "true" or (settings.anonymous == "auto" and not self.users)
        # "auto" without users is the unconfigured broker: open to this
        # machine's clients (development, `make run`), closed to the network
        # until someone asks for that.
        self.anonymous_remote = settings.anonymous == "true"
        self.dummy = dummy_hash(self.users.values())
        self._verified.clear()
        self._rejected.clear()
        self._generation += 1

    @property
    def failing_addresses(self) -> int:
        """How many (door, address) pairs have failed logins being counted:
        never more than ``TRACKED_ADDRESSES``, however many addresses try."""
        return len(self._failures)

    def admit(self, login: str | None, passcode: str | None, transport: Transport) -> Principal:
        try:
            return self._admit(login, passcode, transport)
        except AccessDenied as exc:
            self.refused[exc.kind] = self.refused.get(exc.kind, 0) + 1
            raise

    def _admit(self, login: str | None, passcode: str | None, transport: Transport) -> Principal:
        if transport.refused is not None:
            raise AccessDenied(transport.refused, "unavailable")
        if transport.certificate_user is not None:
            # The TLS handshake proved who this is; a login in the CONNECT
            # cannot make it someone else.
            return self.principal(transport.certificate_user)
        host = transport.host
        self.gate(MESSAGING, host)
        if not self.users or login is None:
            # Nobody to check against: whatever a client sends (many send a
            # default login) is let in, as by a broker with no security set up.
            ok = self.anonymous
            if ok and not self.admits_anonymous(host):
                # Not counted as a failed login: no password was tried, and
                # a lockout's reason would hide this one.
                raise AccessDenied(REMOTE_ANONYMOUS, "remote_anonymous")
        else:
            stored = self.users.get(login)
            ok = self.password(MESSAGING, host, login, passcode or "", stored or self.dummy) and stored is not None
        self.answered(MESSAGING, host, ok)
        if not ok:
            raise AccessDenied("authentication failed")
        return ANONYMOUS_PRINCIPAL if login is None or login not in self.users else self.principal(login)

    def principal(self, name: str) -> Principal:
        return Principal(name, self.groups.get(name, frozenset()))

    def admits_anonymous(self, host: str) -> bool:
        """Whether an anonymous client from ``host`` may be connected: at
        CONNECT, and for those already connected when a reload changes the
        users or ``anonymous``."""
        return self.anonymous and (self.anonymous_remote or is_loopback(host))

    def gate(self, door: str, host: str) -> None:
        """Refuse (:class:`AccessDenied`, ``rate_limited``) an address locked
        out at this door, or with too many checks in progress, before any hash."""
        now = self._clock()
        key = (door, host)
        entry = self._failures.get(key)
        if entry is not None and now - entry[0] >= self.settings.failed_login_window_s:
            del self._failures[key]
            entry = None
        if entry is not None and entry[1] >= self.settings.max_failed_logins:
            raise AccessDenied(
                f"too many failed logins from {host}; try again in "
                f"{self.retry_after(door, host)} s",
                "rate_limited",
            )
        if self._pending.get(key, 0) >= PENDING_PER_ADDRESS:
            raise AccessDenied(f"too many logins in progress from {host}", "rate_limited")

    def retry_after(self, door: str, host: str) -> int:
        entry = self._failures.get((door, host))
        if entry is None:
            return 0
        return max(1, round(entry[0] + self.settings.failed_login_window_s - self._clock()))

    def answered(self, door: str, host: str, ok: bool) -> None:
        """Count a failed attempt against the address, or clear it on success."""
        key = (door, host)
        entry = self._failures.get(key)
        if ok:
            if entry is not None:
                del self._failures[key]
            return
        start, count = entry if entry is not None else (self._clock(), 0)
        self._failures[key] = (start, count + 1)
        self._failures.move_to_end(key)
        while len(self._failures) > TRACKED_ADDRESSES:
            self._failures.popitem(last=False)

    def password(self, door: str, host: str, login: str, passcode: str, stored: str) -> bool:
        """Whether ``passcode`` matches ``stored`` (cached per door and user);
        raises :class:`VerificationPending` when that takes a hash and a
        verifier is set.  Call :meth:`gate` first."""
        key = (door, login, hashlib.sha256(passcode.encode()).digest())
        if key in self._verified:
            return True
        if key in self._rejected:
            self._rejected.discard(key)
            return False
        verifier = self.verifiers.get(door)
        if verifier is None:
            ok = verify_password(passcode, stored)
            if ok:
                self._remember(key, True)
            return ok

        generation = self._generation
        pending = (door, host)

        def start(done: Callable[[], None]) -> bool:
            def finished(ok: bool) -> None:
                self._pending[pending] -= 1
                if not self._pending[pending]:
                    del self._pending[pending]
                if generation == self._generation:  # else checked against a hash a reload replaced
                    self._remember(key, ok)
                done()

            if not verifier(passcode, stored, finished):
                return False
            self._pending[pending] = self._pending.get(pending, 0) + 1
            return True

        raise VerificationPending(start)

    def _remember(self, key: tuple[str, str, bytes], ok: bool) -> None:
        cache = self._verified if ok else self._rejected
        if len(cache) >= VERIFIED_CACHE:
            cache.clear()
        cache.add(key)


def dummy_hash(stored: Iterable[str]) -> str:
    """A hash no password matches, with the iteration count most of
    ``stored`` use: checking an unknown user against it costs what checking
    a known one does."""
    counts = Counter(h.split("$")[1] for h in stored if h.count("$") == 3 and h.startswith(HASH_SCHEME + "$"))
    iterations = next((int(n) for n, _ in counts.most_common(1) if n.isdigit()), HASH_ITERATIONS)
    salt, digest = (base64.b64encode(secrets.token_bytes(n)).decode() for n in (16, 32))
    return f"{HASH_SCHEME}${iterations}${salt}${digest}"
