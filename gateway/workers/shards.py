"""Which shard owns a piece of state (pure: no I/O, no clock).

Every piece of state has exactly one owner (docs/design/workers.md).  A *key*
names the state: a destination's name (a queue's messages and consumers; a
topic's retained value, archive and fan-out), a client id (its MQTT session
and its durable subscriptions) or a shared-subscription group.  A key hashes to
one of :data:`VIRTUAL_SHARDS` virtual shards, and the :class:`ShardMap` gives
each virtual shard its shard (a worker process in step one, an HA group in
step two, so that step two swaps only the map and the transport).

The hash is CRC-32 of the key's UTF-8 bytes, the same in every process and
every Python (never ``hash()``, salted per process).  A tag in the key, the
text between its first ``{`` and the next ``}`` when not empty, is hashed in
place of the whole key, as Redis Cluster's hash tags are: ``/queue/{orders}.in``
and ``/queue/{orders}.out`` share a shard, so a transaction over both is
local.  A queue and a topic of the same name share a key (the name without
its kind): a user who names them alike usually means them together.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from typing import Any

VIRTUAL_SHARDS = 256  # fixed for the life of a data folder: the map moves these, never rehashes
MAX_SHARDS = VIRTUAL_SHARDS  # a shard owns at least one virtual shard
KINDS = ("/queue/", "/topic/", "/temp-queue/", "/temp-topic/")
MAX_MAP_BYTES = 16 * 1024  # a map is a version, a count and 256 small numbers


class MapError(ValueError):
    """A map that does not parse or does not hold together; the message says why."""


def hashed_part(key: str) -> str:
    """What of ``key`` is hashed: its tag if it has a non-empty one, else all of it."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1:end]
    return key


def virtual_shard(key: str) -> int:
    return zlib.crc32(hashed_part(key).encode("utf-8", "surrogatepass")) % VIRTUAL_SHARDS


def destination_key(text: str) -> str:
    """The key of a destination's state, from its text (``/queue/orders`` ->
    ``orders``): the name without its kind."""
    for kind in KINDS:
        if text.startswith(kind):
            return text[len(kind):]
    return text


def client_key(client_id: str) -> str:
    """The key of a client id's state (an MQTT session, durable
    subscriptions).  Prefixed, so a client id never shares a key with a
    destination by accident; a tag in it still places it on purpose."""
    return f"client:{client_id}"


def group_key(group: str) -> str:
    """The key of a shared-subscription group."""
    return f"group:{group}"


@dataclasses.dataclass(frozen=True, slots=True)
class ShardMap:
    """Virtual shard -> shard, with the version compare-and-set moves it by."""

    version: int
    shards: int
    assignment: tuple[int, ...]

    def __post_init__(self) -> None:
        if type(self.version) is not int or self.version < 1:
            raise MapError(f"version must be an integer >= 1: {self.version!r:.40}")
        if type(self.shards) is not int or not 1 <= self.shards <= MAX_SHARDS:
            raise MapError(f"shards must be an integer in [1, {MAX_SHARDS}]: {self.shards!r:.40}")
        if len(self.assignment) != VIRTUAL_SHARDS:
            raise MapError(f"the map assigns {len(self.assignment)} virtual shards, not {VIRTUAL_SHARDS}")
        if any(type(s) is not int or not 0 <= s < self.shards for s in self.assignment):
            raise MapError(f"every virtual shard must go to a shard in [0, {self.shards})")
        if len(set(self.assignment)) != self.shards:
            raise MapError("every shard must own at least one virtual shard")

    @classmethod
    def initial(cls, shards: int) -> ShardMap:
        """The first map of a folder: virtual shard v to shard v mod ``shards``
        (as even as 256 allows)."""
        if type(shards) is not int or not 1 <= shards <= MAX_SHARDS:
            raise MapError(f"shards must be an integer in [1, {MAX_SHARDS}]: {shards!r:.40}")
        return cls(1, shards, tuple(v % shards for v in range(VIRTUAL_SHARDS)))

    def owner(self, key: str) -> int:
        """The shard that owns ``key``."""
        return self.assignment[virtual_shard(key)]

    def moved(self, vshard: int, to: int, *, expected_version: int) -> ShardMap:
        """The map with virtual shard ``vshard`` given to shard ``to``, if this
        is still version ``expected_version`` (compare-and-set: a writer that
        read an older map loses, and reads again)."""
        if expected_version != self.version:
            raise MapError(f"the map is at version {self.version}, not {expected_version}")
        if not 0 <= vshard < VIRTUAL_SHARDS:
            raise MapError(f"no virtual shard {vshard}")
        assignment = list(self.assignment)
        assignment[vshard] = to
        return ShardMap(self.version + 1, self.shards, tuple(assignment))

    def to_json(self) -> bytes:
        return json.dumps({"version": self.version, "shards": self.shards, "assignment": list(self.assignment)},
                          separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ShardMap:
        """The map in ``data``; :class:`MapError` saying why when it is not one."""
        if len(data) > MAX_MAP_BYTES:
            raise MapError(f"the map is {len(data)} bytes, over {MAX_MAP_BYTES}")
        try:
            fields: Any = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise MapError(f"the map is not JSON: {exc}") from None
        if not isinstance(fields, dict) or not isinstance(fields.get("assignment"), list):
            raise MapError("the map is not an object with an assignment list")
        version, shards = fields.get("version"), fields.get("shards")
        if not isinstance(version, int) or not isinstance(shards, int):
            raise MapError(f"version and shards must be integers: {version!r:.40}, {shards!r:.40}")
        return cls(version, shards, tuple(fields["assignment"]))
