"""The ZooKeeper connect string: hosts, then an optional chroot the coordinator's paths live under."""

from __future__ import annotations

import pytest

from gateway.ha.coordinator import CoordinationError, split_connect


@pytest.mark.parametrize(("connect", "expected"), [
    ("zk-0:2181", ("zk-0:2181", "")),
    ("zk-0:2181/", ("zk-0:2181", "")),
    ("zk-0:2181,zk-1:2181,zk-2:2181/gateway", ("zk-0:2181,zk-1:2181,zk-2:2181", "/gateway")),
    ("127.0.0.1:2181/ha/prod/", ("127.0.0.1:2181", "/ha/prod")),
])
def test_the_chroot_is_split_from_the_hosts(connect: str, expected: tuple[str, str]) -> None:
    assert split_connect(connect) == expected


@pytest.mark.parametrize("connect", ["", "/gateway", "zk-0:2181/a//b"])
def test_a_bad_connect_string_is_refused(connect: str) -> None:
    with pytest.raises(CoordinationError):
        split_connect(connect)
