"""The pool of replication connections still proving membership (gateway/ha/link.py's Handshakes)."""

from __future__ import annotations

from gateway.ha.link import Handshakes


def test_each_address_gets_its_share_and_the_whole_is_bounded() -> None:
    pool = Handshakes(total=5, per_address=2)
    assert pool.enter("10.0.0.9") is None and pool.enter("10.0.0.9") is None
    refusal = pool.enter("10.0.0.9")
    assert refusal is not None and "from this address" in refusal
    assert pool.enter("10.0.0.1") is None  # another address has its own share
    assert pool.enter("10.0.0.2") is None and pool.enter("10.0.0.3") is None
    refusal = pool.enter("10.0.0.4")
    assert refusal is not None and "5 connections are still authenticating" in refusal
    assert pool.count == 5


def test_a_finished_handshake_gives_its_place_back() -> None:
    pool = Handshakes(total=2, per_address=1)
    assert pool.enter("a") is None
    assert pool.enter("a") is not None
    pool.leave("a")
    assert pool.by_address == {} and pool.count == 0
    assert pool.enter("a") is None


def test_a_flood_is_logged_once_per_address_or_once_while_the_pool_is_full() -> None:
    pool = Handshakes(total=3, per_address=1)
    assert pool.enter("a") is None
    assert pool.enter("a") is not None
    assert pool.first_refusal("a") and not pool.first_refusal("a")
    pool.leave("a")  # drained: a later flood from it is news again
    assert pool.told == set()
    assert pool.enter("a") is None and pool.enter("b") is None and pool.enter("c") is None
    assert pool.enter("d") is not None and pool.enter("e") is not None  # the pool is full
    assert pool.first_refusal("d") and not pool.first_refusal("e")  # one line for all of them
    assert len(pool.told) == 1  # never one entry per stranger's address
    pool.leave("b")
    assert pool.enter("d") is None
    assert pool.enter("f") is not None and pool.first_refusal("f")  # full again: news again
