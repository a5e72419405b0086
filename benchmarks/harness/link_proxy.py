"""A TCP proxy for one replication link, to cut it the way a network does:
silently.  While cut, the connections it carries are dead for good (what
either end sends is read and dropped, an end's close is not passed on, its
sockets stay open: a half-open link nobody is told about, as after a lost
FIN or a firewall that forgot the connection), and connections made during
the cut wait unforwarded until the heal (a SYN that gets through once the
network is back).  Threads, loopback only, stdlib only; closed with its
user: the HA end-to-end tests (tests/e2e/test_ha_link_liveness.py,
test_ha_isolated_primary.py) and the failover benchmark's cut rounds
(benchmarks/failover.py --faults)."""

from __future__ import annotations

import socket
import threading

HOST = "127.0.0.1"
MAX_PENDING = 16  # connections made during a cut, held until the heal (a SYN backlog's bound)


class _Pair:
    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.upstream: socket.socket | None = None
        self.dead = False
        self.halves_done = 0  # directions whose end was passed on


class LinkProxy:
    """Listens on ``port`` (a free one) and forwards to ``HOST:target``, set before the first connection."""

    def __init__(self) -> None:
        self.target = 0
        self.connections = 0  # forwarded upstream
        self._lock = threading.Lock()
        self._cut = False
        self._pairs: list[_Pair] = []
        self._pending: list[_Pair] = []
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server((HOST, 0))
        self.port: int = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            for pair in self._pairs:
                pair.dead = True

    def heal(self) -> None:
        with self._lock:
            self._cut = False
            pending, self._pending = self._pending, []
        for pair in pending:
            self._start(pair)

    def close(self) -> None:
        self._closed = True
        for sock in [self._listener, *self._sockets]:
            try:
                sock.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            pair = _Pair(client)
            with self._lock:
                if self._cut:
                    if len(self._pending) >= MAX_PENDING:
                        # A full SYN backlog: the attempt fails, and nothing piles up here.
                        client.close()
                        continue
                    self._sockets.append(client)
                    self._pending.append(pair)
                    continue
                self._sockets.append(client)
            self._start(pair)

    def _start(self, pair: _Pair) -> None:
        try:
            upstream = socket.create_connection((HOST, self.target))
        except OSError:
            pair.client.close()
            return
        self._sockets.append(upstream)
        pair.upstream = upstream
        with self._lock:
            self._pairs.append(pair)
            self.connections += 1
        threading.Thread(target=self._pump, args=(pair, pair.client, upstream), daemon=True).start()
        threading.Thread(target=self._pump, args=(pair, upstream, pair.client), daemon=True).start()

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if pair.dead:
                if not data:
                    return  # a close nobody hears of: the other end's socket stays open
                continue  # dropped
            try:
                if data:
                    dst.sendall(data)
                    continue
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            self._ended(pair)
            return

    def _ended(self, pair: _Pair) -> None:
        """One direction of a live pair is over; once both are, its sockets
        are closed, so that a long run's reconnects do not pile up here."""
        with self._lock:
            pair.halves_done += 1
            if pair.halves_done < 2 or pair.dead:
                return
            if pair in self._pairs:
                self._pairs.remove(pair)
            for sock in (pair.client, pair.upstream):
                if sock is not None and sock in self._sockets:
                    self._sockets.remove(sock)
        for sock in (pair.client, pair.upstream):
            if sock is not None:
                try:
                    sock.close()
                except OSError:
                    pass
