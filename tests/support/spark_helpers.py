"""Shared pieces of the Spark tests: an archiving broker with an admin user,
and DataFrame readers pointed at it through the user's door (format "gateway")."""

from __future__ import annotations

import base64
import json
from typing import Any
from urllib.parse import quote, urlencode
from urllib.error import HTTPError
from urllib.request import Request, urlopen

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


def _get(broker: Any, path: str) -> Any:
    token = base64.b64encode(f"{USER[0]}:{USER[1]}".encode()).decode()
    request = Request(f"{url(broker)}{path}", headers={"Authorization": f"Basic {token}"})
    with urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def depth(broker: Any, queue: str) -> int:
    """How many messages wait in ``queue`` (/queue/name), from the admin API
    (0 before the queue exists)."""
    try:
        return int(_get(broker, f"/api/v1/destinations/{quote(queue.removeprefix('/'), safe='')}")["depth"])
    except HTTPError as error:
        if error.code == 404:
            return 0
        raise


def archived(broker: Any, pattern: str) -> int:
    """How many messages the archives of the topics ``pattern`` matches hold
    (0 before the first is archived), from the admin API."""
    return sum(t["messages"] for t in _get(broker, "/api/v1/archive?" + urlencode({"pattern": pattern}))["topics"])
