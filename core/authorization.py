"""Who may read, write or create which destinations: ActiveMQ's
authorization map.

Entries name a destination pattern (``*`` one segment, ``>`` the rest) and,
per operation, the users and groups granted it.  Grants add up: a principal
may act on a destination if any entry that covers it grants the operation to
the principal's user, one of its groups, or ``*`` (everyone, anonymous
clients included).

Users and groups are kept apart: ``group:ops`` and ``user:ops`` say which is
meant, and a plain ``ops`` is the group when some user is in a group of that
name (ActiveMQ's entries name groups) and the user otherwise.  So a user, or a
certificate whose common name is taken as its user, named ``producers`` never
gets what the ``producers`` group is granted; the auth settings refuse a user
and a group of the same name.  Once any entry exists, anything not granted is denied;
with none, the broker is open, as a fresh ActiveMQ is.

A wildcard subscription is checked as a whole: ``orders.>`` needs an entry
whose pattern covers every name ``orders.>`` can match (``orders.>`` or
``>``), so a grant on ``orders.eu`` alone does not open the wildcard.
Temporary destinations are outside the map: the broker gives them to the
connection that made them (anyone may reply to one).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable

from core import names
from core.names import Address

OPERATIONS = ("read", "write", "admin")
EVERYONE = "*"
ANONYMOUS = "anonymous"
# Decisions a connection remembers, per operation and destination, before
# it starts over (a client touching ever new names cannot grow it further).
DECISION_CACHE = 1024


@dataclasses.dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated (or anonymous) client: its user name and groups."""

    name: str
    groups: frozenset[str] = frozenset()

    @property
    def identities(self) -> frozenset[str]:
        """What grants name: ``user:<name>``, ``group:<group>`` and ``*``."""
        return frozenset(GROUP + group for group in self.groups) | {USER + self.name, EVERYONE}


# Anonymous clients are the user and the (built-in) group "anonymous".
ANONYMOUS_PRINCIPAL = Principal(ANONYMOUS, frozenset({ANONYMOUS}))
USER, GROUP = "user:", "group:"


@dataclasses.dataclass(frozen=True, slots=True)
class AclEntry:
    pattern: Address
    grants: dict[str, frozenset[str]]  # operation -> "user:<name>", "group:<name>" or "*"


def covers(general: tuple[str, ...], specific: tuple[str, ...]) -> bool:
    """Whether every name ``specific`` matches is matched by ``general``
    (both may hold ``*`` and ``>``)."""
    for i, segment in enumerate(general):
        if segment == ">":
            return True
        if i >= len(specific):
            return False
        other = specific[i]
        if other == ">":
            return False  # the rest could be any length; only '>' covers it
        if segment != "*" and (other == "*" or segment != other):
            return False
    return len(general) == len(specific)


class Authorizer:
    """The configured authorization map, queried by the core."""

    def __init__(self, entries: Iterable[AclEntry]) -> None:
        self.entries = list(entries)

    def allows(self, principal: Principal, operation: str, address: Address) -> bool:
        identities = principal.identities
        for entry in self.entries:
            if (
                entry.pattern.kind is address.kind
                and not identities.isdisjoint(entry.grants.get(operation, ()))
                and covers(entry.pattern.segments, address.segments)
            ):
                return True
        return False


def grantee(name: str, groups: Collection[str] | None) -> frozenset[str]:
    """What a name in an entry stands for.  ``groups``: the declared groups
    (``anonymous`` is always one); None (no user list known, as in tools and
    tests): a plain name stands for the user and the group."""
    if name == EVERYONE or name.startswith((USER, GROUP)):
        return frozenset({name})
    if groups is None:
        return frozenset({USER + name, GROUP + name})
    return frozenset({GROUP + name if name in groups or name == ANONYMOUS else USER + name})


def parse_entries(
    raw: list[dict[str, object]], where: str = "auth.acl", groups: Collection[str] | None = None
) -> list[AclEntry]:
    """Build entries from ``[[auth.acl]]`` tables, naming any mistake."""
    entries = []
    for i, table in enumerate(raw):
        if not isinstance(table, dict):
            raise ValueError(f"{where}[{i}] must be a table")
        destination = table.get("destination")
        if not isinstance(destination, str):
            raise ValueError(f"{where}[{i}] needs a destination pattern, e.g. \"/queue/orders.>\"")
        address = names.parse(destination)
        if isinstance(address, str):
            raise ValueError(f"{where}[{i}].destination: {address}")
        if address.is_temporary:
            raise ValueError(f"{where}[{i}]: temporary destinations belong to their connection and take no entries")
        grants = {}
        for key, value in table.items():
            if key == "destination":
                continue
            if key not in OPERATIONS:
                raise ValueError(f"{where}[{i}]: unknown key {key!r} (expected destination, {', '.join(OPERATIONS)})")
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(
                isinstance(name, str) and name and name not in (USER, GROUP) for name in value
            ):
                raise ValueError(f"{where}[{i}].{key} must be a list of user or group names")
            grants[key] = frozenset().union(*(grantee(name, groups) for name in value))
        entries.append(AclEntry(address, grants))
    return entries
