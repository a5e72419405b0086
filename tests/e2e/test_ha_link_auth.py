"""The replication link authenticated, end to end: a real ZooKeeper and
`gateway serve` nodes sharing a cluster secret (tests/support/ha_nodes.py), attacked
through the same doors an attacker uses.

- A rogue client on the primary's replication port that says Hello without
  the secret (the old protocol, or the handshake with a guessed secret and a
  real backup's node id) gets nothing of the journal and is closed; the real
  backup stays connected and confirms.
- A phantom backup that would acknowledge every batch cannot count toward
  ``sync_replicas``: with the only real backup frozen, no receipt.
- A backup sent to an impostor primary (the /primary znode rewritten, as the
  issue's attacker did) refuses it and keeps its store byte for byte.
- Without any secret the replication listener binds loopback only, and the
  node says so once at start.
- Connections that never finish the handshake are bounded per address (and
  in all): a flood from one address is closed at once, a member still follows.
"""

from __future__ import annotations

import json
import select
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from gateway.ha import link
from persistence.replica import handshake
from persistence.replica import replication as r
from tests.support.ha_nodes import WAIT_S, Node, wait_ready, wait_role
from tests.support.helpers import RawClient
from tests.support.processes import HOST, free_port
from tests.support.zookeeper_helpers import ZooKeeperServer

QUEUE = "/queue/link-auth"
MARKER = b"journal-secret-payload"


def old_hello(node_id: str) -> bytes:
    """A backup's Hello as the first bytes: what a client without the secret sends."""
    return r.ReplicationConnection(r.Role.BACKUP).send(r.Hello(node_id, 0, 0, ()))


def read_until_closed(sock: socket.socket, timeout: float = 15.0) -> tuple[bytes, bool]:
    """Everything the peer sends until it closes (True) or ``timeout`` passes (False)."""
    data = bytearray()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except OSError:
            return bytes(data), True
        if not chunk:
            return bytes(data), True
        data += chunk
    return bytes(data), False


def send_receipted(client: RawClient, name: str, body: bytes) -> None:
    client.send_frame("SEND", {"destination": QUEUE, "persistent": "true", "receipt": name}, body)


def log_lines(node: Node, event: str) -> list[str]:
    return [line for line in node.log_path.read_text(errors="replace").splitlines() if event in line]


def wait_log(node: Node, event: str, count: int = 1, timeout: float = WAIT_S) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = log_lines(node, event)
        if len(lines) >= count:
            return lines
        time.sleep(0.1)
    raise AssertionError(f"{node.node_id} did not log {event} {count} time(s)\n" + node.log_tail())


def pair(tmp_path: Path, zookeeper: ZooKeeperServer) -> tuple[Node, Node, list[Node]]:
    """A primary and its only backup (sync_replicas = 1), the backup in sync."""
    nodes = [Node(tmp_path, name, zookeeper, replicas=2).start() for name in ("gw-0", "gw-1")]
    primary = wait_ready(nodes)
    backup = next(n for n in nodes if n is not primary)
    wait_role(backup, "backup_in_sync")
    return primary, backup, nodes


def test_a_rogue_backup_without_the_secret_gets_nothing_and_a_member_syncs(tmp_path: Path,
                                                                         zookeeper: ZooKeeperServer) -> None:
    primary, backup, nodes = pair(tmp_path, zookeeper)
    try:
        client = RawClient((HOST, primary.stomp_port), timeout=30)
        client.connect()
        for i in range(20):
            send_receipted(client, f"s{i}", MARKER + f"-{i}".encode())
        for i in range(20):
            client.receipt(f"s{i}", timeout=30)  # sync_replicas = 1: the real backup confirmed each
        followed = len(log_lines(backup, "replication_following"))

        # 1. The old protocol: Hello as a made-up backup, no handshake at all.
        with socket.create_connection((HOST, primary.replication_port), timeout=10) as rogue:
            rogue.sendall(old_hello("gw-rogue"))
            data, closed = read_until_closed(rogue)
        assert closed, "the rogue's connection stays open"
        assert MARKER not in data and len(data) <= handshake.MAX_BUFFERED, data[:200]

        # 2. The handshake with a guessed secret, posing as the real backup.
        with socket.create_connection((HOST, primary.replication_port), timeout=10) as rogue:
            shake = handshake.Handshake("backup", backup.node_id, b"a guessed secret, not the group's")
            rogue.sendall(shake.data_to_send())
            rogue.settimeout(10)
            shake.receive_data(rogue.recv(4096))  # the primary's challenge
            rogue.sendall(shake.data_to_send() + old_hello(backup.node_id))  # its proof, then Hello
            data, closed = read_until_closed(rogue)
        assert closed and MARKER not in data and data == b"", data[:200]

        refused = wait_log(primary, "replication_peer_refused", 2)
        assert len(refused) == 2 and all(f"{HOST}:" in line for line in refused), refused
        assert "not a replication peer" in refused[0] and "cluster secret" in refused[1], refused

        # The real backup was never displaced and still confirms.
        send_receipted(client, "after", MARKER + b"-after")
        client.receipt("after", timeout=30)
        assert len(log_lines(backup, "replication_following")) == followed
        assert backup.role() == "backup_in_sync"
        client.close()
    finally:
        for node in nodes:
            node.kill()


class Phantom(threading.Thread):
    """A made-up backup that acknowledges every batch it is sent (and stores
    nothing), reconnecting whenever it is closed."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.stopping = threading.Event()
        self.attempts = 0
        self.acks = 0

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.once()
            except (OSError, r.ProtocolError):
                pass
            self.stopping.wait(0.2)

    def once(self) -> None:
        with socket.create_connection((HOST, self.port), timeout=2) as sock:
            self.attempts += 1
            conn = r.ReplicationConnection(r.Role.BACKUP)
            sock.sendall(conn.send(r.Hello("gw-phantom", 0, 0, ())))
            epoch = 0
            while not self.stopping.is_set():
                try:
                    data = sock.recv(65536)
                except TimeoutError:
                    continue
                conn.receive_data(data)
                for frame in conn.events():
                    if isinstance(frame, r.Hello):
                        epoch = frame.epoch
                    elif isinstance(frame, r.Batch):
                        sock.sendall(conn.send(r.Ack(epoch, frame.last_lsn)))
                        self.acks += 1
                    elif isinstance(frame, r.SnapshotEnd):
                        sock.sendall(conn.send(r.Ack(epoch, frame.lsn)))
                        self.acks += 1
                    elif isinstance(frame, r.Ping):
                        sock.sendall(conn.send(r.Pong(frame.token)))
                if not data:
                    return


def test_a_phantom_backup_never_counts_toward_sync_replicas(tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    primary, backup, nodes = pair(tmp_path, zookeeper)
    phantom = Phantom(primary.replication_port)
    assert backup.proc is not None
    try:
        client = RawClient((HOST, primary.stomp_port), timeout=30)
        client.connect()
        send_receipted(client, "before", b"before")
        client.receipt("before", timeout=30)
        backup.proc.send_signal(signal.SIGSTOP)
        phantom.start()
        send_receipted(client, "frozen", MARKER)
        # A bounded wait: the phantom keeps trying all along, and would ack this
        # batch within milliseconds if it were let in.
        seen = client.quiet_for(5.0)
        assert phantom.attempts >= 1
        assert [f for f in seen if f.command == "RECEIPT"] == [], seen
        assert phantom.acks == 0
        backup.proc.send_signal(signal.SIGCONT)
        # The real backup, thawed, reconnects and confirms it.
        client.receipt("frozen", timeout=WAIT_S)
        client.close()
    finally:
        phantom.stopping.set()
        if backup.proc is not None and backup.alive():
            backup.proc.send_signal(signal.SIGCONT)
        for node in nodes:
            node.kill()


class Impostor(threading.Thread):
    """A fake primary on loopback: it speaks the handshake under a secret of
    its own (or skips it for a peer that has none), then says Hello from a
    newer epoch and sends an empty snapshot, which would wipe the backup."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.listener = socket.create_server((HOST, 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.got_hello = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        self.listener.settimeout(0.2)
        while not self.stopping.is_set():
            try:
                sock, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            try:
                with sock:
                    sock.settimeout(5)
                    self.serve(sock)
            except (OSError, r.ProtocolError, handshake.AuthenticationError):
                pass

    def serve(self, sock: socket.socket) -> None:
        first = sock.recv(4096)
        if first[2:6] == handshake.MAGIC:  # a backup that authenticates: answer as well as an outsider can
            shake = handshake.Handshake("primary", "gw-9", b"the impostor's own secret")
            sock.sendall(shake.data_to_send())
            shake.receive_data(first)
            proof_of_backup = sock.recv(4096)
            nonce = shake.nonce
            peer = shake.peer_nonce
            assert peer is not None
            forged = handshake.proof(b"the impostor's own secret", "primary", peer, nonce, shake.peer_id or "", "gw-9")
            sock.sendall(bytes([1 + len(forged), handshake.PROOF]) + forged)
            del proof_of_backup
            first = sock.recv(4096)
        conn = r.ReplicationConnection(r.Role.PRIMARY)
        conn.receive_data(first)
        hello = next(conn.events(), None)
        if not isinstance(hello, r.Hello):
            return
        self.got_hello += 1
        history = ((5, 1),)
        sock.sendall(conn.send(r.Hello("gw-9", 5, 0, history)) + conn.send(r.SnapshotBegin(5, 0, history, ()))
                     + conn.send(r.SnapshotEnd(0)))
        read_until_closed(sock, 5)


def store_bytes(data_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(data_dir)): p.read_bytes() for p in sorted(data_dir.rglob("*")) if p.is_file()}


def test_a_backup_refuses_an_impostor_primary_and_keeps_its_store(tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    node = Node(tmp_path, "gw-0", zookeeper, replicas=1, sync_replicas=0)
    impostor = Impostor()
    zk = KazooClient(hosts=zookeeper.hosts)
    try:
        node.start()
        assert wait_ready([node]) is node
        client = RawClient((HOST, node.stomp_port), timeout=30)
        client.connect()
        for i in range(20):
            send_receipted(client, f"s{i}", MARKER + f"-{i}".encode())
        for i in range(20):
            client.receipt(f"s{i}", timeout=30)
        client.close()
        assert node.proc is not None
        node.proc.send_signal(signal.SIGTERM)
        node.proc.wait(30)
        before = store_bytes(node.data_dir)
        assert any(MARKER in data for data in before.values())

        # The attacker's lock: /primary names its own address, a newer epoch.
        impostor.start()
        zk.start(timeout=30)
        zk.create("/gateway/primary", json.dumps({"node_id": "gw-9", "epoch": 5,
                                                  "advertise": f"{HOST}:{impostor.port}"}).encode(), ephemeral=True)
        node.start()
        refused = wait_log(node, "replication_primary_refused", 2)
        assert f"{HOST}:{impostor.port}" in refused[0] and "cluster secret" in refused[0], refused
        assert impostor.connections >= 2 and impostor.got_hello == 0
        assert node.alive()
        node.proc.send_signal(signal.SIGTERM)
        node.proc.wait(30)
        assert store_bytes(node.data_dir) == before
    finally:
        impostor.stopping.set()
        impostor.listener.close()
        zk.stop()
        zk.close()
        node.kill()


def test_without_a_secret_the_replication_listener_binds_loopback_and_says_so_once(
        tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    port = free_port()
    node = Node(tmp_path, "gw-0", zookeeper, replicas=1, sync_replicas=0, secret=None)
    # Configured on every interface; without a secret only loopback is bound.
    node.config.write_text(node.config.read_text().replace(f'replication_listen = "{HOST}:{node.replication_port}"',
                                                           f'replication_listen = "0.0.0.0:{port}"'))
    node.replication_port = port
    try:
        node.start()
        assert wait_ready([node]) is node
        assert listening_addresses(port) == ["127.0.0.1"]
        lines = log_lines(node, "replication_link_loopback_only")
        assert len(lines) == 1 and "cluster_secret_file" in lines[0], node.log_tail()
    finally:
        node.kill()


def listening_addresses(port: int) -> list[str]:
    """The IPv4 addresses a socket listens on at ``port`` (/proc/net/tcp)."""
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            found.append(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


def test_link_tls_encrypts_the_link_and_requires_a_certificate_of_the_ca_both_ways(
        tmp_path: Path, zookeeper: ZooKeeperServer, ca: Any) -> None:
    import ssl

    import trustme

    pem = tmp_path / "node.pem"  # key and chain in one file, for both ends of the link
    ca_file = tmp_path / "ca.pem"
    ca.issue_cert(HOST, "localhost").private_key_and_cert_chain_pem.write_to_path(pem)
    ca.cert_pem.write_to_path(ca_file)
    nodes = []
    for name in ("gw-0", "gw-1"):
        node = Node(tmp_path, name, zookeeper, replicas=2, extra_ha="link_tls = true")
        text = node.config.read_text().replace(
            "shutdown_grace_s = 1.0\n", f"shutdown_grace_s = 1.0\nstomp_tls_port = {free_port()}\n"
                                        f"mqtt_tls_port = {free_port()}\nadmin_tls_port = {free_port()}\n")
        node.config.write_text(text + f'\n[tls]\ncert = "{pem}"\nkey = "{pem}"\nca = "{ca_file}"\n')
        nodes.append(node.start())
    try:
        primary = wait_ready(nodes)
        backup = next(n for n in nodes if n is not primary)
        wait_role(backup, "backup_in_sync")
        client = RawClient((HOST, primary.stomp_port), timeout=30)
        client.connect()
        send_receipted(client, "over-tls", MARKER)
        client.receipt("over-tls", timeout=30)  # confirmed by the backup, over the TLS link
        client.close()

        # Plain TCP: no TLS, no handshake, nothing of the journal.
        with socket.create_connection((HOST, primary.replication_port), timeout=10) as rogue:
            rogue.sendall(old_hello("gw-rogue"))
            data, closed = read_until_closed(rogue)
        assert closed and MARKER not in data and handshake.MAGIC not in data
        # TLS that trusts the group's CA but shows no certificate, then one of another CA.
        stranger = trustme.CA().issue_cert("rogue.example")
        for present in (None, stranger):
            context = ssl.create_default_context(cafile=str(ca_file))
            if present is not None:
                present.configure_cert(context)
            with socket.create_connection((HOST, primary.replication_port), timeout=10) as raw:
                try:
                    with context.wrap_socket(raw, server_hostname=HOST) as tls:
                        tls.sendall(handshake.Handshake("backup", "gw-rogue", b"guessed secret 0123456").data_to_send())
                        data, closed = read_until_closed(tls)
                except (ssl.SSLError, OSError):
                    data, closed = b"", True
            assert closed and MARKER not in data
        refused = wait_log(primary, "replication_peer_refused", 3)
        assert all("TLS handshake failed" in line for line in refused[:3]), refused
    finally:
        for node in nodes:
            node.kill()


# -- in one Trio process: a Replicator and Backups (gateway/ha/replicator.py, backup.py) on 127.0.0.1 --


async def test_a_member_cannot_speak_for_another_nor_displace_it_and_a_wrong_secret_never_syncs(
        tmp_path: Path) -> None:
    import trio

    from gateway.ha.link import Link
    from tests.support.replication_helpers import everything
    from tests.support.replicator_helpers import BackupNode, PrimaryNode, wait_for

    secret = b"in-process group secret 0123456789"
    node = PrimaryNode(tmp_path / "p", secret=secret)
    async with trio.open_nursery() as nursery:
        await node.start(nursery)
        everything(node.store, n=5, tag="a")
        await node.commit()
        b1 = BackupNode(tmp_path / "b1", "b1", node.port, secret=secret).start(nursery)
        await node.confirmed()
        peer = node.replicator.peers["b1"]
        assert peer.in_sync

        # A member (it holds the secret) that proves itself as b2 and then says Hello as b1.
        stream = await trio.open_tcp_stream("127.0.0.1", node.port)
        link = Link(stream, r.Role.BACKUP)
        assert await link.authenticate("backup", "b2", secret) == "p"
        await link.send(r.Hello("b1", 0, 0, ()))
        with trio.fail_after(10):
            assert await link.receive(10) is None  # closed, answered nothing
        await stream.aclose()
        refused = node.log.named("replication_peer_refused")
        assert len(refused) == 1 and "authenticated as 'b2'" in refused[0]["reason"]
        assert node.replicator.peers["b1"] is peer and peer.in_sync  # b1's link untouched

        # A backup with the wrong secret: refused each time, nothing installed, never in sync.
        wrong = BackupNode(tmp_path / "b3", "b3", node.port, secret=b"not the group's secret 0000",
                           connect_attempts=3, backoff_s=0.01).start(nursery)
        with trio.fail_after(30):
            await wrong.done.wait()
        assert "b3" not in node.replicator.peers and wrong.follower.last_lsn == 0 and wrong.backup.snapshots == 0
        assert len(wrong.log.named("replication_primary_refused")) == 3 and wrong.refusals == []
        assert len(node.log.named("replication_peer_refused")) == 4

        # b1 again after a crash, the same node id: it proved membership, so
        # it replaces its own stale link.
        await b1.kill()
        everything(node.store, n=5, tag="b")
        await node.commit()
        b1 = BackupNode(tmp_path / "b1", "b1", node.port, secret=secret).start(nursery)
        await wait_for(lambda: node.replicator.in_sync() == ["b1"] and node.replicator.peers["b1"] is not peer,
                       "b1 in sync again")
        await node.confirmed()
        await b1.stop()
        wrong.follower.close()
        nursery.cancel_scope.cancel()
    node.store.close()


def test_a_flood_of_connections_that_never_authenticate_is_bounded_per_address_and_a_member_still_follows(
        tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    primary, backup, nodes = pair(tmp_path, zookeeper)
    flood: list[socket.socket] = []
    try:
        # A stranger on another loopback address opens many links and never
        # says a word: each would hold a task and a socket for the handshake's
        # whole time bound.  All but the per-address share are closed at once.
        started = time.monotonic()
        for _ in range(100):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.2", 0))
            sock.connect((HOST, primary.replication_port))
            sock.setblocking(False)
            flood.append(sock)
        closed: set[socket.socket] = set()
        # Before the handshake's bound (5 s) could have closed any of them.
        deadline = started + link.HANDSHAKE_TIMEOUT_S - 1.5
        while len(closed) < 100 - link.HANDSHAKES_PER_ADDRESS and time.monotonic() < deadline:
            readable, _, _ = select.select([s for s in flood if s not in closed], [], [], 0.1)
            for sock in readable:
                try:
                    if sock.recv(4096) == b"":
                        closed.add(sock)
                except OSError:
                    closed.add(sock)
        assert len(closed) == 100 - link.HANDSHAKES_PER_ADDRESS
        refused = wait_log(primary, "still authenticating")
        assert len(refused) == 1 and "127.0.0.2:" in refused[0], refused  # said once for the flood

        # A member, from its own address, still follows and confirms.
        backup.kill()
        backup.start()
        wait_role(backup, "backup_in_sync")
        client = RawClient((HOST, primary.stomp_port), timeout=30)
        client.connect()
        send_receipted(client, "member", b"after the flood")
        client.receipt("member", timeout=30)
        client.close()
    finally:
        for sock in flood:
            sock.close()
        for node in nodes:
            node.kill()
