"""Topic subscriptions indexed by name segment, so a publish visits only the
branches that can match (the shape of mosquitto's ``subs.c``), with a bounded
cache of results per topic name for the common case of repeated publishes."""

from __future__ import annotations

from typing import Generic, TypeVar

from core.names import ANY_REST, ANY_SEGMENT

T = TypeVar("T")

MATCH_CACHE_ENTRIES = 4096


class _Node(Generic[T]):
    __slots__ = ("children", "subscribers")

    def __init__(self) -> None:
        self.children: dict[str, _Node[T]] = {}
        self.subscribers: dict[T, None] = {}  # insertion-ordered set


class SubscriptionTree(Generic[T]):
    """Maps subscription patterns to subscribers; answers "who gets topic X"."""

    def __init__(self) -> None:
        self._root: _Node[T] = _Node()
        self._cache: dict[tuple[str, ...], tuple[T, ...]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def node_count(self) -> int:
        """Nodes below the root, what the tree holds in memory: every one
        leads to a subscriber (removals prune the rest), so it is 0 once all
        are gone.  A walk of the tree: for tests and statistics, not publishes."""
        count, stack = 0, list(self._root.children.values())
        while stack:
            node = stack.pop()
            count += 1
            stack.extend(node.children.values())
        return count

    @property
    def cached_names(self) -> int:
        """Topic names whose match result is cached (at most ``MATCH_CACHE_ENTRIES``)."""
        return len(self._cache)

    def add(self, pattern: tuple[str, ...], subscriber: T) -> None:
        node = self._root
        for segment in pattern:
            child = node.children.get(segment)
            if child is None:
                child = node.children[segment] = _Node()
            node = child
        if subscriber not in node.subscribers:
            node.subscribers[subscriber] = None
            self._count += 1
        self._cache.clear()

    def remove(self, pattern: tuple[str, ...], subscriber: T) -> None:
        path = [self._root]
        for segment in pattern:
            child = path[-1].children.get(segment)
            if child is None:
                return
            path.append(child)
        if path[-1].subscribers.pop(subscriber, 0) is None:
            self._count -= 1
        # Prune empty branches so the tree does not grow with churn.
        for depth in range(len(pattern), 0, -1):
            node = path[depth]
            if node.subscribers or node.children:
                break
            del path[depth - 1].children[pattern[depth - 1]]
        self._cache.clear()

    def match(self, name: tuple[str, ...]) -> tuple[T, ...]:
        cached = self._cache.get(name)
        if cached is not None:
            return cached
        out: list[T] = []
        self._collect(self._root, name, 0, out)
        result = tuple(dict.fromkeys(out))
        if len(self._cache) >= MATCH_CACHE_ENTRIES:
            self._cache.clear()
        self._cache[name] = result
        return result

    def _collect(self, node: _Node[T], name: tuple[str, ...], i: int, out: list[T]) -> None:
        if i == 0 and name and name[0].startswith("$"):
            # System topics ($SYS/...) are matched only by patterns that name
            # their first level: no root wildcard reaches them [MQTT-4.7.2-1].
            exact = node.children.get(name[0])
            if exact is not None:
                self._collect(exact, name, 1, out)
            return
        rest = node.children.get(ANY_REST)
        if rest is not None:
            out.extend(rest.subscribers)  # '>' matches zero or more remaining segments
        if i == len(name):
            out.extend(node.subscribers)
            return
        exact = node.children.get(name[i])
        if exact is not None:
            self._collect(exact, name, i + 1, out)
        one = node.children.get(ANY_SEGMENT)
        if one is not None:
            self._collect(one, name, i + 1, out)
