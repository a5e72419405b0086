"""Shared fixtures: a real broker on a loopback port, run in a background thread
so blocking clients (stomp.py) can talk to it from ordinary test functions."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from core.broker import BrokerSettings
from gateway import app, logs
from gateway.admin.api import AdminSettings
from gateway.auth import AuthSettings
from gateway.config import Config
from gateway.mqtt.session import MqttSettings
from gateway.stomp.session import StompSettings


# Generated-input tests check behaviour, not speed: on a loaded CI machine
# generation may be slow, which is no failure of the code under test.
hypothesis_settings.register_profile("gateway", deadline=None, suppress_health_check=list(HealthCheck))
hypothesis_settings.load_profile("gateway")


@dataclasses.dataclass
class BrokerHandle:
    running: app.Running
    token: trio.lowlevel.TrioToken
    thread: threading.Thread
    config: Config

    @property
    def stomp_port(self) -> int:
        return self.running.ports["stomp"]

    @property
    def admin_port(self) -> int:
        return self.running.ports["admin"]

    @property
    def mqtt_port(self) -> int:
        return self.running.ports["mqtt"]

    @property
    def stomp_address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.stomp_port)

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` on the broker's Trio thread (to inspect core state safely)."""
        return trio.from_thread.run_sync(fn, *args, trio_token=self.token)

    def stop(self) -> None:
        if self.thread.is_alive():
            try:
                self.call(self.running.stop)
            except trio.RunFinishedError:
                pass
            self.thread.join(timeout=30)
            assert not self.thread.is_alive(), "broker did not stop"


def start_broker(config: Config) -> BrokerHandle:
    log = logs.configure("console", config.log_level)
    started = threading.Event()
    result: dict[str, Any] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            result["running"] = await nursery.start(lambda task_status: app.serve(config, log, handle_signals=False, task_status=task_status))
            result["token"] = trio.lowlevel.current_trio_token()
            started.set()

    def target() -> None:
        try:
            trio.run(main)
        finally:
            started.set()

    thread = threading.Thread(target=target, name="broker", daemon=True)
    thread.start()
    assert started.wait(10), "broker did not start"
    assert "running" in result, "broker failed to start"
    return BrokerHandle(result["running"], result["token"], thread, config)


FAST_STOMP = StompSettings(connect_timeout_s=2.0, heartbeat_send_ms=50, heartbeat_receive_ms=50)


def make_config(
    tmp_path: Path,
    *,
    stomp: dict[str, Any] | None = None,
    broker: dict[str, Any] | None = None,
    mqtt: dict[str, Any] | None = None,
    admin: dict[str, Any] | None = None,
    auth: dict[str, Any] | None = None,
    **top: Any,
) -> Config:
    return Config(
        bind="127.0.0.1",
        stomp_port=0,
        mqtt_port=0,
        admin_port=0,
        data_dir=str(tmp_path / "data"),
        log_level="warning",
        shutdown_grace_s=5.0,
        stomp=dataclasses.replace(FAST_STOMP, **(stomp or {})),
        broker=BrokerSettings(**(broker or {})),
        mqtt=MqttSettings(**(mqtt or {})),
        admin=AdminSettings(**(admin or {})),
        auth=AuthSettings(**(auth or {})),
        **top,
    )


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[Callable[..., BrokerHandle]]:
    """Start brokers with custom settings: ``broker_factory(stomp={...}, broker={...})``."""
    handles: list[BrokerHandle] = []

    def factory(**kwargs: Any) -> BrokerHandle:
        handle = start_broker(make_config(tmp_path, **kwargs))
        handles.append(handle)
        return handle

    yield factory
    for handle in handles:
        handle.stop()


@pytest.fixture
def broker(broker_factory: Callable[..., BrokerHandle]) -> BrokerHandle:
    """A broker with default settings but fast timeouts, on a free loopback port."""
    return broker_factory()


# -- clients for the end-to-end tests (tests/e2e/) ---------------------
# Both factories depend on broker_factory so that their teardown (closing every
# client and joining stomp.py's threads) runs before the brokers stop.


@pytest.fixture
def stomp_client(broker_factory: Callable[..., BrokerHandle]) -> Iterator[Callable[..., Any]]:
    """Connected stomp.py clients: ``stomp_client(broker, version="1.1", heartbeats=...)``;
    each is disconnected in teardown."""
    from tests.support.helpers import Client

    made: list[Client] = []

    def factory(target: BrokerHandle | tuple[str, int], version: str = "1.2", *, connect: bool = True, headers: dict[str, str] | None = None, **kwargs: Any) -> Client:
        address = target.stomp_address if isinstance(target, BrokerHandle) else target
        client = Client(address, version, **kwargs)
        made.append(client)
        if connect:
            client.connect(**(headers or {}))
        return client

    yield factory
    for client in made:
        client.close()


@pytest.fixture
def raw_client(broker_factory: Callable[..., BrokerHandle]) -> Iterator[Callable[..., Any]]:
    """Raw STOMP sockets for misbehaving clients: ``raw_client(broker)``; closed in teardown."""
    from tests.support.helpers import RawClient

    made: list[RawClient] = []

    def factory(target: BrokerHandle | tuple[str, int], **kwargs: Any) -> RawClient:
        client = RawClient(target.stomp_address if isinstance(target, BrokerHandle) else target, **kwargs)
        made.append(client)
        return client

    yield factory
    for client in made:
        client.close()


@pytest.fixture
def paho(broker_factory: Callable[..., BrokerHandle]) -> Iterator[Callable[..., Any]]:
    """Connected paho-mqtt clients: ``paho(broker, client_id, clean=..., will=...)``;
    ``websocket=True`` connects over WebSocket (the admin port's ``/mqtt``)."""
    from tests.support.mqtt_helpers import Paho

    made: list[Paho] = []

    def factory(target: BrokerHandle, *args: Any, websocket: bool = False, **kwargs: Any) -> Paho:
        if websocket:  # over WebSocket: the admin port's /mqtt (wss on admin-tls with tls=context)
            port = target.running.ports["admin-tls" if kwargs.get("tls") else "admin"]
            client = Paho(port, *args, websocket_path="/mqtt", **kwargs)
        else:
            client = Paho(target.mqtt_port, *args, **kwargs)
        made.append(client)
        return client

    yield factory
    for client in made:
        try:
            client.close()
        except Exception:  # already dropped or closed by the test: nothing to release
            pass


@pytest.fixture
def raw_mqtt(broker_factory: Callable[..., BrokerHandle]) -> Iterator[Callable[..., Any]]:
    """Raw MQTT sockets on the project's codec: ``raw_mqtt(broker)``; with a
    ``client_id`` the socket has CONNECTed and checked CONNACK 0."""
    from gateway.mqtt.codec import packets
    from tests.support.mqtt_helpers import RawMqtt

    made: list[RawMqtt] = []

    def factory(target: BrokerHandle | int, client_id: str | None = None, **connect: Any) -> RawMqtt:
        client = RawMqtt(target.mqtt_port if isinstance(target, BrokerHandle) else target)
        made.append(client)
        if client_id is not None:
            client.send(packets.Connect(client_id, **connect))
            ack = client.next()
            assert isinstance(ack, packets.ConnAck) and ack.return_code == 0, ack
            client.connack = ack
        return client

    yield factory
    for client in made:
        client.close()


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """`gateway serve ...` as child processes (tests/support/processes.py's Process), killed in teardown."""
    from tests.support.processes import Process

    made: list[Process] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Process:
        process = Process(list(args), tmp_path, env)
        made.append(process)
        return process

    yield start
    for process in made:
        process.kill()


@pytest.fixture
def browser() -> Iterator[Any]:
    """Headless chromium (selenium); tests using it are marked ``requires_chromium`` (tests/support/browser.py)."""
    from tests.support.browser import chromium

    with chromium() as driver:
        yield driver


@pytest.fixture(scope="module")
def ca() -> Any:
    """A throwaway certificate authority (trustme) for the TLS tests."""
    import trustme

    return trustme.CA()


@pytest.fixture
def pki(ca, tmp_path):
    """Files: the CA, the server's key+chain, a client certificate for sensor-1."""
    files = {name: tmp_path / f"{name}.pem" for name in ("ca", "server", "client_cert", "client_key")}
    ca.cert_pem.write_to_path(files["ca"])
    ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(files["server"])
    client = ca.issue_cert("sensor-1.example", common_name="sensor-1")
    client.cert_chain_pems[0].write_to_path(files["client_cert"])
    client.private_key_pem.write_to_path(files["client_key"])
    return {name: str(path) for name, path in files.items()}


# -- a Spark session and an archiving broker for the gateway.spark tests ------


@pytest.fixture
def spark_broker(broker_factory: Callable[..., BrokerHandle]) -> Callable[..., BrokerHandle]:
    """``spark_broker(policies=..., **broker_factory kwargs)``: topics under
    plant. archived, and the admin user tests.support.spark_helpers.USER."""
    from tests.support.spark_helpers import ARCHIVED, USERS

    def start(policies: list[dict[str, Any]] = ARCHIVED, *, broker: dict[str, Any] | None = None, **kwargs: Any) -> BrokerHandle:
        return broker_factory(broker={"policies": policies, **(broker or {})}, admin={"users": USERS}, **kwargs)

    return start


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark (two cores) for the whole run: starting the JVM costs
    seconds, so every Spark test shares it.  Workers run this interpreter (so
    they import this checkout's ``gateway``); Spark binds loopback only."""
    import os
    import sys

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    from gateway.spark import GatewayDataSource

    session = (
        SparkSession.builder.master("local[2]")
        .appName("gateway-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(GatewayDataSource)
    yield session
    session.stop()
