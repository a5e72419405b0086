"""An HA node's process (the broker with an ``[ha]`` table): node after
node, until SIGINT or SIGTERM.

A node's run (:class:`HaNode`, gateway/ha/runtime.py) ends when it is
deposed, fenced or steps down; the process then starts a fresh one after
:data:`REJOIN_PAUSE_S`, a new ZooKeeper session over the same data folder,
which joins as a backup (standing aside for a while if the last one stepped
down cut off from its backups: gateway/ha/isolation.py).  Signals are the
process's, not a node's: SIGINT or SIGTERM at any moment of any node's run,
or between two, ends the process with 0; SIGHUP is answered with a warning.
"""

from __future__ import annotations

import signal
from typing import Any

import trio

from gateway.config import Config
from gateway.ha import isolation
from gateway.ha.primary_role import warn_open_links
from gateway.ha.runtime import REJOIN_PAUSE_S, HaNode


class Process:
    """An [ha] node's process: node after node (a deposed one's run ends and
    a fresh one rejoins), until SIGINT or SIGTERM."""

    def __init__(self, config: Config, log: Any) -> None:
        self.config, self.log = config, log
        self.node: HaNode | None = None
        self.stopped = trio.Event()

    async def run(self) -> int:
        assert self.config.ha is not None
        if not self.config.ha.zookeeper_auth:
            # Once per process (not per node run): a laptop trial works, but
            # anyone who reaches ZooKeeper can take the group over.
            self.log.warning("ha_zookeeper_open", zookeeper=self.config.ha.zookeeper,
                             detail="no ZooKeeper credentials: the group's znodes are open to anyone who reaches "
                                    "ZooKeeper (world:anyone, all permissions), who can redirect the backups or stop "
                                    "the election; set [ha] zookeeper_auth_file (a file holding user:password) or "
                                    "GATEWAY_ZOOKEEPER_AUTH")
        async with trio.open_nursery() as nursery:
            await nursery.start(self.stop_on_signal)
            code = await self.nodes()
            nursery.cancel_scope.cancel()
        return code

    async def nodes(self) -> int:
        incarnation, stand_aside_until = 1, None
        while True:
            self.node = HaNode(self.config, self.log, incarnation=incarnation, stand_aside_until=stand_aside_until)
            if self.stopped.is_set():
                return 0
            code = await self.node.run()
            if code is not None:
                return code
            incarnation += 1
            stand_aside_until = None
            if self.node.isolated is not None:  # it stepped down, cut off from its backups: gateway/ha/isolation.py
                stand_aside_until = trio.current_time() + isolation.stand_aside_s(self.config.ha.zookeeper_session_timeout_s)
            self.log.warning("ha_rejoining", node_id=self.node.ha.node_id, incarnation=incarnation,
                             pause_s=REJOIN_PAUSE_S)
            with trio.move_on_after(REJOIN_PAUSE_S):
                await self.stopped.wait()

    async def stop_on_signal(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        # Open for the whole process, not per node: a signal between two
        # nodes, or while one joins, still ends the process with 0.
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            task_status.started()
            async for signum in signals:
                if signum == signal.SIGHUP:
                    # Every node of a group must run one configuration; a reload
                    # here would last until the next failover. Said, not done.
                    self.log.warning("config_reload_failed", trigger="SIGHUP", reason="an HA node does not reload "
                                     "its configuration: restart its pods (deploy/README.md, \"Rolling upgrade\")")
                    continue
                self.log.info("shutdown_requested", signal=signal.Signals(signum).name)
                self.stopped.set()
                if self.node is not None:
                    self.node.stop()


def run(config: Config, log: Any) -> int:
    """Run an HA node's process in this (main) thread; its exit code."""
    assert config.ha is not None
    warn_open_links(config.ha, log)
    return trio.run(Process(config, log).run)
