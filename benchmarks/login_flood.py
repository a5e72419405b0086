"""A client's login time without and under a flood of wrong admin passwords
(issue 29, item 4): the broker as a child process (``gateway serve``), every
user with a real PBKDF2 hash (auth.HASH_ITERATIONS), and

* the client: fresh STOMP logins one after another, each a user not logged
  in before (so each costs a password check; a repeated one would be
  answered from the cache), timed from the TCP connect to CONNECTED;
* the flood: wrong admin Basic-auth requests from ``--addresses`` source
  addresses (127.0.0.2 ...), ``--per-address`` in flight from each, in a
  process of its own; the lockout is set too lenient to help
  (``max_failed_logins`` 1,000,000), so every guess costs a hash.

The target: the client's p99 under the flood within twice its p99 without.
``--source DIR`` runs the broker from another checkout (the code before a
change, say) for an A/B in one sitting.

    PYTHONPATH=. python benchmarks/login_flood.py
    PYTHONPATH=. python benchmarks/login_flood.py --source /work/main --logins 60
"""

from __future__ import annotations

import argparse
import base64
import json
import multiprocessing
import os
import socket
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.harness.broker import Broker, ScenarioFailed, free_port, loadavg  # noqa: E402
from gateway.auth import hash_password  # noqa: E402

HOST = "127.0.0.1"


def write_config(path: Path, users: int, admin_port: int, log_level: str) -> None:
    shared = hash_password("client-pw")  # one hash for every client user: each login still checks its own
    admin = hash_password("the-right-one")
    lines = [
        'mqtt_port = 0', f'admin_port = {admin_port}', f'log_level = "{log_level}"', "",
        "[auth]", "max_failed_logins = 1000000", "users = [",
        *(f'  {{name = "c{i}", password_hash = "{shared}"}},' for i in range(users)), "]", "",
        "[admin]", f'users = [{{name = "ops", password_hash = "{admin}", role = "read"}}]', "",
    ]
    path.write_text("\n".join(lines))


def login(port: int, user: str, timeout: float) -> float:
    """Seconds from connect to CONNECTED for one fresh login (raises on a refusal)."""
    started = time.perf_counter()
    with socket.create_connection((HOST, port), timeout=timeout) as sock:
        sock.sendall(f"CONNECT\naccept-version:1.2\nhost:h\nlogin:{user}\npasscode:client-pw\n\n\x00".encode())
        data = b""
        while b"\x00" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                raise ScenarioFailed(f"closed before CONNECTED: {data[:200]!r}")
            data += chunk
        elapsed = time.perf_counter() - started
        if not data.startswith(b"CONNECTED"):
            raise ScenarioFailed(f"login refused: {data[:200]!r}")
        sock.sendall(b"DISCONNECT\n\n\x00")
    return elapsed


def flood(port: int, addresses: int, per_address: int, pause_s: float, stop: multiprocessing.Event,
          counts: dict) -> None:
    """The wrong guesses, in this child process's own Trio loop."""
    import trio

    seen: dict[str, int] = {}
    guesses = iter(range(1 << 62))

    async def guess(address: str) -> None:
        while True:
            # A new password each time, as a guesser sends: no answer is cached.
            token = base64.b64encode(f"ops:guess-{next(guesses)}".encode()).decode()
            request = (f"GET /api/v1/destinations HTTP/1.1\r\nHost: gateway\r\nAuthorization: Basic {token}\r\n"
                       "Connection: close\r\n\r\n").encode()
            sock = trio.socket.socket()
            with sock:
                try:
                    await sock.bind((address, 0))
                    await sock.connect((HOST, port))
                    await sock.send(request)
                    head = b""
                    while b"\r\n" not in head:
                        data = await sock.recv(4096)
                        if not data:
                            break
                        head += data
                    answer = head.split(b" ", 2)[1].decode() if head.startswith(b"HTTP/1.1 ") else "closed"
                except OSError:
                    answer = "refused"
            seen[answer] = seen.get(answer, 0) + 1
            if answer != "401":
                await trio.sleep(pause_s)  # busy or refused: again soon, without spinning

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for i in range(addresses):
                for _ in range(per_address):
                    nursery.start_soon(guess, f"127.0.0.{2 + i}")
            while not stop.is_set():
                await trio.sleep(0.1)
                counts.update(seen)
            nursery.cancel_scope.cancel()
        counts.update(seen)

    trio.run(main)


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def summary(samples: list[float]) -> dict[str, float]:
    return {"n": len(samples), "p50_ms": round(statistics.median(samples) * 1000, 1),
            "p99_ms": round(percentile(samples, 99) * 1000, 1), "max_ms": round(max(samples) * 1000, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--logins", type=int, default=100, help="fresh client logins per phase")
    parser.add_argument("--addresses", type=int, default=79, help="flood source addresses, from 127.0.0.2")
    parser.add_argument("--per-address", type=int, default=3, help="guesses in flight from each address")
    parser.add_argument("--timeout", type=float, default=60.0, help="one login's bound")
    parser.add_argument("--pause", type=float, default=0.25,
                        help="seconds a flooding connection waits after a 503 or 429 (the answer's Retry-After is 1)")
    parser.add_argument("--log-level", default="warning", help="the broker's")
    parser.add_argument("--source", default=str(HERE.parent), help="the checkout the broker runs from")
    args = parser.parse_args(argv)

    admin_port = free_port()
    broker = Broker(f"{sys.executable} -P -m gateway serve --config CONFIG --data-dir {{data_dir}} --stomp-port {{port}}")
    broker.template = broker.template.replace("CONFIG", str(broker.tmp / "gateway.toml"))
    write_config(broker.tmp / "gateway.toml", 2 * args.logins, admin_port, args.log_level)
    os.environ["PYTHONPATH"] = args.source  # and -P: not the runner's working directory
    result: dict = {"source": args.source, "loadavg_before": loadavg()}
    try:
        broker.start(time.monotonic() + 30)
        stomp_port = broker.port
        quiet = [login(stomp_port, f"c{i}", args.timeout) for i in range(args.logins)]
        result["without_flood"] = summary(quiet)
        stop = multiprocessing.Event()
        manager = multiprocessing.Manager()
        counts = manager.dict()
        child = multiprocessing.Process(target=flood, args=(admin_port, args.addresses, args.per_address, args.pause, stop, counts))
        child.start()
        try:
            started = time.monotonic()
            while sum(counts.values()) < args.addresses and time.monotonic() - started < 60:
                time.sleep(0.1)  # the flood under way: its first answers back
            cpu_before = broker.cpu()
            flooded, refused = [], []
            for i in range(args.logins):
                started = time.perf_counter()
                try:
                    flooded.append(login(stomp_port, f"c{args.logins + i}", args.timeout))
                except (ScenarioFailed, OSError) as exc:  # refused or timed out: counted, and as long as it took
                    flooded.append(time.perf_counter() - started)
                    refused.append(str(exc)[:120])
            result["under_flood"] = summary(flooded)
            result["under_flood"]["refused"] = len(refused)
            if refused:
                result["under_flood"]["first_refusal"] = refused[0]
            result["broker_cpu_s_during"] = round(broker.cpu() - cpu_before, 2)
        finally:
            stop.set()
            child.join(30)
            result["flood_answers"] = dict(counts)
            manager.shutdown()
        result["p99_ratio"] = round(result["under_flood"]["p99_ms"] / result["without_flood"]["p99_ms"], 2)
        result["target_met"] = result["p99_ratio"] <= 2.0 and not refused
    except ScenarioFailed as exc:
        result["failed"] = str(exc)
    finally:
        broker.stop()
        result["loadavg_after"] = loadavg()
        broker.cleanup()
    print(json.dumps(result, indent=2))
    return 0 if result.get("target_met") else 1


if __name__ == "__main__":
    raise SystemExit(main())
