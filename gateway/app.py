"""Wiring: one broker core, its listeners and sessions, signal handling."""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path
from typing import Any

import trio

from core.broker import Broker
from gateway.auth import allow_anonymous
from gateway.config import Config
from gateway.server import ListenerSpec, Server, TrioClock
from gateway.stomp.session import StompSession


@dataclasses.dataclass
class Running:
    """What a started broker reports: its real ports (useful with port 0) and handles to stop it."""

    ports: dict[str, int]
    server: Server
    broker: Broker

    def stop(self) -> None:
        self.server.stop()


async def serve(
    config: Config,
    log: Any,
    *,
    handle_signals: bool = True,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the broker until SIGINT/SIGTERM (or :meth:`Running.stop`), then drain and return."""
    Path(config.data_dir).mkdir(parents=True, exist_ok=True)
    clock = TrioClock()
    broker = Broker(clock, config.broker)
    server = Server(log, durable_lsn=lambda: broker.durable_lsn, grace_s=config.shutdown_grace_s)

    def stomp_session(conn_id: str, conn_log: Any) -> StompSession:
        return StompSession(broker, clock, config.stomp, conn_id=conn_id, log=conn_log, authenticate=allow_anonymous)

    specs = [ListenerSpec("stomp", config.bind, config.stomp_port, stomp_session)]
    finished = trio.Event()

    async def run_server(*, task_status: Any) -> None:
        try:
            await server.run(specs, task_status=task_status)
        finally:
            finished.set()

    async with trio.open_nursery() as nursery:
        if handle_signals:
            nursery.start_soon(_stop_on_signal, server, log)
        ports = await nursery.start(run_server)
        log.info("broker_started", ports=ports, data_dir=config.data_dir)
        task_status.started(Running(ports, server, broker))
        await finished.wait()
        nursery.cancel_scope.cancel()
    log.info("broker_stopped")


def run(config: Config, log: Any) -> None:
    """Run the broker in this (main) thread until a signal stops it."""
    trio.run(serve, config, log)


async def _stop_on_signal(server: Server, log: Any) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("shutdown_requested", signal=signal.Signals(signum).name)
            server.stop()
