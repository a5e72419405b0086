"""Destination names and the subscription tree that matches topic names to patterns."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core import matching, names
from core.matching import SubscriptionTree
from core.messages import Message
from core.names import Address, Kind
from core.retained import RetainedMessages

# -- names.parse ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind", "segments", "is_queue", "is_temporary", "is_pattern"),
    [
        ("/queue/a", Kind.QUEUE, ("a",), True, False, False),
        ("/queue/orders.eu.fr", Kind.QUEUE, ("orders", "eu", "fr"), True, False, False),
        ("/topic/a.b", Kind.TOPIC, ("a", "b"), False, False, False),
        ("/temp-queue/reply-1", Kind.TEMP_QUEUE, ("reply-1",), True, True, False),
        ("/temp-topic/t", Kind.TEMP_TOPIC, ("t",), False, True, False),
        ("/topic/a.*.c", Kind.TOPIC, ("a", "*", "c"), False, False, True),
        ("/topic/a.>", Kind.TOPIC, ("a", ">"), False, False, True),
        ("/topic/>", Kind.TOPIC, (">",), False, False, True),
        ("/topic/*", Kind.TOPIC, ("*",), False, False, True),
        ("/temp-topic/*.>", Kind.TEMP_TOPIC, ("*", ">"), False, True, True),
        ("/queue/*", Kind.QUEUE, ("*",), True, False, True),  # parses; the broker refuses it
        ("/queue/caf\u00e9 au lait", Kind.QUEUE, ("caf\u00e9 au lait",), True, False, False),
        ("/queue/a/b:c", Kind.QUEUE, ("a/b:c",), True, False, False),
    ],
)
def test_parse_valid(
    text: str, kind: Kind, segments: tuple[str, ...], is_queue: bool, is_temporary: bool, is_pattern: bool
) -> None:
    address = names.parse(text)
    assert isinstance(address, Address)
    assert address.kind is kind
    assert address.name == text[len(kind.value) :]
    assert address.segments == segments
    assert (address.is_queue, address.is_temporary, address.is_pattern) == (is_queue, is_temporary, is_pattern)
    assert address.text == str(address) == text
    assert names.parse(text) is address  # interned
    assert address == Address(kind, address.name) and hash(address) == hash(Address(kind, address.name))
    assert address != text


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("queue/a", "must start with"),
        ("/queues/a", "must start with"),
        ("/QUEUE/a", "must start with"),
        ("a", "must start with"),
        ("", "must start with"),
        ("/queue", "must start with"),
        ("/queue/", "empty destination name"),
        ("/topic/", "empty destination name"),
        ("/queue/a..b", "empty segment"),
        ("/queue/.a", "empty segment"),
        ("/queue/a.", "empty segment"),
        ("/topic/a*", "whole segments"),
        ("/topic/*a.b", "whole segments"),
        ("/topic/a.b>", "whole segments"),
        ("/topic/**", "whole segments"),
        ("/topic/>>", "whole segments"),
        ("/topic/>.a", "last segment"),
        ("/topic/a.>.b", "last segment"),
        ("/topic/a\x00b", "control character"),
        ("/topic/a\nb", "control character"),
        ("/topic/\x1f", "control character"),
        ("/topic/a\x7f", "control character"),
        ("/queue/" + "x" * (names.MAX_NAME_CHARS + 1), "longer than"),
    ],
)
def test_parse_invalid(text: str, reason: str) -> None:
    result = names.parse(text)
    assert isinstance(result, str)
    assert reason in result


def test_name_length_limit_is_inclusive() -> None:
    assert isinstance(names.parse("/queue/" + "x" * names.MAX_NAME_CHARS), Address)


def test_topic_builds_a_topic_address() -> None:
    address = names.topic("a.b")
    assert isinstance(address, Address)
    assert address is names.parse("/topic/a.b")
    assert isinstance(names.topic("a..b"), str)


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        ("a.b", "a.b", True),
        ("a.b", "a.c", False),
        ("a.b", "a", False),
        ("a", "a.b", False),
        ("a.*", "a.b", True),
        ("a.*", "a", False),
        ("a.*", "a.b.c", False),
        ("*.b", "x.b", True),
        ("*", "a", True),
        ("*.*", "a", False),
        ("a.>", "a", True),  # '>' matches zero remaining segments (MQTT a/#)
        ("a.>", "a.b", True),
        ("a.>", "a.b.c.d", True),
        ("a.>", "b.a", False),
        (">", "a", True),
        (">", "a.b.c", True),
        ("*.>", "a", True),
        ("a.*.>", "a", False),
        ("a.*.>", "a.b", True),
        ("a.*.c", "a.b.c", True),
        ("a.*.c", "a.b.d", False),
    ],
)
def test_matches(pattern: str, name: str, expected: bool) -> None:
    assert names.matches(tuple(pattern.split(".")), tuple(name.split("."))) is expected


# -- SubscriptionTree --------------------------------------------------------


def seg(text: str) -> tuple[str, ...]:
    return tuple(text.split("."))


def match(tree: SubscriptionTree[str], name: str) -> set[str]:
    found = tree.match(seg(name))
    assert len(found) == len(set(found)), "duplicates"
    return set(found)


def test_exact_and_wildcard_matches() -> None:
    tree: SubscriptionTree[str] = SubscriptionTree()
    tree.add(seg("a.b"), "exact")
    tree.add(seg("a.*"), "star")
    tree.add(seg("a.>"), "rest")
    tree.add(seg(">"), "all")
    tree.add(seg("*.b.c"), "star-b-c")
    assert match(tree, "a") == {"rest", "all"}
    assert match(tree, "a.b") == {"exact", "star", "rest", "all"}
    assert match(tree, "a.c") == {"star", "rest", "all"}
    assert match(tree, "a.b.c") == {"rest", "all", "star-b-c"}
    assert match(tree, "x.b.c") == {"all", "star-b-c"}
    assert match(tree, "x") == {"all"}
    assert len(tree) == 5


def test_one_subscriber_matched_by_several_patterns_appears_once() -> None:
    tree: SubscriptionTree[str] = SubscriptionTree()
    for pattern in ("a.b", "a.*", "*.b", "a.>", ">"):
        tree.add(seg(pattern), "s")
    assert tree.match(seg("a.b")) == ("s",)
    assert len(tree) == 5


def test_adding_twice_is_idempotent() -> None:
    tree: SubscriptionTree[str] = SubscriptionTree()
    tree.add(seg("a.b"), "s")
    tree.add(seg("a.b"), "s")
    assert len(tree) == 1
    tree.remove(seg("a.b"), "s")
    assert len(tree) == 0
    assert tree.match(seg("a.b")) == ()


def test_remove_only_what_was_added() -> None:
    tree: SubscriptionTree[str] = SubscriptionTree()
    tree.add(seg("a.b"), "s1")
    tree.add(seg("a.b"), "s2")
    tree.remove(seg("a.b"), "nobody")
    tree.remove(seg("a.c"), "s1")
    tree.remove(seg("a.b.c"), "s1")
    assert len(tree) == 2
    assert match(tree, "a.b") == {"s1", "s2"}
    tree.remove(seg("a.b"), "s1")
    assert match(tree, "a.b") == {"s2"}
    assert len(tree) == 1


def test_remove_prunes_empty_branches_only() -> None:
    tree: SubscriptionTree[str] = SubscriptionTree()
    tree.add(seg("a.b"), "s1")
    tree.add(seg("a.b.c.d"), "s2")
    tree.add(seg("x.>"), "s3")
    assert tree.node_count() == 6  # a, b, c, d, x, >
    tree.remove(seg("a.b.c.d"), "s2")
    # a.b keeps its subscriber; the c.d branch under it is gone (a, b, x, > are
    # left: the matches below need each of them).
    assert tree.node_count() == 4
    assert match(tree, "a.b") == {"s1"} and match(tree, "x.y") == {"s3"}
    tree.remove(seg("a.b"), "s1")
    assert tree.node_count() == 2 and match(tree, "x.y") == {"s3"}  # only x, >
    tree.remove(seg("x.>"), "s3")
    assert tree.node_count() == 0
    assert len(tree) == 0


def test_remove_keeps_a_node_that_still_has_children() -> None:
    tree: SubscriptionTree[str] = SubscriptionTree()
    tree.add(seg("a"), "s1")
    tree.add(seg("a.b"), "s2")
    tree.remove(seg("a"), "s1")
    assert match(tree, "a.b") == {"s2"}
    assert match(tree, "a") == set()


def test_match_results_are_cached_and_invalidated_by_add_and_remove() -> None:
    tree: SubscriptionTree[str] = SubscriptionTree()
    tree.add(seg("a.b"), "s1")
    first = tree.match(seg("a.b"))
    assert tree.match(seg("a.b")) is first  # served from the cache
    tree.add(seg("a.*"), "s2")
    assert set(tree.match(seg("a.b"))) == {"s1", "s2"}
    assert tree.match(seg("a.c")) == ("s2",)
    tree.remove(seg("a.*"), "s2")
    assert tree.match(seg("a.b")) == ("s1",)
    assert tree.match(seg("a.c")) == ()
    tree.remove(seg("a.b"), "s1")
    assert tree.match(seg("a.b")) == ()


def test_match_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(matching, "MATCH_CACHE_ENTRIES", 4)
    tree: SubscriptionTree[str] = SubscriptionTree()
    tree.add(seg("*"), "s")
    for i in range(20):
        assert tree.match((f"n{i}",)) == ("s",)
        assert tree.cached_names <= 4


SEGMENTS = st.sampled_from(["a", "b", "c"])
PATTERNS = st.tuples(
    st.lists(st.sampled_from(["a", "b", "*"]), max_size=3),
    st.booleans(),
).map(lambda t: (*t[0], ">") if t[1] else tuple(t[0])).filter(bool)
NAMES = st.lists(SEGMENTS, min_size=1, max_size=4).map(tuple)


@settings(max_examples=100, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.booleans(), PATTERNS, st.sampled_from(["s1", "s2", "s3"])),
        max_size=25,
    ),
    probes=st.lists(NAMES, min_size=1, max_size=6),
)
def test_tree_agrees_with_names_matches(
    ops: list[tuple[bool, tuple[str, ...], str]], probes: list[tuple[str, ...]]
) -> None:
    tree: SubscriptionTree[str] = SubscriptionTree()
    model: set[tuple[tuple[str, ...], str]] = set()
    for add, pattern, subscriber in ops:
        if add:
            tree.add(pattern, subscriber)
            model.add((pattern, subscriber))
        else:
            tree.remove(pattern, subscriber)
            model.discard((pattern, subscriber))
        assert len(tree) == len(model)
        for name in probes:  # probing between operations exercises the cache
            found = tree.match(name)
            assert len(found) == len(set(found))
            assert set(found) == {s for p, s in model if names.matches(p, name)}
    for pattern, subscriber in list(model):
        tree.remove(pattern, subscriber)
    assert tree.node_count() == 0 and len(tree) == 0


@pytest.mark.parametrize(
    ("text", "private", "owner_name"),
    [
        ("/temp-queue/replies.~17-a3f9c2", True, "/temp-queue/replies"),
        ("/temp-topic/a.b.~3-00ff00", True, "/temp-topic/a.b"),
        ("/temp-queue/replies", False, "/temp-queue/replies"),
        ("/queue/x.~1-aa", False, "/queue/x.~1-aa"),  # only temporaries have private names
    ],
)
def test_private_temporary_names(text: str, private: bool, owner_name: str) -> None:
    address = names.parse(text)
    assert isinstance(address, Address)
    assert names.is_private(address) is private
    assert names.owner_name(address) == owner_name


# -- retained messages (core.retained) -----------------------------------------------


def _retained(segments: tuple[str, ...], body: bytes = b"v") -> Message:
    return Message("id", Address(Kind.TOPIC, ".".join(segments)), {}, body)


@settings(max_examples=100, deadline=None)
@given(
    ops=st.lists(st.tuples(st.booleans(), NAMES | st.sampled_from([("$SYS", "a"), ("$SYS",)])), max_size=25),
    probes=st.lists(PATTERNS, min_size=1, max_size=6),
)
def test_the_retained_index_agrees_with_a_scan(ops: list[tuple[bool, tuple[str, ...]]], probes: list[tuple[str, ...]]) -> None:
    """What a subscription to a pattern gets from the retained index is what
    a scan of every retained topic with names.matches gets (root wildcards
    skipping $ topics), and the index prunes itself empty."""
    index = RetainedMessages()
    model: dict[tuple[str, ...], int] = {}
    for add, name in ops:
        if add:
            index.put(_retained(name, b"x" * len(name)))
            model[name] = len(name)
        else:
            index.pop(Address(Kind.TOPIC, ".".join(name)))
            model.pop(name, None)
        assert (len(index), index.nbytes) == (len(model), sum(model.values()))
        for pattern in probes:
            found = [m.address.segments for m in index.matching(Address(Kind.TOPIC, ".".join(pattern)))]
            assert len(found) == len(set(found))
            root_wild = pattern[0] in ("*", ">")
            assert set(found) == {
                n for n in model if names.matches(pattern, n) and not (root_wild and n[0].startswith("$"))
            }
    for name in list(model):
        index.pop(Address(Kind.TOPIC, ".".join(name)))
    assert index.node_count() == 0 and index.nbytes == 0


def test_retained_refusal_bounds_new_topics_and_growth_only() -> None:
    index = RetainedMessages()
    index.put(_retained(("a",), b"12345"))
    assert index.refusal(_retained(("b",)), 1, 0) == "too many retained messages (limit 1)"
    assert index.refusal(_retained(("a",), b"123456789"), 1, 0) is None  # replacing: no new topic
    assert index.refusal(_retained(("a",), b"123456789"), 1, 8) is not None  # but it would grow past the bytes
    assert index.refusal(_retained(("a",), b"1"), 1, 4) is None  # shrinking is fine even when over
