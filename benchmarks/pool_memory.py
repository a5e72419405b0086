"""What the broker-wide pools one client can fill hold in memory, measured
(not asserted) under tracemalloc: MQTT 5 sessions driven through their own
door (sans-IO: packets in, outbox read back) on a real core Broker, as in
tests/unit/mqtt, with the default settings unless told otherwise.

* delayed wills: N client ids, each CONNECT carrying the largest will the
  pre-login packet limit lets through (a Will Delay Interval of an hour, a
  kept session), each connection then dropped without DISCONNECT so its will
  waits; from one source address (one holder's share) and from N addresses
  (only the broker-wide bound);
* shared groups: N + 1 ``$share`` groups with the longest name allowed, made
  by one connection (N is the default share of one holder).

    PYTHONPATH=. python benchmarks/pool_memory.py --n 1000
"""

from __future__ import annotations

import argparse
import gc
import tracemalloc
from typing import Any

from core.broker import Broker
from core.settings import BrokerSettings
from gateway.mqtt import codec
from gateway.mqtt.codec import packets
from gateway.mqtt.registry import Registry
from gateway.mqtt.session import MqttSession, MqttSettings
MIB = 1024 * 1024


class FakeClock:
    """Time stands still: nothing here waits for a deadline."""

    def __init__(self, wall_ms: int) -> None:
        self.wall = wall_ms

    def monotonic(self) -> float:
        return 1000.0

    def wall_ms(self) -> int:
        return self.wall


class Quiet:
    def bind(self, **_: Any) -> Quiet:
        return self

    def info(self, *_: Any, **__: Any) -> None:
        pass

    warning = debug = error = info


def connect(broker: Broker, registry: Registry, settings: MqttSettings, client_id: str, source: str,
            will: packets.Will | None) -> tuple[MqttSession, codec.MqttConnection, int]:
    session = MqttSession(broker, broker.clock, settings, registry, conn_id=client_id, log=Quiet(),  # type: ignore[arg-type]
                          source=source)
    conn = codec.MqttConnection(codec.Role.CLIENT)
    props = packets.Properties(session_expiry_interval=3600)
    session.skeleton.receive_data(conn.send(packets.Connect(client_id, True, will=will, protocol_level=5,
                                                            properties=props)))
    answers = read(session, conn)
    return session, conn, answers[0].return_code


def read(session: MqttSession, conn: codec.MqttConnection) -> list[Any]:
    out = []
    while data := session.outbox.drain(1 << 62):
        session.skeleton.on_drained()
        conn.receive_data(data)
        out.extend(conn.events())
    return out


def largest_will(settings: MqttSettings) -> packets.Will:
    """A will filling what a CONNECT may carry before login, less room for the rest of the packet."""
    room = settings.preconnect_max_packet_bytes - 512
    pairs = tuple((f"k{i}", "v" * 1000) for i in range(room // 2 // 1004))
    payload = b"x" * (room - sum(len(k) + len(v) + 4 for k, v in pairs))
    return packets.Will("will/topic", payload, 1, True, packets.Properties(will_delay_interval=3600, user_properties=pairs))


def measure(label: str, run: Any) -> None:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept, outcome = run()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    print(f"{label}: {outcome}; {(after - before) / MIB:.1f} MiB held")
    del kept


def wills(n: int, many_sources: bool) -> Any:
    def run() -> tuple[Any, str]:
        broker = Broker(FakeClock(wall_ms=1_700_000_000_000), node="bench")
        registry = Registry()
        settings = MqttSettings()
        will = largest_will(settings)
        codes: dict[int, int] = {}
        for i in range(n):
            source = f"10.0.{i // 250}.{i % 250 + 1}" if many_sources else "127.0.0.1"
            session, _, code = connect(broker, registry, settings, f"dev{i}", source, will)
            codes[code] = codes.get(code, 0) + 1
            if code == 0:
                session.skeleton.receive_data(b"")  # dropped: the will waits
        shares = registry.lifetimes.will_shares
        held = f"{shares.total_items} wills pending ({shares.total_bytes / MIB:.1f} MiB counted), CONNACK codes {codes}"
        return (broker, registry), held
    return run


def groups(n: int) -> Any:
    def run() -> tuple[Any, str]:
        broker_settings = BrokerSettings(max_subscriptions_per_client=n + 1)
        broker = Broker(FakeClock(wall_ms=1_700_000_000_000), broker_settings, node="bench")
        registry = Registry()
        session, conn, _ = connect(broker, registry, MqttSettings(), "sub", "127.0.0.1", None)
        codes: dict[int, int] = {}
        name = "g" * broker_settings.max_shared_group_name_chars
        for i in range(n + 1):  # one past the share
            session.skeleton.receive_data(conn.send(packets.Subscribe(1, [(f"$share/{name[:-5]}{i:05}/t/#", 1)])))
            code = read(session, conn)[0].return_codes[0]
            codes[code] = codes.get(code, 0) + 1
        return (broker, registry, session), f"{len(broker.shared)} groups of {len(name)}-character names, SUBACK codes {codes}"
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1000)
    args = parser.parse_args()
    measure(f"{args.n} largest delayed wills from one address", wills(args.n, False))
    measure(f"{args.n} largest delayed wills from {args.n} addresses", wills(args.n, True))
    measure(f"{args.n} + 1 longest-named $share groups from one connection", groups(args.n))


if __name__ == "__main__":
    main()
