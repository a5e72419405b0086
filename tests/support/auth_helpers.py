"""Broker users in groups and an authorization map over them, with the
passwords the tests log in with; shared by the authorization and the admin
API tests."""

from __future__ import annotations

from gateway.auth import hash_password

ITER = 1000  # cheap hashes: the tests measure behaviour, not PBKDF2


def user(name, password, *groups):
    return {"name": name, "password_hash": hash_password(password, iterations=ITER), "groups": list(groups)}


USERS = [
    user("app", "app-pw", "producers"),
    user("reader", "reader-pw", "consumers"),
    user("ops", "ops-pw", "admins"),
    user("late", "late-pw", "latecomers"),
    user("sensor", "sensor-pw", "sensors"),
]
ACL = [
    {"destination": "/queue/orders.>", "write": ["producers", "latecomers"], "read": ["consumers"], "admin": ["producers", "admins"]},
    {"destination": "/topic/plant.>", "read": ["*"], "write": ["sensors"]},
    {"destination": "/topic/barrier.>", "write": ["*"]},  # the test clients' round trips
    {"destination": "/queue/replies", "read": ["producers"], "write": ["consumers"], "admin": ["producers"]},
]


def login(name):
    """STOMP CONNECT headers for one of USERS (each one's password is ``<name>-pw``)."""
    return {"login": name, "passcode": f"{name}-pw"}
