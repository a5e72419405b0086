"""Shared pieces of the Spark tests: an archiving broker with an admin user,
and DataFrame readers pointed at it through the user's door (format "gateway")."""

from __future__ import annotations

from typing import Any

from gateway.auth import hash_password

USER = ("spark", "sp4rk")
USERS = [{"name": USER[0], "password_hash": hash_password(USER[1], iterations=1000), "role": "write"}]
ARCHIVED = [{"destination": "/topic/plant.>", "archive": True}]


def url(broker: Any) -> str:
    return f"http://127.0.0.1:{broker.admin_port}"


def read(spark: Any, broker: Any, topic: str, **options: Any) -> Any:
    return _load(spark.read, broker, topic, options)


def stream(spark: Any, broker: Any, topic: str, **options: Any) -> Any:
    return _load(spark.readStream, broker, topic, options)


def _load(entry: Any, broker: Any, topic: str, options: dict[str, Any]) -> Any:
    reader = entry.format("gateway").option("url", url(broker)).option("user", USER[0]).option("password", USER[1])
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.option("topic", topic).load()
